//! Helpers several test modules share.

/// The settings of a run that takes seconds per step: the built-in model (random weights)
/// on tiny FrozenLake episodes writing to `dir`, 2 groups × 4 samples per step, no
/// evaluation, no progress bar. Random text is sometimes a move, and unparsable turns cost
/// 0.1, so rewards vary within groups and the gradient is not zero.
pub fn tiny_lake_sets(dir: &std::path::Path) -> Vec<String> {
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

/// Asserts the sample accounting of one `metrics.jsonl` record adds up: started = trained +
/// filtered + dropped-stale + aborted + failed + running + buffered.
pub fn assert_balanced(row: &serde_json::Value, what: &str) {
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

/// The default run's warm-up (the built-in model after its 600 supervised steps), as the
/// Hugging Face directory the warm-up cache holds: made once per test process by a one-step
/// run, in a cache under cargo's per-target temporary folder (so a rerun of the tests finds
/// it, under the cache's own key), and shared by every test that needs a model that already
/// computes sums.
pub fn warmed_up_model() -> std::path::PathBuf {
    static MODEL: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    MODEL
        .get_or_init(|| {
            let root = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("warmed-up");
            let cache = root.join("warmup-cache");
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollflash"))
                .args(["train", "--set", "train.steps=1"])
                .args(["--set", "train.eval_problems=0"])
                .args(["--set", "metrics.progress=false"])
                .args(["--set", "metrics.report=false"])
                .arg("--set")
                .arg(format!(
                    "warmup.cache_dir={:?}",
                    cache.display().to_string()
                ))
                .arg("--set")
                .arg(format!(
                    "output_dir={:?}",
                    root.join("warmup-run").display().to_string()
                ))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "the warm-up run failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // The newest: a cache kept from an older build may hold another key's result.
            std::fs::read_dir(&cache)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter_map(|p| {
                    let m = std::fs::metadata(p.join("model.safetensors")).ok()?;
                    Some((m.modified().ok()?, p))
                })
                .max()
                .expect("a warm-up directory in the cache")
                .1
        })
        .clone()
}
