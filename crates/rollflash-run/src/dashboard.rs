//! What a run gives its dashboard (`rollflash-dashboard`): the timeline and trajectory
//! files in its output directory, a live snapshot of the rollout plane, and the trajectory
//! sampler that turns each trained batch into `trajectories.jsonl` lines with the run's
//! tokenizer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use rollflash_core::buffer::Batch;
use rollflash_core::Trajectory;
use rollflash_dashboard::{FileError, LiveSource, TimelineLog, TrajectoryLog};
use rollflash_model::tokenizer::Tokenizer;
use rollflash_rollout::{ProxyHandle, Timeline};
use serde_json::{json, Value};

/// The proxy as the dashboard's live source: queue depth, running requests and rotation
/// per backend, generated tokens per second.
#[derive(Debug)]
pub struct ProxyLive(pub ProxyHandle);

#[async_trait]
impl LiveSource for ProxyLive {
    async fn snapshot(&self) -> Value {
        match self.0.metrics().await {
            Ok(m) => json!({
                "queue_depth": m.queue_depth,
                "backends": m.backends.iter().map(|(name, running, in_rotation)| json!({
                    "name": name, "running": running, "in_rotation": in_rotation,
                })).collect::<Vec<_>>(),
                "tokens_per_s": m.tokens_per_sec,
                "paused": m.paused.is_some(),
            }),
            Err(_) => Value::Null,
        }
    }
}

/// The run's `timeline.jsonl` as the drivers' [`Timeline`]; continued (not truncated)
/// when the run resumes.
pub fn timeline(dir: &Path, resumed: bool) -> Result<Timeline, FileError> {
    Ok(Timeline::new(Arc::new(TimelineLog::create(dir, resumed)?)))
}

/// `trajectories.jsonl`: `per_step` trajectories of every trained batch, until the file
/// reaches its size cap (`dashboard.trajectories_max_mb`); then saving stops, said once in
/// the log, and the file keeps the run's first steps (the dashboard reads it whole, and a
/// trimmed front would mean rewriting it while the page reads it).
#[derive(Debug)]
pub struct TrajectorySampler {
    log: TrajectoryLog,
    path: PathBuf,
    per_step: usize,
    tokenizer: Arc<Tokenizer>,
    /// The cap in bytes; `None`: no cap.
    max_bytes: Option<u64>,
    /// Set once the cap is reached.
    full: bool,
}

impl TrajectorySampler {
    /// Creates (or, resuming, continues) `dir/trajectories.jsonl`, capped at `max_bytes`.
    pub fn create(
        dir: &Path,
        resumed: bool,
        per_step: usize,
        max_bytes: Option<u64>,
        tokenizer: Arc<Tokenizer>,
    ) -> Result<Self, FileError> {
        Ok(TrajectorySampler {
            log: TrajectoryLog::create(dir, resumed)?,
            path: dir.join(rollflash_dashboard::files::TRAJECTORIES_FILE),
            per_step,
            tokenizer,
            max_bytes,
            full: false,
        })
    }

    /// Saves the sample of step `step`'s batch, unless the file is full.
    pub fn save(&mut self, step: usize, batch: &Batch<Trajectory>) -> Result<(), FileError> {
        if self.per_step == 0 || self.full {
            return Ok(());
        }
        if let Some(max) = self.max_bytes {
            // One stat per step: the file's own size, which a resumed run's earlier
            // records count toward too.
            let size = std::fs::metadata(&self.path).map_or(0, |m| m.len());
            if size >= max {
                self.full = true;
                tracing::warn!(
                    path = %self.path.display(),
                    mb = size as f64 / 1e6,
                    "trajectories not saved from step {step} on: the file reached \
                     dashboard.trajectories_max_mb"
                );
                return Ok(());
            }
        }
        let decode = |ids: &[u32]| self.tokenizer.decode(ids, false).ok();
        let records = rollflash_dashboard::sample_batch(step, batch, self.per_step, &decode);
        self.log.append(&records)
    }
}

/// Mean and longest response (model tokens) of a batch: the `response_len_mean` and
/// `response_len_max` of its step's metrics.
pub fn response_lengths(batch: &Batch<Trajectory>) -> (f64, usize) {
    let lens: Vec<usize> = batch
        .groups
        .iter()
        .flat_map(|g| &g.samples)
        .map(|(t, _)| t.response_tokens())
        .collect();
    let mean = lens.iter().sum::<usize>() as f64 / lens.len().max(1) as f64;
    (mean, lens.iter().copied().max().unwrap_or(0))
}
