//! Reward verdicts per step: the counted `python/<verdict>` and `code/<verdict>` entries of a batch's environment metrics, and the mean of each `reward/<key>` (verl's extra keys), for the step's `metrics.jsonl` line.
//!
//! Environments put a verdict into the step's info as `<kind>/<verdict>` = 1 (numeric, so it
//! reaches the trajectory's `env_metrics`); summing them over the batch says how many samples
//! of the step the reward failed, timed out, passed, without the trainer knowing any reward
//! kind.

use std::collections::BTreeMap;

use rollflash_core::buffer::Batch;
use rollflash_core::Trajectory;

/// Prefixes summed per step: verdict counts.
const COUNTED: [&str; 2] = ["python/", "code/"];
/// Prefix averaged per step: the reward function's extra metrics.
const AVERAGED: &str = "reward/";

/// The batch's verdict counts and extra-metric means, by key (sorted).
pub fn batch_verdicts(batch: &Batch<Trajectory>) -> Vec<(String, f64)> {
    let mut sums: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for (t, _) in batch.groups.iter().flat_map(|g| &g.samples) {
        for (k, v) in &t.env_metrics {
            if COUNTED.iter().any(|p| k.starts_with(p)) || k.starts_with(AVERAGED) {
                let e = sums.entry(k.as_str()).or_insert((0.0, 0));
                e.0 += v;
                e.1 += 1;
            }
        }
    }
    sums.into_iter()
        .map(|(k, (sum, n))| {
            let v = if k.starts_with(AVERAGED) {
                sum / n.max(1) as f64
            } else {
                sum
            };
            (k.to_string(), v)
        })
        .collect()
}
