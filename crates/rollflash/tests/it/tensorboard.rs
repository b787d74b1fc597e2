//! TensorBoard event files read back by the real `tensorboard` package: a short `rollflash
//! train` with `metrics.tensorboard=true` (the built-in model on tiny FrozenLake episodes, 3
//! steps with a checkpoint at 2), then a resume from that checkpoint to 4 steps.
//! `scripts/read_tensorboard.py` reads the folder with TensorBoard's `EventAccumulator` (in
//! `.venv-tb`, installed by `scripts/setup_tensorboard.sh`), without purging orphaned data so
//! a step written twice would show; every numeric metric of `metrics.jsonl` must be there at
//! its step, equal within f32 rounding, once, with monotone wall times, and the held-out
//! evaluations at steps 0 and 4. Skipped, saying so, when the package cannot be installed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// `.venv-tb`'s Python from the project's script, or why there is none.
fn tensorboard_python() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root.join("scripts/setup_tensorboard.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if out.status.success() {
        Ok(root.join(".venv-tb/bin/python"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// One `rollflash train` to completion with `sets` and `extra` arguments.
fn train(dir: &Path, sets: &[String], extra: &[&str], what: &str) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollflash"));
    cmd.arg("train");
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.args(extra).stdin(Stdio::null()).output().unwrap();
    std::fs::write(dir.join(format!("{what}-stdout.txt")), &out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{what} failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The numeric fields of a `metrics.jsonl` record as TensorBoard tags (nested maps as
/// `map/key`), without `step` (the x axis).
fn expected_scalars(row: &Value) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for (k, v) in row.as_object().unwrap() {
        if k == "step" {
            continue;
        }
        if let Some(x) = v.as_f64() {
            out.push((k.clone(), x));
        } else if let Some(m) = v.as_object() {
            out.extend(
                m.iter()
                    .filter_map(|(k2, v2)| Some((format!("{k}/{k2}"), v2.as_f64()?))),
            );
        }
    }
    out
}

/// Equal as TensorBoard stores it: `simple_value` is an f32.
fn same_f32(tb: f64, want: f64) -> bool {
    (tb - want).abs() <= want.abs() * f64::from(f32::EPSILON) + f64::from(f32::MIN_POSITIVE)
}

#[test]
fn tensorboard_reads_every_metric_at_its_step_once_across_a_resume() {
    let python = match tensorboard_python() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipping the TensorBoard read-back: tensorboard is not available ({why})");
            return;
        }
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tensorboard-run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut sets = crate::tiny_run::tiny_lake_sets(&dir);
    sets.extend([
        "warmup.steps=0".into(),
        "metrics.report=false".into(),
        "metrics.tensorboard=true".into(),
        "train.eval_problems=2".into(),
        "train.eval_samples=0".into(),
        "checkpoint.every=2".into(),
    ]);
    let with_steps = |n: usize| {
        let mut s = sets.clone();
        s.push(format!("train.steps={n}"));
        s
    };
    train(&dir, &with_steps(3), &[], "first");
    // Step 2 and the evaluation after it are dropped; the resumed run trains 2 and 3 again.
    train(&dir, &with_steps(4), &["--resume"], "resumed");

    let out = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/read_tensorboard.py"))
        .arg(dir.join("tensorboard"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "read_tensorboard.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tb: Value = serde_json::from_slice(&out.stdout).unwrap();
    let files = tb["files"].as_array().unwrap();
    assert_eq!(files.len(), 2, "one event file per process: {files:?}");
    // tag → [(step, wall_time, value)]
    let scalars: BTreeMap<String, Vec<(u64, f64, Option<f64>)>> = tb["scalars"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(tag, evs)| {
            let evs = evs
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e[0].as_u64().unwrap(),
                        e[1].as_f64().unwrap(),
                        e[2].as_f64(),
                    )
                })
                .collect();
            (tag.clone(), evs)
        })
        .collect();

    let rows = rollflash_run::metrics::read(&dir.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = rows.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![0, 1, 2, 3]);
    let mut checked = 0;
    for row in &rows {
        let step = row["step"].as_u64().unwrap();
        for (tag, want) in expected_scalars(row) {
            let evs = scalars
                .get(&tag)
                .unwrap_or_else(|| panic!("no tag {tag} in the event files"));
            let at: Vec<_> = evs.iter().filter(|e| e.0 == step).collect();
            assert_eq!(at.len(), 1, "{tag} at step {step}: {at:?}");
            let got = at[0].2.unwrap();
            assert!(same_f32(got, want), "{tag} at step {step}: {got} vs {want}");
            checked += 1;
        }
    }
    // Every metric tag has exactly the metrics' steps, in order, with monotone wall times.
    for (tag, evs) in &scalars {
        if tag.starts_with("eval/") {
            continue;
        }
        let got: Vec<u64> = evs.iter().map(|e| e.0).collect();
        let want: Vec<u64> = rows
            .iter()
            .filter(|r| expected_scalars(r).iter().any(|(t, _)| t == tag))
            .map(|r| r["step"].as_u64().unwrap())
            .collect();
        assert_eq!(got, want, "steps of {tag}");
        assert!(
            evs.windows(2).all(|w| w[0].1 <= w[1].1),
            "wall times of {tag} go back: {evs:?}"
        );
    }
    for key in [
        "reward",
        "loss",
        "tokens_per_s",
        "staleness_hist/0",
        "started",
    ] {
        assert!(scalars.contains_key(key), "no {key}");
    }
    // The evaluations: before RL at step 0, after RL at step 4 (the policy of every step).
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    // The resumed process did not measure the evaluation before RL: its checkpoint carries
    // the first process's, which summary.json repeats and the first event file holds.
    let first_eval = &summary["eval_before"];
    let evals = &scalars["eval/greedy_success"];
    let eval_steps: Vec<u64> = evals.iter().map(|e| e.0).collect();
    assert_eq!(eval_steps, vec![0, 4], "{evals:?}");
    assert!(same_f32(
        evals[0].2.unwrap(),
        first_eval["success_rate"].as_f64().unwrap()
    ));
    assert!(same_f32(
        evals[1].2.unwrap(),
        summary["eval_after"]["success_rate"].as_f64().unwrap()
    ));
    let rewards = &scalars["eval/greedy_mean_reward"];
    assert!(same_f32(
        rewards[0].2.unwrap(),
        first_eval["mean_reward"].as_f64().unwrap()
    ));
    assert!(same_f32(
        rewards[1].2.unwrap(),
        summary["eval_after"]["mean_reward"].as_f64().unwrap()
    ));
    eprintln!(
        "tensorboard read back {checked} values of {} tags over {} steps from {files:?}",
        scalars.len(),
        rows.len()
    );
}
