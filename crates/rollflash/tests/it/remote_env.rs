//! `rollflash train` with `env.remote` against a spawned `rollflash env-serve`: the run
//! checks the server at start (and names it when it is down), every trajectory's server-side
//! environment is released, the accounting balances, and environments that fail on the
//! server, or a server killed mid-run and restarted, cost their trajectories (counted as
//! failed), never the run. About 30 s in all.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use rollflash_run::config::TrainConfig;
use rollflash_run::pipeline;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const KEY: &str = "remote-env-test-key";

/// A running `rollflash env-serve` with an API key; killed when dropped.
struct Server {
    child: Child,
    url: String,
}

async fn serve(port: u16) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args(["env-serve", "--port", &port.to_string()])
        .env("ROLLFLASH_API_KEY", KEY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn rollflash env-serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("started in time")
        .expect("read")
        .expect("an address line");
    let url = first
        .strip_prefix("listening on ")
        .expect("address")
        .to_string();
    Server { child, url }
}

async fn live_envs(url: &str) -> u64 {
    let v: serde_json::Value = reqwest::get(format!("{url}/health"))
        .await
        .expect("health")
        .json()
        .await
        .expect("json");
    v["envs"].as_u64().expect("envs")
}

/// `crate::tiny_run::tiny_lake_sets` with the environment on the server at `url`.
fn sets(dir: &Path, url: &str, steps: usize, extra: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = crate::tiny_run::tiny_lake_sets(dir)
        .into_iter()
        .map(|s| match s.strip_prefix("env.") {
            Some(rest) => format!("env.remote.spec.{rest}"),
            None => s,
        })
        .collect();
    out.extend([
        format!("env.remote.url={url:?}"),
        format!("env.remote.api_key={KEY:?}"),
        "env.remote.timeout_secs=5".into(),
        "warmup.steps=0".into(),
        format!("train.steps={steps}"),
        "rollout.group_size_redundancy=2".into(),
    ]);
    out.extend(extra.iter().map(|s| s.to_string()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn train_on_a_remote_env_serve_balances_and_releases_its_envs() {
    let server = serve(0).await;
    let dir = tempfile::tempdir().expect("tmp");
    // No failure is expected in this first run: a deadline far above any call's time on a
    // loaded machine (the whole suite at once on 2 cores), so none is invented.
    let cfg = TrainConfig::load(
        None,
        &sets(dir.path(), &server.url, 2, &["env.remote.timeout_secs=60"]),
    )
    .expect("config");
    assert_eq!(cfg.env.name(), "frozen_lake");
    let plan = rollflash_run::plan::RunPlan::new(cfg.clone()).expect("plan");
    let described = plan.describe().join("\n");
    assert!(
        described.contains(&format!("on env-serve {}", server.url)),
        "{described}"
    );
    // The printed config hides the key.
    let printed = cfg.to_toml().expect("toml");
    assert!(
        !printed.contains(KEY) && printed.contains("[env.remote.spec]"),
        "{printed}"
    );

    let s = pipeline::run(cfg).await.expect("run");
    let a = s.report.accounting;
    assert_eq!(s.report.steps.len(), 2);
    assert!(a.balanced(), "{a:?}");
    assert_eq!(a.failed, 0, "{a:?}");
    assert_eq!(a.trained, 2 * 2 * 4);
    // Every trajectory's environment was deleted (surplus ones included), or is being: the
    // deletes of cancelled trajectories are sent as they end.
    // A generous deadline: the deletes are sent as the trajectories end, and on a loaded
    // machine they may take a while to be served.
    let mut live = live_envs(&server.url).await;
    let t0 = std::time::Instant::now();
    while live != 0 && t0.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        live = live_envs(&server.url).await;
    }
    assert_eq!(live, 0, "environments left on the server");

    // Environments that fail on the server (injected there, a fifth of calls, each
    // environment with its own random stream) cost their trajectories, counted; the run
    // completes.
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = TrainConfig::load(
        None,
        &sets(
            dir.path(),
            &server.url,
            3,
            &[
                "env.remote.spec.failure.rate=0.2",
                "rollout.group_size_redundancy=4",
            ],
        ),
    )
    .expect("config");
    let s = pipeline::run(cfg).await.expect("run with failing envs");
    let a = s.report.accounting;
    assert_eq!(s.report.steps.len(), 3);
    assert!(a.balanced(), "{a:?}");
    assert!(a.failed > 0, "some failed: {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_env_server_costs_its_trajectories_and_a_down_one_is_named() {
    // Down at start: refused before anything runs, naming the server.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let dir = tempfile::tempdir().expect("tmp");
    let down = format!("http://127.0.0.1:{port}");
    let cfg = TrainConfig::load(None, &sets(dir.path(), &down, 1, &[])).expect("config");
    let err = pipeline::run(cfg).await.expect_err("server down");
    assert!(rollflash_core::error_chain(&err).contains(&down), "{err}");

    // Killed after the first step and restarted on the same port: the trajectories in
    // between fail and are counted; the run finishes on the restarted server.
    let mut server = serve(0).await;
    let url = server.url.clone();
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = TrainConfig::load(None, &sets(dir.path(), &url, 4, &[])).expect("config");
    let metrics = dir.path().join("metrics.jsonl");
    let run = tokio::spawn(pipeline::run(cfg));
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(&metrics).map_or(true, |m| m.lines().count() < 1) {
        assert!(t0.elapsed() < Duration::from_secs(300), "no first step");
        assert!(!run.is_finished(), "the run ended before its first step");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.child.kill().await.expect("kill");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _restarted = serve(port).await;
    let s = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the run ends")
        .expect("join")
        .expect("run");
    let a = s.report.accounting;
    assert_eq!(s.report.steps.len(), 4);
    assert!(a.balanced(), "{a:?}");
    assert!(a.failed > 0, "the outage cost trajectories: {a:?}");
}

/// The only environment server killed after the first step and never restarted: every
/// trajectory fails from then on, no batch can form, and the run stops after
/// `controller.progress_timeout_secs` with a checkpoint and a message saying what it waited
/// on — not a run that relaunches failing groups forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_env_server_that_stays_down_stops_the_run_with_a_checkpoint() {
    let mut server = serve(0).await;
    let url = server.url.clone();
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = TrainConfig::load(
        None,
        &sets(
            dir.path(),
            &url,
            4,
            &[
                // Long enough that a loaded machine (the whole suite at once) makes its
                // first step; the test then waits this long after the kill.
                "controller.progress_timeout_secs=15",
                "env.remote.timeout_secs=5",
            ],
        ),
    )
    .expect("config");
    let metrics = dir.path().join("metrics.jsonl");
    let run = tokio::spawn(pipeline::run(cfg));
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(&metrics).map_or(true, |m| m.lines().count() < 1) {
        assert!(t0.elapsed() < Duration::from_secs(300), "no first step");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.child.kill().await.expect("kill");
    let err = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the run ends")
        .expect("join")
        .expect_err("no progress is an error");
    let msg = err.to_string();
    assert!(
        msg.contains("no progress") && msg.contains("controller.progress_timeout_secs"),
        "{msg}"
    );
    let pipeline::PipelineError::NoProgress {
        failed, checkpoint, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert!(*failed > 0, "{msg}");
    assert!(
        checkpoint.join("state.json").exists(),
        "a resumable checkpoint at {}",
        checkpoint.display()
    );
}
