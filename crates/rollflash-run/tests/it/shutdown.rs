//! Every exit of a run shuts down what runs beside it: an error in each phase — before the
//! rollout starts (a checkpoint that does not exist), while it starts (a server that is
//! down), in training (a metrics file that cannot be written) and at the end (a final
//! directory that cannot be written) — returns the error with the Prometheus endpoint closed
//! and no task of the run (proxy, its backends' requests, environments, the endpoint) still
//! alive in the runtime.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use rollflash_run::config::TrainConfig;
use rollflash_run::pipeline::{run_with, PipelineError, Resume, RunOptions};

/// A short built-in run into `out`: no warm-up, no evaluation, one small step.
fn config(out: &Path, extra: &[&str]) -> TrainConfig {
    let mut sets = vec![
        format!("output_dir = {:?}", out.display().to_string()),
        "warmup.steps = 0".to_string(),
        "train.eval_problems = 0".to_string(),
        "train.steps = 1".to_string(),
        "buffer.groups_per_batch = 1".to_string(),
        "buffer.group_size = 2".to_string(),
        "metrics.progress = false".to_string(),
        "metrics.report = false".to_string(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    TrainConfig::load(None, &sets).unwrap()
}

/// Runs `cfg` with a Prometheus endpoint on a free port; returns the error and the address
/// the endpoint had.
async fn failing_run(cfg: TrainConfig, resume: Option<Resume>) -> (PipelineError, SocketAddr) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let opts = RunOptions {
        resume,
        metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
        metrics_bound: Some(tx),
        ..Default::default()
    };
    let err = match run_with(cfg, opts).await {
        Ok(_) => panic!("the run should have failed"),
        Err(e) => e,
    };
    let addr = rx
        .await
        .expect("the endpoint was started before the failure");
    (err, addr)
}

/// Waits (bounded) until no task is alive in this runtime, then checks the endpoint is gone.
async fn assert_all_stopped(phase: &str, addr: SocketAddr) {
    let metrics = tokio::runtime::Handle::current().metrics();
    let deadline = Instant::now() + Duration::from_secs(10);
    while metrics.num_alive_tasks() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        metrics.num_alive_tasks(),
        0,
        "{phase}: tasks of the run still alive after it returned"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "{phase}: the Prometheus endpoint {addr} still accepts connections"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_in_preparation_stops_the_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (err, addr) = failing_run(
        config(dir.path(), &[]),
        Some(Resume::Dir(dir.path().join("no-such-checkpoint"))),
    )
    .await;
    assert!(matches!(err, PipelineError::Checkpoint(_)), "{err}");
    assert_all_stopped("preparation", addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_starting_the_rollout_stops_engines_proxy_and_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 (discard) on loopback: nothing listens, the start-up check fails at once.
    let cfg = config(
        dir.path(),
        &[
            "rollout.servers = [{ kind = \"rollflash\", url = \"http://127.0.0.1:9\", weights = \"none\", connect_timeout_secs = 1, timeout_secs = 2 }]",
            "rollout.server_check_timeout_secs = 2",
        ],
    );
    let (err, addr) = failing_run(cfg, None).await;
    assert!(matches!(err, PipelineError::Stack(_)), "{err}");
    assert_all_stopped("rollout start", addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_in_training_stops_engines_proxy_and_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    // `metrics.jsonl` cannot be created: a directory has its name.
    std::fs::create_dir_all(dir.path().join("metrics.jsonl")).unwrap();
    let (err, addr) = failing_run(config(dir.path(), &[]), None).await;
    assert!(matches!(err, PipelineError::Io(_)), "{err}");
    assert_all_stopped("training", addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_at_the_end_stops_the_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    // `final/` cannot be written: a file has its name.
    std::fs::write(dir.path().join("final"), b"in the way").unwrap();
    let (err, addr) = failing_run(config(dir.path(), &[]), None).await;
    assert!(matches!(err, PipelineError::Model(_)), "{err}");
    assert_all_stopped("the end", addr).await;
}
