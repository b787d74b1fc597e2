//! Tests of `openenv` against a real OpenEnv server: openenv-core 0.3.0's own server
//! (`create_fastapi_app` under uvicorn) running `scripts/openenv_guess.py`, installed by
//! `scripts/setup_openenv.sh` and started by `scripts/start_openenv.sh`. Skipped, with the
//! reason, where openenv-core cannot be installed (no python3, no PyPI). About 20 s here
//! once installed (the server's imports take most of it); the first install about 90 s.

use std::process::Stdio;
use std::time::Duration;

use rollflash_env::openenv::{OpenEnvClient, OpenEnvConfig};
use rollflash_env::{Env, EnvError, OutOfOrder, RemoteFailure};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running OpenEnv server, killed on drop.
struct Server {
    url: String,
    child: Child,
}

/// Starts the guessing game with `max_sessions` sessions, or says why it cannot.
async fn start(max_sessions: usize) -> Result<Server, String> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/start_openenv.sh"
    );
    let mut child = Command::new("bash")
        .arg(script)
        .args(["--port", "0", "--max-sessions", &max_sessions.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {script}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    // The first install takes about 90 s; the server's imports about 15 s.
    let first = tokio::time::timeout(Duration::from_secs(600), lines.next_line())
        .await
        .map_err(|_| "the server printed no address within 600 s".to_string())?
        .map_err(|e| format!("reading the server's stdout: {e}"))?;
    let Some(line) = first else {
        let status = child.wait().await.map_err(|e| e.to_string())?;
        return Err(format!(
            "scripts/start_openenv.sh exited ({status}) before serving; its stderr is above"
        ));
    };
    let url = line
        .strip_prefix("listening on ")
        .ok_or_else(|| format!("unexpected first line {line:?}"))?
        .to_string();
    // Keep reading stdout so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Server { url, child })
}

fn cfg(url: &str) -> OpenEnvConfig {
    OpenEnvConfig {
        timeout_secs: 10.0,
        ..OpenEnvConfig::new(url)
    }
}

/// Plays one episode by bisection; returns (observations, total reward, steps).
async fn bisect(env: &mut dyn Env, seed: u64) -> (Vec<String>, f64, usize) {
    let r = env.reset(seed).await.expect("reset");
    assert!(r.observation.starts_with("Guess my number between 1 and 8"));
    assert_eq!(r.info.get("tries_left"), Some(&json!(3)));
    let mut obs = vec![r.observation];
    let (mut lo, mut hi, mut total, mut steps) = (1, 8, 0.0, 0);
    loop {
        let g = (lo + hi) / 2;
        let s = env.step(&format!("I guess {g}.")).await.expect("step");
        steps += 1;
        total += s.reward;
        assert!(!s.truncated);
        if s.observation.starts_with("Higher") {
            lo = g + 1;
        } else if s.observation.starts_with("Lower") {
            hi = g - 1;
        }
        let done = s.done();
        obs.push(s.observation);
        if done {
            return (obs, total, steps);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openenv_server_episodes_sessions_and_failures() {
    let mut server = match start(4).await {
        Ok(s) => s,
        Err(why) => {
            eprintln!("skipped: no OpenEnv server ({why})");
            return;
        }
    };
    let url = server.url.clone();

    // The start-up check: health, schema, a session. The action field comes from the schema
    // (the only string field besides `metadata`).
    let client = OpenEnvClient::new(cfg(&url)).expect("client");
    let info = client.check().await.expect("check");
    assert_eq!(info.status, "healthy");
    assert_eq!(info.action_field, "guess");
    assert!(info.observation_properties.contains(&"prompt".to_string()));

    // Multi-turn episodes over one session each; the same seed, the same episode.
    let mut env = client.env();
    let a = bisect(&mut env, 7).await;
    let b = bisect(&mut env, 7).await;
    assert_eq!(a, b, "same seed, same episode (one session, reset twice)");
    assert!(a.1 == 0.0 || a.1 == 1.0);
    // Bisection over 1..=8 finds it within 3 tries unless it is 8 (4 needed).
    let solved = (0..20u64).map(|s| s + 100);
    let mut wins = 0;
    for seed in solved {
        let (_, r, _) = bisect(&mut env, seed).await;
        wins += r as usize;
    }
    assert!(wins >= 14, "bisection wins most games: {wins}/20");
    // After the end, a step is out of order until the next reset.
    let err = env.step("1").await.expect_err("after the end");
    assert!(
        matches!(err, EnvError::OutOfOrder(OutOfOrder::StepAfterEnd { .. })),
        "{err}"
    );
    env.close().await.expect("close");
    assert!(!env.connected());

    // Sessions are released on close: 4 at a time, three rounds of 4.
    for round in 0..3 {
        let mut envs: Vec<_> = (0..4).map(|_| client.env()).collect();
        for (i, e) in envs.iter_mut().enumerate() {
            e.reset(i as u64)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        // A fifth is refused while the four are open: the server's session limit.
        if round == 0 {
            let mut fifth = client.env();
            let err = fifth.reset(9).await.expect_err("over capacity");
            assert!(
                matches!(&err, EnvError::Remote { source: RemoteFailure::Session { code, .. }, .. } if code == "CAPACITY_REACHED"),
                "{err}"
            );
        }
        for e in &mut envs {
            e.close().await.expect("close");
        }
    }
    // Dropping an open session (a cancelled trajectory) ends it on the server too.
    for _ in 0..4 {
        let mut e = client.env();
        e.reset(1).await.expect("reset");
        drop(e);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut envs: Vec<_> = (0..4).map(|_| client.env()).collect();
    for e in &mut envs {
        e.reset(2).await.expect("dropped sessions were released");
    }
    for e in &mut envs {
        e.close().await.expect("close");
    }

    // A configured action field that the action lacks is refused at the check, by name.
    let bad = OpenEnvClient::new(OpenEnvConfig {
        action_field: Some("message".into()),
        ..cfg(&url)
    })
    .expect("client");
    let err = bad.check().await.expect_err("no such field");
    assert!(
        matches!(&err, EnvError::Config { field, .. } if field == "action_field"),
        "{err}"
    );
    // Extra action fields the schema forbids come back as the server's validation error.
    let strict = OpenEnvClient::new(OpenEnvConfig {
        action_extra: [("hint".to_string(), json!(1))].into_iter().collect(),
        action_field: Some("guess".into()),
        ..cfg(&url)
    })
    .expect("client");
    let mut e = strict.env();
    e.reset(3).await.expect("reset");
    let err = e.step("4").await.expect_err("extra field");
    assert!(
        matches!(&err, EnvError::Remote { source: RemoteFailure::Session { code, .. }, .. } if code == "VALIDATION_ERROR"),
        "{err}"
    );
    // The session was dropped with the failure; the next reset opens a fresh one.
    assert!(!e.connected());

    // The server dies mid-episode: the step fails (connection lost), never hangs.
    let mut e = client.env();
    e.reset(5).await.expect("reset");
    server.child.kill().await.expect("kill");
    let t0 = std::time::Instant::now();
    let err = e.step("4").await.expect_err("server gone");
    assert!(matches!(err, EnvError::Remote { .. }), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(11),
        "within the deadline"
    );
    // And a check names the server that is down.
    let err = OpenEnvClient::new(cfg(&url))
        .expect("client")
        .check()
        .await
        .expect_err("down");
    assert!(err.to_string().contains(&url), "{err}");
}

#[test]
fn openenv_config_is_validated_by_field() {
    let field_of = |c: OpenEnvConfig| match c.validate() {
        Err(EnvError::Config { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field_of(OpenEnvConfig::new("")), "url");
    assert_eq!(field_of(OpenEnvConfig::new("https://x:1")), "url");
    assert_eq!(field_of(OpenEnvConfig::new("ftp://x")), "url");
    let c = OpenEnvConfig {
        timeout_secs: 0.0,
        ..OpenEnvConfig::new("http://127.0.0.1:1")
    };
    assert_eq!(field_of(c), "timeout_secs");
    let c = OpenEnvConfig {
        reset_extra: [("seed".to_string(), json!(1))].into_iter().collect(),
        ..OpenEnvConfig::new("http://127.0.0.1:1")
    };
    assert_eq!(field_of(c), "reset_extra");
    let c = OpenEnvConfig {
        action_field: Some("guess".into()),
        action_extra: [("guess".to_string(), json!("x"))].into_iter().collect(),
        ..OpenEnvConfig::new("http://127.0.0.1:1")
    };
    assert_eq!(field_of(c), "action_extra");
    OpenEnvConfig::new("ws://127.0.0.1:1/")
        .validate()
        .expect("ws:// is fine");
}

#[tokio::test]
async fn openenv_server_down_is_named_quickly() {
    // A port nothing listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let err = OpenEnvClient::connect(cfg(&url)).await.expect_err("down");
    assert!(err.to_string().contains(&url), "{err}");
    // A session on it fails at reset, not later.
    let client = OpenEnvClient::new(cfg(&url)).expect("client");
    let mut e = client.env();
    let err = e.reset(0).await.expect_err("down");
    assert!(
        matches!(
            &err,
            EnvError::Remote {
                source: RemoteFailure::WebSocket(_),
                ..
            }
        ),
        "{err}"
    );
}
