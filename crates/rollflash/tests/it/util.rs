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
