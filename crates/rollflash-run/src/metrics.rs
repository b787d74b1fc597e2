//! Per-step metrics: the JSON record of one step, and
//! `metrics.jsonl`, appended and flushed as each step is published so a killed run keeps
//! everything up to its last step.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use rollflash_core::IoError;
use rollflash_trainer::StepRecord;

/// One step as a JSON object. `elapsed_offset_s` is the wall time of earlier processes of
/// the same run (a resumed run continues the time axis).
///
/// Fields: `step`, `version` (trained from), `samples`, `tokens`, `reward` (mean),
/// `accuracy` (fraction at or above the task's success threshold), `loss` and the learner's
/// named metrics (`approx_kl`, `clip_frac`, …), `entropy` (the learner's when its entropy
/// bonus is on, else the sampled estimate −mean log π_behav), `staleness` (mean),
/// `staleness_max`, `staleness_hist` (`{"0": n, "1": m}`), `samples_per_s` and
/// `tokens_per_s` (over this step's wall time), `rollout_idle` and `trainer_idle` (fractions
/// of the step's wall time), `weight_sync_ms` (and, with several backends,
/// `weight_sync_ms_by_backend`: each one's update, `null` where it failed), `behav_kl` and
/// `behav_kl_by_backend` (each backend's tokens' train–inference mismatch, by name), `wall_s`, `train_s`, `wait_s`, `elapsed_s`,
/// `generate_s` and `env_s` (the batch's trajectories' time in generation and in
/// environment steps — rewards included — summed over samples, so concurrent samples add up),
/// and the cumulative sample accounting (`started`, `trained`, `filtered`, `dropped_stale`,
/// `aborted`, `failed`, `running`, `buffered`).
/// The run's sink adds `response_len_mean` and `response_len_max` (model tokens of the
/// step's batch) from the batch it saw.
pub fn step_json(s: &StepRecord, elapsed_offset_s: f64) -> Value {
    let wall = s.wall.as_secs_f64().max(1e-9);
    let hist: serde_json::Map<String, Value> = s
        .staleness_hist
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let a = s.accounting;
    let mut m = json!({
        "step": s.step,
        "version": s.version.0,
        "samples": s.samples,
        "tokens": s.tokens,
        "reward": s.mean_reward,
        "accuracy": s.accuracy,
        "loss": s.stats.loss,
        "entropy": s.sampled_entropy,
        "staleness": s.staleness,
        "staleness_max": s.staleness_max,
        "staleness_hist": hist,
        "samples_per_s": s.samples as f64 / wall,
        "tokens_per_s": s.tokens as f64 / wall,
        "rollout_idle": (s.rollout_idle.as_secs_f64() / wall).min(1.0),
        "trainer_idle": (1.0 - s.train.as_secs_f64() / wall).clamp(0.0, 1.0),
        "weight_sync_ms": s.sync.total().as_secs_f64() * 1e3,
        "wall_s": s.wall.as_secs_f64(),
        "train_s": s.train.as_secs_f64(),
        "wait_s": s.wait.as_secs_f64(),
        "elapsed_s": elapsed_offset_s + s.elapsed.as_secs_f64(),
        "generate_s": s.turn_generate.as_secs_f64(),
        "env_s": s.turn_env.as_secs_f64(),
        "started": a.started,
        "trained": a.trained,
        "filtered": a.filtered,
        "dropped_stale": a.dropped_stale,
        "aborted": a.aborted,
        "failed": a.failed,
        "running": a.running,
        "buffered": a.buffered,
    });
    if s.sync.backends.len() > 1 || s.sync.backends.iter().any(|b| !b.loaded) {
        // Per backend when there is more than one to tell apart (or one failed): its own
        // update's milliseconds, `null` for one that did not load the weights.
        let by: serde_json::Map<String, Value> = s
            .sync
            .backends
            .iter()
            .map(|b| {
                let ms = b.loaded.then_some(b.took.as_secs_f64() * 1e3);
                (b.name.clone(), json!(ms))
            })
            .collect();
        m["weight_sync_ms_by_backend"] = Value::Object(by);
    }
    for (k, v) in &s.stats.metrics {
        m[k] = json!(v);
    }
    if !s.stats.behav_kl_by_backend.is_empty() {
        // Each backend's own train–inference mismatch: a server whose numerics (or weights)
        // differ from the trainer's stands out here before it moves the mean.
        let by: serde_json::Map<String, Value> = s
            .stats
            .behav_kl_by_backend
            .iter()
            .map(|(name, kl)| (name.clone(), json!(kl)))
            .collect();
        m["behav_kl_by_backend"] = Value::Object(by);
    }
    m
}

/// `metrics.jsonl`, open for appending.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
}

impl MetricsLog {
    /// Creates (truncates) `path`, then writes `prefix` (the records of a checkpoint being
    /// resumed) so the file always holds exactly the run's steps.
    pub fn create(path: &Path, prefix: &[Value]) -> Result<Self, IoError> {
        let err = IoError::at("cannot write metrics", path);
        let file = std::fs::File::create(path).map_err(err)?;
        let mut log = MetricsLog {
            path: path.to_path_buf(),
            file,
        };
        for v in prefix {
            log.append(v)?;
        }
        Ok(log)
    }

    /// Appends one record and flushes it to the OS.
    pub fn append(&mut self, v: &Value) -> Result<(), IoError> {
        writeln!(self.file, "{v}")
            .and_then(|()| self.file.flush())
            .map_err(IoError::at("cannot write metrics", &self.path))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads `metrics.jsonl` (one JSON object a line; a torn last line of a killed run is
/// skipped).
pub fn read(path: &Path) -> Result<Vec<Value>, IoError> {
    let err = |source| IoError::new("cannot read metrics", path, source);
    let f = std::fs::File::open(path).map_err(err)?;
    let mut out = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(err)?;
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            out.push(v);
        }
    }
    Ok(out)
}

/// How many lines `path` holds (a last line cut short counts); 0 if it cannot be read.
pub fn count_lines(path: &Path) -> usize {
    std::fs::read(path).map_or(0, |b| {
        let full = b.iter().filter(|&&c| c == b'\n').count();
        full + usize::from(b.last().is_some_and(|&c| c != b'\n'))
    })
}
