//! `rollflash env-serve` as a real process: episodes through `RemoteEnv` match the in-process
//! environment, the API key is enforced, and SIGTERM stops the server cleanly.

use std::process::Stdio;
use std::time::Duration;

use rollflash_env::envs::{make_env, EnvSpec};
use rollflash_env::remote::{RemoteEnv, RemoteEnvConfig};
use rollflash_env::{Env, EnvError, RemoteFailure};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a debug build may take to start and print its address.
const STARTUP: Duration = Duration::from_secs(60);

/// A running `rollflash env-serve`; killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    async fn start(args: &[&str], api_key_env: Option<&str>) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollflash"));
        cmd.arg("env-serve")
            .args(args)
            .env_remove("ROLLFLASH_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(k) = api_key_env {
            cmd.env("ROLLFLASH_API_KEY", k);
        }
        let mut child = cmd.spawn().expect("spawn rollflash env-serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(STARTUP, lines.next_line())
            .await
            .expect("server printed nothing in time")
            .expect("read stdout")
            .expect("stdout closed before the address");
        let url = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        Server { child, url }
    }

    fn remote(&self, spec: &EnvSpec, key: Option<&str>) -> RemoteEnv {
        let mut cfg = RemoteEnvConfig::new(&self.url, spec.clone());
        cfg.api_key = key.map(str::to_string);
        cfg.timeout = Duration::from_secs(30);
        RemoteEnv::new(cfg).expect("remote env")
    }

    async fn kill(mut self) {
        self.child.kill().await.expect("kill");
    }
}

fn env_spec(v: serde_json::Value) -> EnvSpec {
    serde_json::from_value(v).expect("spec")
}

#[tokio::test]
async fn frozen_lake_episodes_over_a_real_process_match_in_process() {
    let server = Server::start(&["--env", "frozen_lake", "--port", "0"], None).await;
    let spec = env_spec(json!({"name": "frozen_lake", "map": "8x8"}));
    let mut local = make_env(&spec).expect("local");
    let mut remote = server.remote(&spec, None);
    let actions = ["Right", "Down", "2", "left", "Up", "nonsense", "Down"];
    for seed in 0..5u64 {
        assert_eq!(
            local.reset(seed).await.expect("local reset"),
            remote.reset(seed).await.expect("remote reset"),
            "seed {seed}"
        );
        for action in actions.iter().cycle().take(300) {
            let a = local.step(action).await.expect("local step");
            let b = remote.step(action).await.expect("remote step");
            assert_eq!(a, b, "seed {seed}, action {action}");
            if a.done() {
                assert!(matches!(
                    remote.step("Up").await,
                    Err(EnvError::OutOfOrder(_))
                ));
                break;
            }
        }
    }
    remote.close().await.expect("close");

    // Only the environments named by --env are served.
    let mut sokoban = server.remote(&env_spec(json!({"name": "sokoban"})), None);
    match sokoban.reset(0).await {
        Err(EnvError::Remote {
            source: RemoteFailure::Status { status: 400, .. },
            ..
        }) => {}
        other => panic!("expected a 400, got {other:?}"),
    }
    server.kill().await;
}

#[tokio::test]
async fn api_key_from_the_environment_is_enforced() {
    let server = Server::start(&["--max-envs", "4"], Some("k3y")).await;
    let spec = env_spec(json!({"name": "tool_use"}));
    match server.remote(&spec, None).reset(1).await {
        Err(EnvError::Remote {
            source: RemoteFailure::Status { status: 401, .. },
            ..
        }) => {}
        other => panic!("expected a 401, got {other:?}"),
    }
    match server.remote(&spec, Some("k3y!")).reset(1).await {
        Err(EnvError::Remote {
            source: RemoteFailure::Status { status: 401, .. },
            ..
        }) => {}
        other => panic!("expected a 401, got {other:?}"),
    }
    let mut env = server.remote(&spec, Some("k3y"));
    let r = env.reset(1).await.expect("reset with the key");
    assert!(r.observation.starts_with("What is "));
    env.close().await.expect("close");
    // Health stays open for probes.
    let status = reqwest::get(format!("{}/health", server.url))
        .await
        .expect("health")
        .status();
    assert_eq!(status.as_u16(), 200);
    server.kill().await;
}

#[cfg(unix)]
#[tokio::test]
async fn sigterm_stops_the_server_cleanly() {
    let mut server = Server::start(&[], None).await;
    let pid = server.child.id().expect("pid").to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("run kill");
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(30), server.child.wait())
        .await
        .expect("server did not stop on SIGTERM")
        .expect("wait");
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test]
async fn bad_flags_are_refused_at_startup_naming_them() {
    for (args, named) in [
        (&["--env", "chess"][..], "chess"),
        (
            &["--reward-python", "python3", "--reward-workers", "0"][..],
            "--reward-workers",
        ),
        // The interpreter is started before the port opens, so a missing one is said at once.
        (
            &["--reward-python", "/nonexistent/bin/python"][..],
            "/nonexistent/bin/python",
        ),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rollflash"))
            .arg("env-serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn");
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut stderr)
            .await
            .expect("read stderr");
        let exit = tokio::time::timeout(STARTUP, child.wait())
            .await
            .expect("exits")
            .expect("wait");
        assert!(!exit.success(), "{args:?}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn a_dataset_with_a_python_reward_is_scored_by_the_servers_workers() {
    let python_ok = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !python_ok {
        eprintln!("SKIPPED a_dataset_with_a_python_reward_is_scored_by_the_servers_workers: no python3 on PATH");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("rows.jsonl");
    std::fs::write(
        &data,
        "{\"question\": \"2+3\", \"reward_model\": {\"ground_truth\": \"5\"}}\n",
    )
    .unwrap();
    let scorer = dir.path().join("scorer.py");
    std::fs::write(
        &scorer,
        "import os\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    \
         return {\"score\": float(solution_str.strip() == ground_truth), \"pid\": os.getpid()}\n",
    )
    .unwrap();
    let spec = env_spec(json!({
        "name": "dataset",
        "files": [{"path": data}],
        "prompt": "question",
        "answer": "reward_model.ground_truth",
        "reward": {"python": {"path": scorer, "style": "verl"}},
    }));
    // Without a pool the spec is refused, saying which flag starts one.
    let plain = Server::start(&["--env", "dataset"], None).await;
    match plain.remote(&spec, None).reset(0).await {
        Err(e) => assert!(
            rollflash_core::error_chain(&e).contains("--reward-python"),
            "{}",
            rollflash_core::error_chain(&e)
        ),
        Ok(r) => panic!("a Python reward without a pool was served: {r:?}"),
    }
    plain.kill().await;

    let server = Server::start(
        &[
            "--env",
            "dataset",
            "--reward-python",
            "python3",
            "--reward-workers",
            "1",
        ],
        None,
    )
    .await;
    let mut pids = Vec::new();
    for (answer, want) in [("5", 1.0), ("6", 0.0)] {
        let mut env = server.remote(&spec, None);
        let r = env.reset(0).await.expect("reset");
        assert_eq!(r.observation, "2+3");
        let step = env.step(answer).await.expect("step");
        assert_eq!(step.reward, want, "{answer}: {:?}", step.info);
        assert_eq!(step.info["verdict"], "ok", "{:?}", step.info);
        pids.push(step.info["reward/pid"].as_f64().unwrap());
        env.close().await.expect("close");
    }
    // Both environments were scored by the server's one long-lived worker.
    assert_eq!(pids[0], pids[1]);
    server.kill().await;
}
