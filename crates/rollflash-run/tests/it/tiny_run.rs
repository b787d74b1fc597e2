//! The tiny run both test binaries train, and the checks of what it leaves: a FrozenLake run
//! of seconds per step ([`tiny_lake_sets`]), its synchronous, exactly resumable form
//! ([`sync_sets`], [`cfg`]), its metrics, accounting, weights and checkpoints, and the
//! shipped FrozenLake config.
//!
//! One file, two homes in name only: `rollflash-run`'s tests declare it as a module, and the
//! `rollflash` binary's tests include this same file by path (`#[path]` in their `main.rs`),
//! since their process tests (kill -9, interrupts, fleets, the dashboard) start these runs
//! and check them the same way. These are test settings and assertions, not run concepts, so
//! they stay out of the library's API; and one test binary cannot import another, so a shared
//! source file is the one place both can use. It therefore names nothing of either binary
//! (no `crate::`), only the library crates both depend on.

use std::path::{Path, PathBuf};

use candle_core::Device;
use rollflash_run::config::TrainConfig;
use serde_json::Value;

/// The settings of a run that takes seconds per step: the built-in model (random weights)
/// on tiny FrozenLake episodes writing to `dir`, 2 groups × 4 samples per step, no
/// evaluation, no progress bar. Random text is sometimes a move, and unparsable turns cost
/// 0.1, so rewards vary within groups and the gradient is not zero.
pub fn tiny_lake_sets(dir: &Path) -> Vec<String> {
    [
        format!("output_dir={:?}", dir.display().to_string()),
        "env.name=frozen_lake".into(),
        "env.is_slippery=false".into(),
        "env.invalid_action_penalty=0.1".into(),
        "env.max_steps=5".into(),
        "rollout.max_new_tokens=6".into(),
        "rollout.max_turns=5".into(),
        "rollout.max_total_tokens=220".into(),
        "buffer.groups_per_batch=2".into(),
        "buffer.group_size=4".into(),
        "train.eval_problems=0".into(),
        "metrics.progress=false".into(),
    ]
    .into()
}

/// A run small enough for seconds ([`tiny_lake_sets`]), synchronous, no warm-up.
///
/// The loss is PPO (ratio against the proximal policy, which the learner recomputes) rather
/// than the default decoupled PPO: decoupled PPO also weighs each token by the engine's
/// behaviour log-prob, and those differ in the last bits with the continuous batch a request
/// happened to share (matrix products of different row counts round differently), which is
/// timing. With it, resumed weights agree to about 1e-6 instead of exactly.
pub fn cfg(dir: &Path, steps: usize, every: usize) -> TrainConfig {
    TrainConfig::load(None, &sync_sets(dir, steps, every)).unwrap()
}

/// [`cfg`]'s settings as `--set` strings, for runs of the binary.
pub fn sync_sets(dir: &Path, steps: usize, every: usize) -> Vec<String> {
    let mut sets = tiny_lake_sets(dir);
    sets.extend([
        "seed=3".into(),
        "warmup.steps=0".into(),
        "rollout.temperature=1.0".into(),
        "buffer.alpha=0".into(),
        "controller.sync=true".into(),
        format!("train.steps={steps}"),
        "train.lr=1e-3".into(),
        "train.lr_warmup_steps=2".into(),
        "train.loss.pg_variant=ppo".into(),
        format!("checkpoint.every={every}"),
        "checkpoint.keep=2".into(),
    ]);
    sets
}

/// The records of the run's `metrics.jsonl`.
pub fn metrics(dir: &Path) -> Vec<Value> {
    rollflash_run::metrics::read(&dir.join("metrics.jsonl")).unwrap()
}

/// Asserts the sample accounting of one `metrics.jsonl` record adds up: started = trained +
/// filtered + dropped-stale + aborted + failed + running + buffered.
pub fn assert_balanced(row: &Value, what: &str) {
    let n = |k: &str| {
        row[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: no {k} in {row}"))
    };
    let ended = [
        "trained",
        "filtered",
        "dropped_stale",
        "aborted",
        "failed",
        "running",
        "buffered",
    ];
    assert_eq!(
        n("started"),
        ended.iter().map(|k| n(k)).sum::<u64>(),
        "{what}: accounting unbalanced: {row}"
    );
}

/// The accounting of the last metrics line adds up, and every step appears once, in order.
pub fn check_metrics(dir: &Path, steps: usize) {
    let m = metrics(dir);
    let got: Vec<u64> = m.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(got, (0..steps as u64).collect::<Vec<_>>(), "metrics steps");
    let last: &Value = m.last().unwrap();
    assert_balanced(last, "last step");
}

/// Largest absolute difference between two checkpoints' tensors.
pub fn max_weight_diff(a: &Path, b: &Path) -> f64 {
    let wa = rollflash_model::hf::load_weights(a, &Device::Cpu).unwrap();
    let wb = rollflash_model::hf::load_weights(b, &Device::Cpu).unwrap();
    wa.max_abs_diff(&wb).unwrap()
}

/// The temporary directories (`.tmp…`) under `root`: checkpoints whose writing was cut short.
pub fn tmp_dirs(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with(".tmp"))
                .collect()
        })
        .unwrap_or_default()
}

/// The shipped agentic config, `configs/frozenlake.toml` (both crates sit two levels below
/// the workspace root).
pub fn frozenlake_toml() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs/frozenlake.toml")
}
