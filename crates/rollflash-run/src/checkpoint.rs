//! Training checkpoints: every `[checkpoint] every` steps, `output_dir/checkpoints/step-N/`
//! holds the weights in Hugging Face layout (`config.json`, `model.safetensors`, the
//! tokenizer), the AdamW state (`optimizer.safetensors`: first and second moments), and
//! `state.json` (the [`Cursor`]: steps done, policy version, next task seed; the sample
//! accounting; the optimizer's step count, i.e. the learning-rate schedule's position;
//! the evaluation before RL; for a dataset task, the data cursor: files, shuffle seed, epoch,
//! next row), plus `metrics.jsonl` up to that step. A checkpoint is written
//! to a temporary directory and renamed into place, so a crash never leaves a half-written
//! `step-N`; only the newest `keep` are kept.

use std::path::{Path, PathBuf};

use candle_core::Device;
use rollflash_core::buffer::Accounting;
use rollflash_env::envs::dataset::DataCursor;
use rollflash_model::config::ModelConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::{AdamW, OptimizerConfig};
use rollflash_model::weights::Weights;
use serde::{Deserialize, Serialize};

use crate::eval::EvalResult;
use rollflash_trainer::learner::PolicyLearner;
use rollflash_trainer::Cursor;

/// A checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {path}: {source}")]
    Model {
        path: PathBuf,
        #[source]
        source: rollflash_model::ModelError,
    },
    #[error("checkpoint {path}: state.json: {source}")]
    State {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("no checkpoint under {0} (write some with `--set checkpoint.every=K`)")]
    NoneFound(PathBuf),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
}

/// `state.json`: everything besides tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Bumped when the layout changes.
    pub format: u32,
    pub cursor: Cursor,
    pub accounting: Accounting,
    /// AdamW steps taken: the bias corrections and the learning-rate schedule continue
    /// from here.
    pub optimizer_step: usize,
    /// The run's seed (resuming under a different seed would not continue the same run).
    pub seed: u64,
    /// Wall time of the run up to this checkpoint, so resumed metrics continue its axis.
    pub elapsed_s: f64,
    /// The held-out evaluation after the warm-up, for the final report.
    pub eval_before: Option<EvalResult>,
    /// Where a dataset task is in its data (files, shuffle seed, epoch, next row); absent for
    /// generated tasks and in checkpoints written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataCursor>,
}

impl CheckpointState {
    /// This state with the dataset's cursor.
    pub fn with_data(mut self, data: Option<DataCursor>) -> Self {
        self.data = data;
        self
    }
}

const FORMAT: u32 = 1;
const STATE: &str = "state.json";
const OPTIMIZER: &str = "optimizer.safetensors";
const METRICS: &str = "metrics.jsonl";

/// The directory of step `n` under `root`. Zero-padded so names sort by step.
pub fn step_dir(root: &Path, n: usize) -> PathBuf {
    root.join(format!("step-{n:08}"))
}

/// Where a run keeps its checkpoints.
pub fn root(output_dir: &Path) -> PathBuf {
    output_dir.join("checkpoints")
}

/// The newest complete checkpoint under `root`.
pub fn latest(root: &Path) -> Result<PathBuf, CheckpointError> {
    list(root)?
        .pop()
        .map(|(_, p)| p)
        .ok_or_else(|| CheckpointError::NoneFound(root.to_path_buf()))
}

/// Complete checkpoints under `root`, oldest first.
fn list(root: &Path) -> Result<Vec<(usize, PathBuf)>, CheckpointError> {
    let rd = match std::fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CheckpointError::Io {
                what: "cannot list checkpoints in",
                path: root.to_path_buf(),
                source,
            })
        }
    };
    let mut out: Vec<(usize, PathBuf)> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let n = name.strip_prefix("step-")?.parse().ok()?;
            // `state.json` is the last file written before the rename; its presence marks
            // a complete checkpoint.
            e.path().join(STATE).exists().then(|| (n, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Writes checkpoints of one run.
#[derive(Debug)]
pub struct Checkpointer {
    root: PathBuf,
    keep: usize,
    model_cfg: ModelConfig,
    tokenizer: std::sync::Arc<Tokenizer>,
}

impl Checkpointer {
    /// Checkpoints under `root`, keeping the newest `keep`.
    pub fn new(
        root: PathBuf,
        keep: usize,
        model_cfg: ModelConfig,
        tokenizer: std::sync::Arc<Tokenizer>,
    ) -> Self {
        Checkpointer {
            root,
            keep: keep.max(1),
            model_cfg,
            tokenizer,
        }
    }

    /// Writes the checkpoint of `state.cursor.steps_done` atomically (temporary directory,
    /// then rename), copies `metrics` into it, and prunes old ones. Returns its path.
    pub fn save(
        &self,
        learner: &PolicyLearner,
        state: &CheckpointState,
        metrics: &Path,
    ) -> Result<PathBuf, CheckpointError> {
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Io { what, path, source }
        };
        let n = state.cursor.steps_done;
        let dir = step_dir(&self.root, n);
        let tmp = self.root.join(format!(".tmp-step-{n:08}"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io("cannot clear", &tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(io("cannot create", &tmp))?;
        let model = |source| CheckpointError::Model {
            path: tmp.clone(),
            source,
        };
        rollflash_model::hf::save_dir(
            &tmp,
            &self.model_cfg,
            &learner.model().weights(),
            Some(&self.tokenizer),
        )
        .map_err(model)?;
        let (_, moments) = learner.optimizer().state();
        moments
            .save_safetensors(&tmp.join(OPTIMIZER))
            .map_err(model)?;
        std::fs::copy(metrics, tmp.join(METRICS)).map_err(io("cannot copy", metrics))?;
        let text =
            serde_json::to_string_pretty(state).map_err(|source| CheckpointError::State {
                path: tmp.clone(),
                source,
            })?;
        std::fs::write(tmp.join(STATE), text).map_err(io("cannot write", &tmp))?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io("cannot replace", &dir))?;
        }
        std::fs::rename(&tmp, &dir).map_err(io("cannot rename into", &dir))?;
        let all = list(&self.root)?;
        for (_, old) in all.iter().take(all.len().saturating_sub(self.keep)) {
            std::fs::remove_dir_all(old).map_err(io("cannot prune", old))?;
        }
        Ok(dir)
    }
}

/// A checkpoint read back.
#[derive(Debug)]
pub struct Loaded {
    pub dir: PathBuf,
    pub state: CheckpointState,
    pub model_cfg: ModelConfig,
    pub weights: Weights,
    /// Optimizer moments (see [`AdamW::state`]).
    pub moments: Weights,
    /// `metrics.jsonl` up to the checkpoint.
    pub metrics: Vec<serde_json::Value>,
}

impl Loaded {
    /// The optimizer continuing where the checkpoint stopped.
    pub fn optimizer(&self, cfg: OptimizerConfig) -> Result<AdamW, CheckpointError> {
        AdamW::from_state(cfg, self.state.optimizer_step, &self.moments).map_err(|source| {
            CheckpointError::Model {
                path: self.dir.join(OPTIMIZER),
                source,
            }
        })
    }
}

/// Reads the checkpoint in `dir`.
pub fn load(dir: &Path, device: &Device) -> Result<Loaded, CheckpointError> {
    let model = |source| CheckpointError::Model {
        path: dir.to_path_buf(),
        source,
    };
    let text = std::fs::read_to_string(dir.join(STATE)).map_err(|source| CheckpointError::Io {
        what: "cannot read",
        path: dir.join(STATE),
        source,
    })?;
    let state: CheckpointState =
        serde_json::from_str(&text).map_err(|source| CheckpointError::State {
            path: dir.to_path_buf(),
            source,
        })?;
    if state.format != FORMAT {
        return Err(CheckpointError::State {
            path: dir.to_path_buf(),
            source: serde::de::Error::custom(format!(
                "format {} (this build reads {FORMAT})",
                state.format
            )),
        });
    }
    let model_cfg = rollflash_model::hf::load_config(dir).map_err(model)?;
    let weights = rollflash_model::hf::load_weights(dir, device).map_err(model)?;
    let moments = Weights::load_safetensors(&[dir.join(OPTIMIZER)], device).map_err(model)?;
    let metrics = crate::metrics::read(&dir.join(METRICS))?;
    Ok(Loaded {
        dir: dir.to_path_buf(),
        state,
        model_cfg,
        weights,
        moments,
        metrics,
    })
}

/// A fresh [`CheckpointState`] (the format field filled in).
pub fn state(
    cursor: Cursor,
    accounting: Accounting,
    optimizer_step: usize,
    seed: u64,
    elapsed_s: f64,
    eval_before: Option<EvalResult>,
) -> CheckpointState {
    CheckpointState {
        format: FORMAT,
        cursor,
        accounting,
        optimizer_step,
        seed,
        elapsed_s,
        eval_before,
        data: None,
    }
}
