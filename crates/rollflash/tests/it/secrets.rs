//! Secrets stay out of logs: `rollflash serve` and `rollflash env-serve` run with the most
//! verbose logging (`RUST_LOG=trace`, every dependency included) and an API key, are sent
//! requests with the right key, a wrong key and none, and stopped with SIGTERM; neither key
//! appears anywhere in what they wrote. Both bind loopback by default.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

const KEY: &str = "sk-live-7f3a9c1e-do-not-log";
const WRONG: &str = "sk-other-service-b84d2e";

/// Runs `rollflash ARGS` with the key in its environment and trace logging, sends `probe`
/// requests, stops it with SIGTERM, and returns (address, everything it wrote).
async fn run_and_collect(args: &[&str], routes: &[(&str, &str)]) -> (String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args(args)
        .args(["--port", "0"])
        .env("ROLLFLASH_API_KEY", KEY)
        .env("RUST_LOG", "trace")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut stderr = child.stderr.take().expect("stderr");
    let err_task = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("started in time")
        .expect("read")
        .expect("an address line");
    let url = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{first:?}"))
        .to_string();
    let c = reqwest::Client::new();
    for (route, body) in routes {
        for key in [Some(KEY), Some(WRONG), None] {
            let mut rb = c
                .post(format!("{url}{route}"))
                .header("content-type", "application/json")
                .body(body.to_string());
            if let Some(k) = key {
                rb = rb.bearer_auth(k);
            }
            let status = rb.send().await.expect("answer").status().as_u16();
            if key != Some(KEY) {
                assert_eq!(status, 401, "{route} with {key:?}");
            }
        }
    }
    let pid = child.id().expect("pid").to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let mut rest = String::new();
    while let Ok(Some(l)) = lines.next_line().await {
        rest.push_str(&l);
        rest.push('\n');
    }
    let exit = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("stopped on SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    let log = format!("{first}\n{rest}{}", err_task.await.unwrap());
    (url, log)
}

fn assert_no_secret(what: &str, log: &str) {
    // The logs are there to be searched (env-serve logs little even at trace level).
    assert!(
        log.lines().count() >= 3,
        "{what}: logging produced output:\n{log}"
    );
    for secret in [KEY, WRONG, &KEY[8..20], &WRONG[9..20]] {
        assert!(
            !log.contains(secret),
            "{what} logged a key ({secret}):\n{}",
            log.lines()
                .filter(|l| l.contains(secret))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_never_logs_api_keys_and_binds_loopback() {
    let (url, log) = run_and_collect(
        &["serve", "--threads", "1"],
        &[
            (
                "/generate",
                r#"{"input_ids": [2, 40, 41], "sampling_params": {"max_new_tokens": 3}}"#,
            ),
            ("/v1/completions", r#"{"prompt": "1+1=", "max_tokens": 2}"#),
            ("/update_weights_from_disk", r#"{"model_path": "/etc"}"#),
        ],
    )
    .await;
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert_no_secret("serve", &log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_serve_never_logs_api_keys_and_binds_loopback() {
    let (url, log) =
        run_and_collect(&["env-serve"], &[("/envs", r#"{"name": "frozen_lake"}"#)]).await;
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert_no_secret("env-serve", &log);
}
