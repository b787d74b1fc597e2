//! A verl user's files as they are, through `rollflash train`: the shipped
//! `configs/verl_arith.toml` reads a Parquet that pyarrow wrote in verl's GSM8K layout
//! (`reward_model.ground_truth`, `extra_info.question`, `extra_info.index`) and scores with a
//! verl-style `compute_score` in Python. On the built-in model after its supervised warm-up
//! (which computes the sums but rarely writes verl's `#### <answer>` line) the Python reward
//! rises and the held-out greedy accuracy with it. The scorer here wraps the shipped one the
//! way users extend theirs: it returns verl's dict (an extra key becomes a per-step metric)
//! and raises on one row in 16, which costs those samples a counted `reward_failed` with
//! the error's text in the trajectory log, never the run. Skipped, saying why, without
//! `python3`.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::tiny_run::assert_balanced;
use crate::util::warmed_up_model;

/// The shipped scorer, extended: a dict with `answered` beside `score`, and a raise on every
/// row whose index is 5 mod 16.
const SCORER: &str = r#####"
import sys
sys.path.insert(0, REWARDS)
from gsm8k_verl import compute_score as strict


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "rollflash/arith", data_source
    if extra_info["index"] % 16 == 5:
        raise ValueError(f"row {extra_info['index']} is poisoned")
    return {"score": strict(data_source, solution_str, ground_truth, extra_info),
            "answered": float("####" in solution_str)}
"#####;

fn python3_missing() -> bool {
    !Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn mean(rows: &[Value], key: &str) -> f64 {
    rows.iter().map(|r| r[key].as_f64().unwrap()).sum::<f64>() / rows.len() as f64
}

#[test]
fn a_verl_parquet_and_a_verl_reward_train_as_they_are() {
    if python3_missing() {
        eprintln!("SKIPPED a_verl_parquet_and_a_verl_reward_train_as_they_are: no python3 on PATH");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let scorer = dir.path().join("scorer.py");
    let rewards = root.join("configs/rewards").canonicalize().unwrap();
    std::fs::write(
        &scorer,
        SCORER.replace("REWARDS", &format!("{:?}", rewards.display().to_string())),
    )
    .unwrap();
    let model = warmed_up_model();
    let run = dir.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .current_dir(&root)
        .args(["train", "--config", "configs/verl_arith.toml"])
        .arg("--set")
        .arg(format!("model.path={:?}", model.display().to_string()))
        .arg("--set")
        .arg(format!("output_dir={:?}", run.display().to_string()))
        .arg("--set")
        .arg(format!(
            "env.reward={{python={{path={:?}, function=\"compute_score\", style=\"verl\"}}}}",
            scorer.display().to_string()
        ))
        .args(["--set", "dashboard.trajectories_per_step=64"])
        .args(["--set", "metrics.progress=false"])
        .args(["--set", "metrics.report=false"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout {stdout}\nstderr {stderr}");

    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let rows: Vec<Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 20, "{metrics}");
    for (i, r) in rows.iter().enumerate() {
        assert_balanced(r, &format!("step {}", i + 1));
    }
    // The Python reward rises: the first three steps against the last three.
    let (first, last) = (mean(&rows[..3], "reward"), mean(&rows[17..], "reward"));
    eprintln!("verl reward: first three steps {first:.3}, last three {last:.3}");
    assert!(
        last > first + 0.2,
        "the reward did not rise: {first} -> {last}"
    );
    // verl's dict: `answered` is a per-step metric; the raises are counted, not fatal.
    let sum = |k: &str| rows.iter().filter_map(|r| r[k].as_f64()).sum::<f64>();
    assert!(
        rows.iter().all(|r| r["reward/answered"].is_number()),
        "{}",
        rows[0]
    );
    let failed = sum("python/reward_failed");
    let ok = sum("python/ok");
    let trained = rows[19]["trained"].as_f64().unwrap();
    eprintln!("python verdicts: {ok} ok, {failed} reward_failed of {trained} trained");
    assert!(failed > 0.0, "no poisoned row was drawn in 20 steps");
    assert_eq!(ok + failed, trained, "every trained sample has one verdict");
    // The error's text reaches the trajectory log the dashboard shows.
    let saved = std::fs::read_to_string(run.join("trajectories.jsonl")).unwrap();
    let noted = saved
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|t| {
            t["notes"].as_array().is_some_and(|n| {
                n.iter().any(|kv| {
                    kv[0] == "reward_error"
                        && kv[1].as_str().is_some_and(|e| e.contains("is poisoned"))
                })
            })
        })
        .count();
    assert!(noted > 0, "no trajectory carries the reward's error");
    // Held-out greedy accuracy under the same Python reward rises with it.
    // "greedy eval on 32 held-out tasks: success 0.000 before RL → 0.656 after (…)"
    let line = stdout
        .lines()
        .find(|l| l.contains("greedy eval on 32 held-out tasks"))
        .unwrap_or_else(|| panic!("no evaluation line: {stdout}"));
    eprintln!("{line}");
    let number_after = |mark: &str| -> f64 {
        let at = line.find(mark).unwrap() + mark.len();
        line[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (before, after) = (number_after("success "), number_after("RL → "));
    assert!(after > before + 0.2, "held-out greedy {before} -> {after}");
}
