//! `rollflash train` on a fleet of real `rollflash serve` processes on loopback, no embedded
//! engine: one reached through its SGLang-native API (`kind = "sglang"`), one through its
//! OpenAI-compatible API (`kind = "openai"`, weights through the SGLang disk route it also
//! has). The learner publishes every version under `rollout.weights_dir`; both load it and
//! report serving it. After step 2 the OpenAI one is killed (SIGKILL, no goodbye): the run
//! finishes on the other. Checked from what the run writes and what the server says:
//! accounting balanced at every step, every trained sample counted once (the per-step
//! samples add up to the cumulative `trained`), staleness never above ⌈α⌉, the survivor at
//! the final version. A server that is down at start is named in the refusal; a fleet that
//! all goes down mid-run stops the run after `controller.serve_timeout_secs` with a
//! checkpoint and a message, not a hang.
//!
//! About 25 s on a quiet 2-core machine (two servers and the trainer share it).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const STEPS: u64 = 5;
const KILL_AFTER: usize = 2;

/// A running `rollflash serve`, killed when dropped.
struct Server {
    child: Child,
    _stdout: BufReader<ChildStdout>,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `rollflash serve` of the built-in model (weights from another seed than the trainer's: the
/// run's first load replaces them), loading weights only from under `root`.
fn serve(root: &Path, log: &Path) -> Server {
    serve_on(root, log, 0)
}

/// [`serve`] on a given port (0: any).
fn serve_on(root: &Path, log: &Path, port: u16) -> Server {
    let port = port.to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args([
            "serve",
            "--port",
            &port,
            "--threads",
            "1",
            "--init-seed",
            "9",
        ])
        .arg("--weights-root")
        .arg(root)
        .env_remove("ROLLFLASH_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("spawning rollflash serve");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("rollflash serve did not start: {line:?}"))
        .to_string();
    Server {
        child,
        _stdout: stdout,
        url,
    }
}

/// The config of the run: the tiny FrozenLake settings, no engine, two servers.
fn write_config(dir: &Path, servers: &[(&str, &str)]) -> std::path::PathBuf {
    let mut toml = format!(
        "[rollout]\nengines = 0\nweights_dir = {:?}\nserver_check_timeout_secs = 20\n\
         weight_sync_timeout_secs = 20\n",
        dir.join("published").display().to_string()
    );
    for (kind, url) in servers {
        toml.push_str(&format!(
            "\n[[rollout.servers]]\nkind = \"{kind}\"\nurl = \"{url}\"\nmax_running_requests = 8\n\
             timeout_secs = 30\nconnect_timeout_secs = 2\n"
        ));
    }
    let path = dir.join("fleet.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

fn train(dir: &Path, config: &Path) -> Child {
    train_with(dir, config, &[])
}

fn train_with(dir: &Path, config: &Path, extra: &[&str]) -> Child {
    train_args(dir, config, extra, &[])
}

/// [`train_with`] plus command-line arguments (`--resume`).
fn train_args(dir: &Path, config: &Path, extra: &[&str], args: &[&str]) -> Child {
    let mut sets = crate::tiny_run::tiny_lake_sets(dir);
    sets.extend([
        "seed=3".into(),
        "warmup.steps=0".into(),
        "buffer.alpha=1".into(),
        format!("train.steps={STEPS}"),
        "controller.serve_timeout_secs=20".into(),
        "metrics.report=false".into(),
    ]);
    sets.extend(extra.iter().map(|s| s.to_string()));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollflash"));
    cmd.arg("train").arg("--config").arg(config).args(args);
    for s in sets {
        cmd.arg("--set").arg(s);
    }
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("train.out")).unwrap())
        .stderr(std::fs::File::create(dir.join("train.err")).unwrap())
        .spawn()
        .unwrap()
}

fn metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The version a server reports serving (SGLang's `GET /get_weight_version`).
fn served_version(url: &str) -> u64 {
    let body = get_json(format!("{url}/get_weight_version"));
    body["weight_version"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{url}: no weight_version in {body}"))
}

/// A GET from a test thread, on a one-off runtime.
fn get_json(url: String) -> Value {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap()
                .get(url)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        })
}

fn wait_exit(child: &mut Child, limit: Duration, dir: &Path) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!(
                "rollflash train did not finish within {limit:?}; stderr:\n{}",
                std::fs::read_to_string(dir.join("train.err")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_run_on_two_servers_survives_losing_one_and_ends_with_the_other_at_the_final_version() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let published = dir.join("published");
    std::fs::create_dir_all(&published).unwrap();
    let sglang = serve(&published, &dir.join("serve-a.err"));
    let mut openai = serve(&published, &dir.join("serve-b.err"));
    let config = write_config(dir, &[("sglang", &sglang.url), ("openai", &openai.url)]);
    let mut run = train(dir, &config);

    // After step KILL_AFTER (both servers took part in its sync), kill the OpenAI one.
    let t = Instant::now();
    while metrics(dir).len() < KILL_AFTER {
        if let Some(s) = run.try_wait().unwrap() {
            panic!(
                "the run ended early ({s}): {}",
                std::fs::read_to_string(dir.join("train.err")).unwrap_or_default()
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no step {KILL_AFTER} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        served_version(&openai.url) >= KILL_AFTER as u64,
        "the OpenAI server took part in the syncs"
    );
    openai.child.kill().unwrap();
    openai.child.wait().unwrap();

    let status = wait_exit(&mut run, Duration::from_secs(90), dir);
    let err = std::fs::read_to_string(dir.join("train.err")).unwrap_or_default();
    assert!(status.success(), "the run failed: {status}\n{err}");

    let m = metrics(dir);
    assert_eq!(m.len() as u64, STEPS, "every step recorded");
    let mut trained = 0;
    for (i, s) in m.iter().enumerate() {
        let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("step {i}: no {k}"));
        crate::tiny_run::assert_balanced(s, &format!("step {i}"));
        trained += n("samples");
        assert_eq!(
            n("trained"),
            trained,
            "step {i}: a sample counted twice or lost"
        );
        assert!(
            n("staleness_max") <= 1,
            "step {i}: staleness above ⌈α⌉ = 1: {s}"
        );
        if i < KILL_AFTER {
            let by = s["weight_sync_ms_by_backend"]
                .as_object()
                .unwrap_or_else(|| panic!("step {i}: no per-backend sync times: {s}"));
            assert_eq!(by.len(), 2);
            assert!(by.values().all(Value::is_number), "both loaded: {s}");
        }
    }
    // The survivor serves the final version; versions were published as directories and
    // pruned to the newest two.
    assert_eq!(served_version(&sglang.url), STEPS);
    assert_eq!(
        listing(&published),
        [format!("v{:08}", STEPS - 1), format!("v{STEPS:08}")]
    );
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `[train.lora]` on a server with runtime adapter routes: the server starts on another base
/// than the trainer's (`--init-seed`), as after a warm-up, so the first sync's probe finds it
/// and sends the base whole once; every version after reaches it as its adapter only, and it
/// lists the newest two. A run stopped after step 2 and continued with `--resume` finds the
/// base right (nothing whole is sent again), loads its checkpoint's adapter onto the same
/// server (which still holds one of that name), then goes on to the final version.
#[test]
fn lora_versions_reach_a_server_as_adapters_and_a_resumed_run_reloads_its_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let published = dir.join("published");
    std::fs::create_dir_all(&published).unwrap();
    let server = serve(&published, &dir.join("serve.err"));
    let config = write_config(dir, &[("sglang", &server.url)]);
    let lora = "train.lora={rank=4, alpha=8}";
    let every = "checkpoint.every=1";
    let served = || {
        let mut ids: Vec<String> = get_json(format!("{}/v1/models", server.url))["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let on_disk = || listing(&published);
    const WHOLE: &str = "it is sent whole once";

    let mut run = train_with(dir, &config, &[lora, every, "train.steps=2"]);
    let status = wait_exit(&mut run, Duration::from_secs(90), dir);
    let err = std::fs::read_to_string(dir.join("train.err")).unwrap_or_default();
    assert!(status.success(), "the first run failed: {status}\n{err}");
    assert_eq!(err.matches(WHOLE).count(), 1, "the base sent once:\n{err}");
    assert_eq!(served(), ["rollflash", "rollflash-v1", "rollflash-v2"]);
    assert_eq!(
        on_disk(),
        ["adapter-v00000001", "adapter-v00000002", "v00000000"]
    );

    let mut run = train_args(dir, &config, &[lora, every], &["--resume"]);
    let status = wait_exit(&mut run, Duration::from_secs(90), dir);
    let err = std::fs::read_to_string(dir.join("train.err")).unwrap_or_default();
    assert!(status.success(), "the resumed run failed: {status}\n{err}");
    let start = err
        .lines()
        .find(|l| l.contains("server loaded the starting weights"))
        .unwrap_or_else(|| panic!("no start-up load in:\n{err}"));
    assert!(
        start.contains("version=v2"),
        "the checkpoint's version first: {start}"
    );
    assert!(!err.contains(WHOLE), "the base is right now:\n{err}");
    let m = metrics(dir);
    assert_eq!(m.len() as u64, STEPS, "steps 1-2, then 3-{STEPS}");
    for (i, s) in m.iter().enumerate() {
        crate::tiny_run::assert_balanced(s, &format!("step {i}"));
    }
    // The resumed process unloads (and prunes on disk) what it loaded beyond the newest two
    // (v2 again, v3); v1, which the first process left, stays until the server restarts
    // (RELIABILITY.md).
    assert_eq!(
        served(),
        [
            "rollflash".to_string(),
            "rollflash-v1".into(),
            format!("rollflash-v{}", STEPS - 1),
            format!("rollflash-v{STEPS}")
        ]
    );
    assert_eq!(
        on_disk(),
        [
            "adapter-v00000001".to_string(),
            format!("adapter-v{:08}", STEPS - 1),
            format!("adapter-v{STEPS:08}"),
            "v00000000".into()
        ]
    );
}

#[test]
fn a_server_that_is_down_at_start_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // A port nothing listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let config = write_config(dir, &[("rollflash", &url)]);
    let mut run = train(dir, &config);
    let status = wait_exit(&mut run, Duration::from_secs(60), dir);
    let err = std::fs::read_to_string(dir.join("train.err")).unwrap_or_default();
    assert!(!status.success());
    assert!(
        err.contains(&url) && err.contains("is down"),
        "the refusal names the server: {err}"
    );
}

/// A one-thread HTTP server on loopback that answers like vLLM's start-up routes (`/health`,
/// `/v1/models`, no `/get_model_info`) and tokenizes every text as `tokens`: a server that
/// serves another tokenizer with no vocabulary size to compare.
fn fake_vllm(tokens: &'static str) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = vec![0u8; 65536];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
            let (status, body) = match path.as_str() {
                "/health" => ("200 OK", String::new()),
                "/v1/models" => (
                    "200 OK",
                    r#"{"data":[{"id":"fake","max_model_len":4096}]}"#.to_string(),
                ),
                "/tokenize" => ("200 OK", format!(r#"{{"count":3,"tokens":{tokens}}}"#)),
                _ => ("404 Not Found", r#"{"detail":"Not Found"}"#.to_string()),
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

/// A vLLM server whose tokenizer is not the trainer's (vLLM reports no vocabulary size, so
/// the probe text's ids are compared) is refused at start, named, before any step.
#[test]
fn a_server_with_another_tokenizer_is_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let url = fake_vllm("[1,2,3]");
    let config = write_config(dir, &[("vllm", &url)]);
    let mut run = train(dir, &config);
    let status = wait_exit(&mut run, Duration::from_secs(60), dir);
    let err = std::fs::read_to_string(dir.join("train.err")).unwrap_or_default();
    assert!(!status.success());
    assert!(
        err.contains(&url) && err.contains("tokenizes") && err.contains("first difference"),
        "the refusal names the server and the disagreement: {err}"
    );
    assert!(metrics(dir).is_empty(), "no step ran");
}

#[test]
fn a_fleet_that_all_goes_down_stops_the_run_with_a_checkpoint_after_the_serve_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let published = dir.join("published");
    std::fs::create_dir_all(&published).unwrap();
    let mut only = serve(&published, &dir.join("serve.err"));
    let config = write_config(dir, &[("rollflash", &only.url)]);
    let mut run = train_with(
        dir,
        &config,
        &["train.steps=50", "controller.serve_timeout_secs=3"],
    );
    let t = Instant::now();
    while metrics(dir).is_empty() {
        assert!(run.try_wait().unwrap().is_none(), "the run ended early");
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no first step within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    only.child.kill().unwrap();
    only.child.wait().unwrap();
    let killed = Instant::now();
    let status = wait_exit(&mut run, Duration::from_secs(60), dir);
    let waited = killed.elapsed();
    eprintln!("stopped {waited:?} after the last server was killed");
    let err = std::fs::read_to_string(dir.join("train.err")).unwrap_or_default();
    assert!(
        !status.success(),
        "a run with no backend left cannot succeed"
    );
    assert!(
        err.contains("no rollout backend has served policy") && err.contains("checkpoint"),
        "the message says why it stopped: {err}"
    );
    assert!(
        waited < Duration::from_secs(30),
        "stopped {waited:?} after the kill"
    );
    let ckpts: Vec<_> = std::fs::read_dir(dir.join("checkpoints"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        ckpts.iter().any(|c| c.join("state.json").exists()),
        "a resumable checkpoint of where it stopped ({ckpts:?}): {err}"
    );
}

/// Every server of the fleet is SIGKILLed after step 2; one is restarted on its port (with
/// other weights than the run's: a fresh process) before the serve deadline. The run waits,
/// catches the restarted server up to the current weights before it serves, and finishes on
/// it: every step recorded once, accounting balanced, staleness within ⌈α⌉, the server at the
/// final version.
#[test]
fn a_fleet_that_all_goes_down_continues_on_a_server_that_comes_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let published = dir.join("published");
    std::fs::create_dir_all(&published).unwrap();
    let mut a = serve(&published, &dir.join("serve-a.err"));
    let mut b = serve(&published, &dir.join("serve-b.err"));
    let config = write_config(dir, &[("sglang", &a.url), ("openai", &b.url)]);
    let mut run = train_with(dir, &config, &["controller.serve_timeout_secs=60"]);
    let t = Instant::now();
    while metrics(dir).len() < KILL_AFTER {
        assert!(run.try_wait().unwrap().is_none(), "the run ended early");
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no step {KILL_AFTER} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for s in [&mut a, &mut b] {
        s.child.kill().unwrap();
        s.child.wait().unwrap();
    }
    let down = Instant::now();
    // Down for a while: the run notices (the fleet's serving watch turns false).
    std::thread::sleep(Duration::from_secs(2));
    let port: u16 = a
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap();
    let back = serve_on(&published, &dir.join("serve-a2.err"), port);
    assert_eq!(back.url, a.url);
    let status = wait_exit(&mut run, Duration::from_secs(120), dir);
    let err = std::fs::read_to_string(dir.join("train.err")).unwrap_or_default();
    eprintln!("finished {:?} after the fleet went down", down.elapsed());
    assert!(status.success(), "the run failed: {status}\n{err}");
    let m = metrics(dir);
    assert_eq!(m.len() as u64, STEPS, "every step recorded");
    let mut trained = 0;
    for (i, s) in m.iter().enumerate() {
        let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("step {i}: no {k}"));
        crate::tiny_run::assert_balanced(s, &format!("step {i}"));
        trained += n("samples");
        assert_eq!(
            n("trained"),
            trained,
            "step {i}: a sample counted twice or lost"
        );
        assert!(n("staleness_max") <= 1, "step {i}: {s}");
    }
    assert_eq!(
        served_version(&back.url),
        STEPS,
        "the restarted server was caught up"
    );
}

/// `scripts/slow_proxy.py`: a TCP forwarder on loopback in front of a server, a process of its
/// own; it passes bytes both ways until [`SlowProxy::stop_answering`], then holds every byte
/// (in both directions, on open and new connections): a server that accepts and never answers.
struct SlowProxy {
    child: Child,
    url: String,
}

impl SlowProxy {
    /// `scripts/slow_proxy.py` forwarding to `upstream`, as its own process; `None` (the test
    /// skips) where there is no `python3`.
    fn start(upstream: &str) -> Option<SlowProxy> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/slow_proxy.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("--upstream")
            .arg(upstream.strip_prefix("http://").unwrap())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .ok()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("slow_proxy.py did not start: {line:?}"))
            .to_string();
        Some(SlowProxy { child, url })
    }

    /// From now on every byte it forwards is held (SIGUSR1).
    fn stop_answering(&self) {
        let ok = Command::new("kill")
            .args(["-USR1", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "could not signal slow_proxy.py");
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One of two servers stops answering mid-run (behind a forwarder, a process of its own,
/// that holds every byte from then on; the server itself stays up, so nothing is refused or
/// reset): its requests
/// hit the proxy's per-attempt deadline (`rollout.request_timeout_secs`) and are retried on
/// the other server, its weight syncs hit `rollout.weight_sync_timeout_secs`, and the run
/// finishes on the other, balanced — a bounded cost, not a hang.
#[test]
fn a_server_that_stops_answering_costs_request_deadlines_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let published = dir.join("published");
    std::fs::create_dir_all(&published).unwrap();
    let a = serve(&published, &dir.join("serve-a.err"));
    let b = serve(&published, &dir.join("serve-b.err"));
    let Some(slow) = SlowProxy::start(&b.url) else {
        eprintln!(
            "SKIPPED: a_server_that_stops_answering: no python3 to run scripts/slow_proxy.py"
        );
        return;
    };
    let config = write_config(dir, &[("sglang", &a.url), ("sglang", &slow.url)]);
    let mut run = train_with(
        dir,
        &config,
        &[
            "rollout.request_timeout_secs=3",
            "rollout.weight_sync_timeout_secs=3",
        ],
    );
    let t = Instant::now();
    while metrics(dir).is_empty() {
        assert!(run.try_wait().unwrap().is_none(), "the run ended early");
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no first step within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    slow.stop_answering();
    let since = Instant::now();
    let status = wait_exit(&mut run, Duration::from_secs(120), dir);
    let err = std::fs::read_to_string(dir.join("train.err")).unwrap_or_default();
    eprintln!(
        "finished {:?} after the server stopped answering",
        since.elapsed()
    );
    assert!(status.success(), "the run failed: {status}\n{err}");
    let m = metrics(dir);
    let col = |k: &str| {
        m.iter()
            .map(|s| s[k].as_f64().unwrap_or(f64::NAN))
            .collect::<Vec<_>>()
    };
    eprintln!(
        "wall_s {:?}; weight_sync_ms {:?}; failed {:?}",
        col("wall_s"),
        col("weight_sync_ms"),
        col("failed")
    );
    assert_eq!(m.len() as u64, STEPS, "every step recorded");
    let last = m.last().unwrap();
    crate::tiny_run::assert_balanced(last, "last step");
    // The held server missed the syncs after it went quiet; the other one served them all.
    assert_eq!(served_version(&a.url), STEPS);
    let synced_late = m.iter().skip(2).any(|s| {
        s["weight_sync_ms_by_backend"]
            .as_object()
            .is_some_and(|by| by.values().any(Value::is_null))
    });
    assert!(
        synced_late,
        "a sync after the stall skipped the quiet server: {m:?}"
    );
}
