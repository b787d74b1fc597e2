//! `rollflash train --config configs/tinker.toml` through a real Tinker server (SkyRL 0.4.0's
//! JAX backend on this CPU, `rollflash_tinker::local`; skipped, saying why, where Python 3.12
//! or its install is unavailable): the built-in model after its supervised warm-up is served
//! by the server, which trains its LoRA adapter and samples every rollout; rollflash drives
//! the run. The held-out greedy accuracy rises (the warm-up leaves the answer's `####` format
//! unsettled, which RL settles), every sample is accounted for, staleness stays within α, and
//! the final state is saved on the server and recorded.

use std::path::{Path, PathBuf};
use std::process::Command;

use rollflash_tinker::local::LocalServer;

use crate::util::assert_balanced;

/// The default run's warm-up (the built-in model, 600 supervised steps), written to a cache
/// under `dir` by a one-step run: the Hugging Face directory the server will serve.
fn warmed_up_model(dir: &Path) -> PathBuf {
    let cache = dir.join("warmup-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args([
            "train",
            "--set",
            "train.steps=1",
            "--set",
            "train.eval_problems=0",
        ])
        .args([
            "--set",
            "metrics.progress=false",
            "--set",
            "metrics.report=false",
        ])
        .arg("--set")
        .arg(format!(
            "warmup.cache_dir={:?}",
            cache.display().to_string()
        ))
        .arg("--set")
        .arg(format!(
            "output_dir={:?}",
            dir.join("warmup-run").display().to_string()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the warm-up run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("model.safetensors").exists())
        .expect("a warm-up directory in the cache")
}

#[test]
fn train_through_a_real_tinker_server_raises_the_reward() {
    let dir = tempfile::tempdir().unwrap();
    let model = warmed_up_model(dir.path());
    let server = match LocalServer::start_serving(&model) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIPPED train_through_a_real_tinker_server_raises_the_reward: {e}");
            return;
        }
    };
    let url = server.url().to_string();
    let run = dir.path().join("run");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tinker.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .arg("train")
        .arg("--config")
        .arg(&config)
        .arg("--set")
        .arg(format!("learner.url={url:?}"))
        .arg("--set")
        .arg(format!(
            "rollout.servers=[{{ kind = \"tinker\", url = {url:?}, max_running_requests = 32 }}]"
        ))
        .arg("--set")
        .arg(format!("output_dir={:?}", run.display().to_string()))
        .args(["--set", "train.steps=8", "--set", "train.eval_problems=40"])
        .args([
            "--set",
            "metrics.progress=false",
            "--set",
            "metrics.report=false",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rollflash train through Tinker failed: {stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log_tail(40)
    );
    eprintln!("{stdout}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let before = summary["eval_before"]["success_rate"].as_f64().unwrap();
    let after = summary["eval_after"]["success_rate"].as_f64().unwrap();
    assert!(
        after >= before + 0.2,
        "held-out greedy accuracy should rise through Tinker: {before} -> {after}"
    );
    let acc = &summary["accounting"];
    assert_eq!(acc["running"], 0);
    assert_eq!(acc["buffered"], 0);
    assert_eq!(acc["failed"], 0, "{acc}");
    assert_balanced(acc, "the Tinker run's summary");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 8);
    for r in &rows {
        assert!(r["staleness_max"].as_u64().unwrap() <= 1, "{r}");
        assert_balanced(r, "a step of the Tinker run");
    }
    let final_state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("final").join("tinker.json")).unwrap(),
    )
    .unwrap();
    assert!(final_state["state_path"]
        .as_str()
        .unwrap()
        .starts_with("tinker://"));
    assert_eq!(final_state["optimizer_steps"], 8);
}
