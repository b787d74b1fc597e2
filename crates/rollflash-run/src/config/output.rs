//! What a run leaves behind and shows: `[checkpoint]`, `[metrics]` and `[dashboard]`.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// When to write checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointSection {
    /// Write one every this many steps (0 = never; the final weights are saved unless
    /// `final = false`).
    pub every: usize,
    /// How many of the newest checkpoints to keep.
    pub keep: usize,
    /// What a checkpoint that cannot be written (a full disk) does to the run: `stop` (the
    /// default: the run stops with the error; what was written before is intact) or
    /// `continue` (the run goes on without that checkpoint and says so).
    pub on_error: OnCheckpointError,
    /// `final`: write the trained model to `output_dir/final/` when the run completes (the
    /// default). `false` skips that full copy of the model (500 MB and more for a real one)
    /// for runs that need only their metrics, such as benchmarks. A run that stops early
    /// still writes its resumable checkpoint.
    #[serde(rename = "final")]
    pub save_final: bool,
}

/// `checkpoint.on_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCheckpointError {
    #[default]
    Stop,
    Continue,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            every: 0,
            keep: 3,
            on_error: OnCheckpointError::Stop,
            save_final: true,
        }
    }
}

impl CheckpointSection {
    /// Checks ranges; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.every > 0 && self.keep == 0 {
            return Err(ConfigError::Field {
                field: "checkpoint.keep".into(),
                reason: "must be at least 1 when checkpoint.every > 0".into(),
            });
        }
        Ok(())
    }
}

/// Observability of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Serve Prometheus metrics at this address during the run (e.g. `127.0.0.1:9400`);
    /// absent means no endpoint. Loopback unless you mean to expose it.
    pub prometheus: Option<std::net::SocketAddr>,
    /// Show a progress bar (only ever when stdout is a terminal).
    pub progress: bool,
    /// Write `report/` (plots and `report.md`) at the end of the run.
    pub report: bool,
    /// Write TensorBoard event files under `output_dir/tensorboard/` (every numeric metric
    /// of each step, and the held-out evaluations), flushed per step.
    pub tensorboard: bool,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            prometheus: None,
            progress: true,
            report: true,
            tensorboard: false,
        }
    }
}

/// `[dashboard]`: the page that shows the run while it runs (`rollflash-dashboard`), and
/// the trajectories it shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DashboardSection {
    /// Serve the dashboard here during the run (`--dashboard` sets it); absent means none.
    /// An address beyond loopback needs an API key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<std::net::SocketAddr>,
    /// The dashboard's API key (prefer `api_key_env`; without either, `ROLLFLASH_API_KEY`
    /// when set, as for `rollflash serve`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The environment variable holding the API key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Trajectories of each trained batch saved to `trajectories.jsonl` (spread over the
    /// batch's rewards); 0 saves none.
    pub trajectories_per_step: usize,
    /// The size (MB, 10^6 bytes) at which `trajectories.jsonl` stops growing: later steps'
    /// trajectories are not saved (the log says from which step). 0: no cap.
    pub trajectories_max_mb: f64,
}

impl Default for DashboardSection {
    fn default() -> Self {
        DashboardSection {
            addr: None,
            api_key: None,
            api_key_env: None,
            trajectories_per_step: 4,
            trajectories_max_mb: 100.0,
        }
    }
}
