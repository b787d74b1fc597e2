//! `rollflash train --config configs/tinker.toml` through a real Tinker server (SkyRL 0.4.0's
//! JAX backend on this CPU, `rollflash_tinker::local`; skipped, saying why, where Python 3.12
//! or its install is unavailable): the built-in model after its supervised warm-up is served
//! by the server, which trains its LoRA adapter and samples every rollout; rollflash drives
//! the run. The held-out greedy accuracy rises (the warm-up leaves the answer's `####` format
//! unsettled, which RL settles), every sample is accounted for, staleness stays within α, and
//! the final state is saved on the server and recorded. Then the server is killed (`kill -9`
//! of its process group) in the middle of a second run: the run stops within its deadlines,
//! naming its newest checkpoint (the server's saved state recorded in ours); the server is
//! restarted and `--resume` continues the run through `load_state` to its last step, every
//! sample accounted for. And with `learner.rejoin_secs` the same kill, the server restarted
//! 2 s later, does not stop the run: it rejoins the server and finishes every step once.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rollflash_tinker::local::LocalServer;

use crate::tiny_run::assert_balanced;

/// `rollflash train --config configs/tinker.toml` against `url`, writing to `run`, with
/// `extra` settings.
fn tinker_train(url: &str, run: &Path, extra: &[String]) -> Command {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tinker.toml");
    let mut c = Command::new(env!("CARGO_BIN_EXE_rollflash"));
    c.arg("train")
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
        .args([
            "--set",
            "metrics.progress=false",
            "--set",
            "metrics.report=false",
        ]);
    for e in extra {
        c.arg("--set").arg(e);
    }
    c
}

/// The run in `run` logged steps 0..`steps` once each, every step and the summary balanced.
fn assert_every_step_once(run: &Path, steps: usize, what: &str) {
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), steps, "every step once: {metrics}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["step"].as_u64(), Some(i as u64), "{r}");
        assert_balanced(r, &format!("a step of the {what} Tinker run"));
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_balanced(
        &summary["accounting"],
        &format!("the {what} Tinker run's summary"),
    );
}

/// Polls `cond` every 200 ms until it holds or `limit` passes; whether it held.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    cond()
}

#[test]
fn train_through_a_real_tinker_server_raises_the_reward() {
    let dir = tempfile::tempdir().unwrap();
    let model = crate::util::warmed_up_model();
    let mut server = match LocalServer::start_serving(&model) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIPPED train_through_a_real_tinker_server_raises_the_reward: {e}");
            return;
        }
    };
    let url = server.url().to_string();
    let run = dir.path().join("run");
    let out = tinker_train(
        &url,
        &run,
        &["train.steps=8".into(), "train.eval_problems=40".into()],
    )
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
        // Where the step's time went: forward_backward, optim_step and
        // save_weights_for_sampler are a submission and at least one poll each.
        let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {r}"));
        assert!(f("tinker_requests") >= 6.0, "{r}");
        assert!(f("tinker_mb_out") > 0.0 && f("tinker_mb_in") > 0.0, "{r}");
        let parts = f("tinker_wait_s") + f("tinker_codec_s") + f("tinker_backoff_s");
        assert!(parts <= f("tinker_step_s") + 1e-6, "{r}");
        assert!(f("tinker_local_s") >= 0.0, "{r}");
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

    // The server dies in the middle of a run: the run stops within its deadlines and names
    // the newest checkpoint, which records the state the server saved at that step.
    let crash = dir.path().join("crash");
    let settings = [
        "train.steps=6".to_string(),
        "train.eval_problems=0".into(),
        "checkpoint.every=2".into(),
        "controller.progress_timeout_secs=60".into(),
        "controller.serve_timeout_secs=60".into(),
    ];
    let (log_out, log_err) = (dir.path().join("crash.out"), dir.path().join("crash.err"));
    let mut child = tinker_train(&url, &crash, &settings)
        .stdout(Stdio::from(std::fs::File::create(&log_out).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&log_err).unwrap()))
        .spawn()
        .unwrap();
    let first = crash.join("checkpoints").join("step-00000002");
    let reached = wait_for(Duration::from_secs(600), || {
        first.join("checksums.json").exists() || child.try_wait().unwrap().is_some()
    });
    assert!(
        reached && child.try_wait().unwrap().is_none(),
        "the run should be at its first checkpoint and still running: {}\n{}",
        std::fs::read_to_string(&log_out).unwrap_or_default(),
        std::fs::read_to_string(&log_err).unwrap_or_default()
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(first.join("tinker.json")).unwrap()).unwrap();
    assert!(
        saved["state_path"]
            .as_str()
            .unwrap()
            .starts_with("tinker://"),
        "{saved}"
    );
    assert_eq!(saved["optimizer_steps"], 2);
    server.kill9().unwrap();
    let killed = Instant::now();
    let mut status = None;
    assert!(
        wait_for(Duration::from_secs(400), || {
            status = child.try_wait().unwrap();
            status.is_some()
        }),
        "the run must stop within its deadlines after its server died"
    );
    let err = std::fs::read_to_string(&log_err).unwrap();
    eprintln!(
        "stopped {:.0} s after the kill:\n{err}",
        killed.elapsed().as_secs_f64()
    );
    assert!(!status.unwrap().success(), "a run whose trainer died fails");
    assert!(
        err.contains("--resume") || err.contains("checkpoint"),
        "{err}"
    );
    assert!(
        err.contains("step-0000000"),
        "the error names the checkpoint: {err}"
    );

    // Restarted on its run directory, the server has lost its models (SkyRL keeps them in
    // memory) but not the saved states: `--resume` loads the checkpoint's into a new model.
    server.restart().unwrap();
    let out = tinker_train(&url, &crash, &settings)
        .arg("--resume")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the resumed run failed: {stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log_tail(40)
    );
    assert!(stdout.contains("tinker: loaded tinker://"), "{stdout}");
    assert_every_step_once(&crash, 6, "resumed");
    let final_state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(crash.join("final").join("tinker.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(final_state["optimizer_steps"], 6);

    // Rejoined instead of stopped: with `learner.rejoin_secs` the same kill at the first
    // checkpoint (the synchronous baseline, so the learner is most likely waiting for its
    // next batch then, which only the server's lost samplers could give it), the server
    // restarted 2 s later: the run rejoins the server by itself and finishes every step once.
    let rejoin = dir.path().join("rejoin");
    let settings = [
        "train.steps=6".to_string(),
        "train.eval_problems=0".into(),
        "checkpoint.every=2".into(),
        "controller.sync=true".into(),
        "buffer.alpha=0".into(),
        "learner.rejoin_secs=600".into(),
        "controller.progress_timeout_secs=600".into(),
        "controller.serve_timeout_secs=600".into(),
    ];
    let (log_out, log_err) = (dir.path().join("rejoin.out"), dir.path().join("rejoin.err"));
    let mut child = tinker_train(&url, &rejoin, &settings)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::from(std::fs::File::create(&log_out).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&log_err).unwrap()))
        .spawn()
        .unwrap();
    let first = rejoin.join("checkpoints").join("step-00000002");
    let reached = wait_for(Duration::from_secs(600), || {
        first.join("checksums.json").exists() || child.try_wait().unwrap().is_some()
    });
    assert!(
        reached && child.try_wait().unwrap().is_none(),
        "the run should be at its first checkpoint and still running: {}\n{}",
        std::fs::read_to_string(&log_out).unwrap_or_default(),
        std::fs::read_to_string(&log_err).unwrap_or_default()
    );
    server.kill9().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    server.restart().unwrap();
    let mut status = None;
    let finished = wait_for(Duration::from_secs(900), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if !finished {
        let _ = child.kill();
    }
    let err = std::fs::read_to_string(&log_err).unwrap();
    assert!(
        finished && status.unwrap().success(),
        "the run must rejoin its restarted server and finish: {}\n{err}\nserver log:\n{}",
        std::fs::read_to_string(&log_out).unwrap_or_default(),
        server.log_tail(40)
    );
    assert!(err.contains("rejoined the Tinker server"), "{err}");
    eprintln!(
        "rejoined {}",
        if err.contains("rebuilt its weights") {
            "while the learner waited for a batch"
        } else {
            "in the middle of a step"
        }
    );
    assert_every_step_once(&rejoin, 6, "rejoined");
}
