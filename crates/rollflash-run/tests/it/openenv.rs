//! `rollflash train` with `env.openenv` against a real OpenEnv server (openenv-core 0.3.0's
//! own server running `scripts/openenv_guess.py`, started by `scripts/start_openenv.sh`):
//! the run checks the server at start, plays multi-turn episodes over OpenEnv sessions,
//! trains on the server's rewards, balances its accounting and leaves no session open on the
//! server (surplus trajectories of redundant groups included). Skipped, with the reason,
//! where openenv-core cannot be installed. About 30 s once installed.

use std::process::Stdio;
use std::time::Duration;

use rollflash_env::openenv::{OpenEnvClient, OpenEnvConfig};
use rollflash_env::Env;
use rollflash_run::config::TrainConfig;
use rollflash_run::pipeline;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The server's session limit: above what the run holds at once (2 groups of 4 + 2
/// redundant, two batches in flight), so only leaked sessions can exhaust it.
const SESSIONS: usize = 32;

/// A running OpenEnv server, killed on drop.
struct Server {
    url: String,
    _child: Child,
}

/// Starts the guessing game, or says why it cannot.
async fn start() -> Result<Server, String> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/start_openenv.sh"
    );
    let mut child = Command::new("bash")
        .arg(script)
        .args(["--port", "0", "--max-sessions", &SESSIONS.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {script}: {e}"))?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    // The first install takes about 90 s; the server's imports about 15 s.
    let first = tokio::time::timeout(Duration::from_secs(600), lines.next_line())
        .await
        .map_err(|_| "the server printed no address within 600 s".to_string())?
        .map_err(|e| format!("reading the server's stdout: {e}"))?
        .ok_or("scripts/start_openenv.sh exited before serving; its stderr is above")?;
    let url = first
        .strip_prefix("listening on ")
        .ok_or_else(|| format!("unexpected first line {first:?}"))?
        .to_string();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Server { url, _child: child })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn train_on_an_openenv_server_trains_on_its_rewards_and_releases_its_sessions() {
    let server = match start().await {
        Ok(s) => s,
        Err(why) => {
            eprintln!("skipped: no OpenEnv server ({why})");
            return;
        }
    };
    let dir = tempfile::tempdir().expect("tmp");
    let steps = 3;
    let sets: Vec<String> = vec![
        format!("output_dir={:?}", dir.path().display().to_string()),
        format!("env.openenv.url={:?}", server.url),
        "env.openenv.timeout_secs=10".into(),
        "warmup.steps=0".into(),
        format!("train.steps={steps}"),
        "rollout.max_new_tokens=4".into(),
        "rollout.max_turns=3".into(),
        "rollout.max_total_tokens=400".into(),
        "rollout.group_size_redundancy=2".into(),
        "buffer.groups_per_batch=2".into(),
        "buffer.group_size=4".into(),
        "train.eval_problems=0".into(),
        "metrics.progress=false".into(),
    ];
    let cfg = TrainConfig::load(None, &sets).expect("config");
    let plan = rollflash_run::plan::RunPlan::new(cfg.clone()).expect("plan");
    let described = plan.describe().join("\n");
    assert!(
        described.contains(&format!("on OpenEnv {}", server.url)),
        "{described}"
    );

    let s = pipeline::run(cfg).await.expect("run");
    let a = s.report.accounting;
    assert_eq!(s.report.steps.len(), steps);
    assert!(a.balanced(), "{a:?}");
    assert_eq!(a.failed, 0, "no episode failed on a healthy server: {a:?}");
    assert_eq!(a.trained, (steps * 2 * 4) as u64, "{a:?}");

    // What was trained on came from the server: its prompt, its replies between the
    // model's turns, and rewards of 0 or 1 (1 only on an episode's last step).
    let rows: Vec<serde_json::Value> =
        std::fs::read_to_string(dir.path().join("trajectories.jsonl"))
            .expect("trajectories.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).expect("a json line"))
            .collect();
    assert!(!rows.is_empty());
    for r in &rows {
        let text: String = r["pieces"]
            .as_array()
            .expect("pieces")
            .iter()
            .map(|p| p["text"].as_str().expect("text"))
            .collect();
        assert!(text.contains("Guess my number between 1 and 8"), "{text}");
        let rewards: Vec<f64> = r["step_rewards"]
            .as_array()
            .expect("step_rewards")
            .iter()
            .map(|v| v.as_f64().expect("number"))
            .collect();
        assert!(!rewards.is_empty() && rewards.len() <= 3, "{r}");
        let (last, before) = rewards.split_last().expect("a step");
        assert!(before.iter().all(|&x| x == 0.0), "{r}");
        assert!(*last == 0.0 || *last == 1.0, "{r}");
        assert_eq!(
            r["reward"].as_f64(),
            Some(rewards.iter().sum::<f64>()),
            "{r}"
        );
        if r["turns"].as_u64() > Some(1) {
            assert!(
                ["Higher.", "Lower.", "That is not a number."]
                    .iter()
                    .any(|reply| text.contains(reply)),
                "a later turn follows the server's reply: {text}"
            );
        }
    }

    // Every session the run opened was closed (the cancelled surplus ones too): the server
    // grants its whole limit again.
    let client = OpenEnvClient::new(OpenEnvConfig {
        timeout_secs: 10.0,
        ..OpenEnvConfig::new(&server.url)
    })
    .expect("client");
    let mut envs: Vec<_> = (0..SESSIONS).map(|_| client.env()).collect();
    for (i, e) in envs.iter_mut().enumerate() {
        let mut last = None;
        // A cancelled trajectory's session closes as its connection drops: allow it a
        // moment to reach the server.
        for _ in 0..50 {
            match e.reset(i as u64).await {
                Ok(_) => {
                    last = None;
                    break;
                }
                Err(err) => last = Some(err),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(last.is_none(), "session {i} refused: {last:?}");
    }
    for e in &mut envs {
        e.close().await.expect("close");
    }

    // A server that is down at start is named before anything runs.
    drop(envs);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let down = format!("http://127.0.0.1:{port}");
    let sets: Vec<String> = sets
        .into_iter()
        .map(|s| {
            if s.starts_with("env.openenv.url=") {
                format!("env.openenv.url={down:?}")
            } else {
                s
            }
        })
        .collect();
    let cfg = TrainConfig::load(None, &sets).expect("config");
    let err = pipeline::run(cfg).await.expect_err("server down");
    assert!(rollflash_core::error_chain(&err).contains(&down), "{err}");
}
