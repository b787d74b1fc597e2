//! `rollflash serve` processes behind the proxy, under faults and load (real processes on
//! loopback, real time):
//! - one server is killed (SIGKILL) while it has requests in flight, in the middle of a
//!   controller run, and restarted on the same port: its requests are retried on the other
//!   server, no sample is trained twice, no token older than its sample is trained (the
//!   restarted server starts from its initial weights), and it rejoins with the current
//!   weights;
//! - a bounded soak: many concurrent requests through the proxy to two servers, zero errors,
//!   resident memory flat. The CI version runs 15 s; the long one is `#[ignore]`d
//!   (`ROLLFLASH_SOAK_SECS`, default 300).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use candle_core::{DType, Device};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollflash_core::buffer::{Batch, BufferConfig};
use rollflash_core::proxy::LeastLoaded;
use rollflash_core::{GenRequest, PauseMode, PolicyVersion, SamplingParams, Trajectory};
use rollflash_env::{Env, EnvError, Reset, Step};
use rollflash_model::config::ModelConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    Backend, BackendEntry, EnvFactory, EnvManager, EnvManagerConfig, HttpBackendConfig, LlmProxy,
    ProxyConfig, ProxyHandle, Renderer, SglangBackend, WeightUpdate,
};
use rollflash_trainer::{
    AsyncController, ControllerConfig, CoreConfig, Learner, LearnerError, StepStats,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Bound on anything that should happen "soon" in real time: a hang guard, not a timing
/// assertion.
const PATIENCE: Duration = Duration::from_secs(120);

/// A running `rollflash serve`; killed when dropped.
struct Serve {
    child: Child,
    port: u16,
}

impl Serve {
    /// Starts a server of the built-in model on `port` (0: any free one) that may load
    /// weights under `root`.
    async fn start(root: &Path, port: u16) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rollflash"))
            .args(["serve", "--threads", "1", "--max-running-requests", "16"])
            .args(["--port", &port.to_string()])
            .arg("--weights-root")
            .arg(root)
            .env_remove("ROLLFLASH_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn rollflash serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("serve printed nothing in time")
            .expect("read stdout")
            .expect("stdout closed before the address");
        let url = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        // Keep reading stdout so the server never writes into a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Serve { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn backend(&self) -> Arc<dyn Backend> {
        let cfg = HttpBackendConfig {
            // Fail over at once: the proxy, not the client, decides where to retry.
            max_retries: 0,
            connect_timeout: Duration::from_secs(2),
            ..HttpBackendConfig::new(self.url())
        };
        Arc::new(SglangBackend::new(cfg).unwrap())
    }

    fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id().expect("running"))
    }

    async fn weight_version(&self) -> String {
        let v: serde_json::Value = reqwest::get(format!("{}/get_model_info", self.url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["weight_version"].as_str().unwrap_or_default().to_string()
    }
}

/// Resident set size of a process, from `/proc/PID/status`.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// A checkpoint of the built-in model's architecture, for weight syncs.
fn write_checkpoint(dir: &Path) {
    let tok = Tokenizer::builtin();
    let cfg = ModelConfig::builtin_default(tok.vocab_size(), tok.eos_token_id().unwrap());
    let w = Weights::random(&cfg, 9, DType::F32, &Device::Cpu).unwrap();
    rollflash_model::hf::save_dir(dir, &cfg, &w, Some(&tok)).unwrap();
}

/// One step; the reward varies with the answer so groups are not all equal.
struct OneStep;

#[async_trait]
impl Env for OneStep {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        Ok(Reset {
            observation: format!("{}+{}=", seed % 50, seed % 7),
            info: Default::default(),
        })
    }
    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        Ok(Step {
            reward: (action.len() % 2) as f64,
            terminated: true,
            ..Default::default()
        })
    }
}

/// Checks each batch (no token older than its sample's start), records every trained
/// sample, and publishes the checkpoint as the next version.
struct DiskLearner {
    checkpoint: PathBuf,
    trained: Arc<Mutex<Vec<(u64, usize)>>>,
    hold: Option<Hold>,
}

/// Holds the learner inside one step until the test releases it. The controller syncs
/// weights only after a step, so while the learner is held no pause can start: a server
/// killed then has its requests running, not already preempted by an abort-mode pause.
struct Hold {
    /// The policy version whose step is held.
    at: PolicyVersion,
    entered: Arc<AtomicBool>,
    release: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Learner for DiskLearner {
    fn train(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError> {
        if self.hold.as_ref().is_some_and(|h| h.at == batch.version) {
            let hold = self.hold.take().unwrap();
            hold.entered.store(true, Ordering::SeqCst);
            hold.release
                .lock()
                .unwrap()
                .recv_timeout(PATIENCE)
                .expect("the test never released the learner");
        }
        let mut trained = self.trained.lock().unwrap();
        for g in &batch.groups {
            for (t, _) in &g.samples {
                for (v, m) in t.versions.iter().zip(&t.loss_mask) {
                    assert!(
                        *m == 0 || *v >= t.start_version,
                        "sample ({}, {}) started at {} has a token of version {v}",
                        t.seed,
                        t.index,
                        t.start_version
                    );
                }
                trained.push((t.seed, t.index));
            }
        }
        // Give generation time to overlap the step, as a real trainer would.
        std::thread::sleep(Duration::from_millis(100));
        Ok((
            WeightUpdate::Disk {
                path: self.checkpoint.clone(),
                version: PolicyVersion(batch.version.0 + 1),
            },
            StepStats::default(),
        ))
    }
}

/// Polls the proxy until `cond` holds on its metrics.
async fn until_metrics(
    h: &ProxyHandle,
    what: &str,
    cond: impl Fn(&rollflash_rollout::ProxyMetrics) -> bool,
) {
    tokio::time::timeout(PATIENCE, async {
        loop {
            if cond(&h.metrics().await.unwrap()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never happened: {what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_run_and_restarted_loses_nothing_and_rejoins() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpts");
    let ckpt = root.join("policy");
    write_checkpoint(&ckpt);
    let a = Serve::start(&root, 0).await;
    let b = Serve::start(&root, 0).await;
    let proxy = LlmProxy::start(
        vec![
            BackendEntry {
                backend: a.backend(),
                route: rollflash_rollout::WeightRoute::Direct,
                max_running_requests: 16,
                update_timeout: None,
            },
            BackendEntry {
                backend: b.backend(),
                route: rollflash_rollout::WeightRoute::Direct,
                max_running_requests: 16,
                update_timeout: None,
            },
        ],
        Box::new(LeastLoaded),
        ProxyConfig {
            health_probe_interval: Duration::from_millis(100),
            ..Default::default()
        },
    );
    let h = proxy.handle();
    let (vtx, vrx) = watch::channel(PolicyVersion(0));
    let envs = EnvManager::new(
        h.clone(),
        Arc::new(Tokenizer::builtin()),
        Renderer::Plain {
            separator: "\n".into(),
        },
        EnvManagerConfig {
            sampling: SamplingParams {
                max_new_tokens: 24,
                ..Default::default()
            },
            ..Default::default()
        },
        vrx,
    );
    let trained = Arc::new(Mutex::new(Vec::new()));
    let entered = Arc::new(AtomicBool::new(false));
    let (release_learner, release) = std::sync::mpsc::channel();
    let steps = 10;
    let ctl = AsyncController::new(
        ControllerConfig {
            core: CoreConfig {
                buffer: BufferConfig {
                    groups_per_batch: 4,
                    group_size: 4,
                    alpha: 1.0,
                    ..Default::default()
                },
                redundancy: 1,
                steps,
                seed: 1,
                ..ControllerConfig::default().core
            },
            pause_mode: PauseMode::Abort,
            ..Default::default()
        },
        h.clone(),
        envs,
        Arc::new(|| Ok(Box::new(OneStep) as Box<dyn Env>)) as EnvFactory,
        vtx,
        DiskLearner {
            checkpoint: ckpt.clone(),
            trained: Arc::clone(&trained),
            hold: Some(Hold {
                at: PolicyVersion(1),
                entered: Arc::clone(&entered),
                release: Mutex::new(release),
            }),
        },
    )
    .unwrap();
    let run = tokio::spawn(ctl.run());

    // Kill `a` while it has requests in flight, after the first publication, with the
    // learner held so that no weight sync pauses (and preempts) them first.
    until_metrics(&h, "a runs requests while step 2 trains", |m| {
        entered.load(Ordering::SeqCst) && m.backends[0].1 >= 2 && m.paused.is_none()
    })
    .await;
    let port = a.port;
    drop(a);
    until_metrics(&h, "a leaves rotation", |m| !m.backends[0].2).await;
    release_learner.send(()).unwrap();
    // Restarted on the same port, with its initial weights (version 0).
    let a = Serve::start(&root, port).await;
    assert_eq!(a.port, port);

    let report = tokio::time::timeout(PATIENCE, run)
        .await
        .expect("the run hung")
        .unwrap()
        .unwrap();
    assert_eq!(report.steps.len(), steps);
    let acc = report.accounting;
    assert!(acc.balanced(), "{acc:?}");
    let trained = trained.lock().unwrap().clone();
    assert_eq!(trained.len() as u64, acc.trained);
    let unique: HashSet<_> = trained.iter().collect();
    assert_eq!(unique.len(), trained.len(), "a sample was trained twice");

    // `a` rejoins, caught up to the final weights by the proxy's probe.
    until_metrics(&h, "a rejoins", |m| m.backends[0].2).await;
    assert_eq!(a.weight_version().await, steps.to_string());
    assert_eq!(b.weight_version().await, steps.to_string());
    let (_, outs) = h
        .generate_n(
            Tokenizer::builtin().encode("1+2=", true).unwrap(),
            SamplingParams {
                max_new_tokens: 4,
                ..Default::default()
            },
            PolicyVersion(steps as u64),
            16,
            rollflash_rollout::Replication::Expand,
        )
        .await;
    for o in outs {
        let o = o.unwrap();
        assert!(o
            .output
            .versions
            .iter()
            .all(|v| *v == PolicyVersion(steps as u64)));
    }
    let c = proxy.shutdown().await.unwrap();
    eprintln!("kill/restart run: {acc:?}, proxy {c:?}");
    assert!(c.retries > 0, "a's requests were retried: {c:?}");
    assert_eq!(c.failed, 0, "{c:?}");
}

/// What one soak run saw.
#[derive(Debug)]
struct Soak {
    requests: u64,
    errors: u64,
    /// (seconds since start, RSS of server a, server b, this process) in KiB.
    rss: Vec<(u64, u64, u64, u64)>,
}

/// Drives `concurrency` callers through the proxy to two servers for `secs` seconds,
/// sampling resident memory every second.
async fn soak(secs: u64, concurrency: usize) -> Soak {
    let tmp = tempfile::tempdir().unwrap();
    let a = Serve::start(tmp.path(), 0).await;
    let b = Serve::start(tmp.path(), 0).await;
    let proxy = LlmProxy::start(
        vec![
            BackendEntry {
                backend: a.backend(),
                route: rollflash_rollout::WeightRoute::Direct,
                max_running_requests: 32,
                update_timeout: None,
            },
            BackendEntry {
                backend: b.backend(),
                route: rollflash_rollout::WeightRoute::Direct,
                max_running_requests: 32,
                update_timeout: None,
            },
        ],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    let mut callers = tokio::task::JoinSet::new();
    for c in 0..concurrency {
        let h = h.clone();
        callers.spawn(async move {
            let mut rng = ChaCha8Rng::seed_from_u64(c as u64);
            let (mut ok, mut err) = (0u64, 0u64);
            while tokio::time::Instant::now() < deadline {
                let len = rng.random_range(1..64);
                let prompt = (0..len).map(|_| rng.random_range(3..90)).collect();
                let req = GenRequest::new(
                    h.next_id(),
                    prompt,
                    SamplingParams {
                        max_new_tokens: rng.random_range(1..16),
                        ..Default::default()
                    },
                );
                match h.generate(req).await {
                    Ok(_) => ok += 1,
                    Err(e) => {
                        eprintln!("soak error: {e}");
                        err += 1;
                    }
                }
            }
            (ok, err)
        });
    }
    let me = std::process::id();
    let mut rss = Vec::new();
    let start = tokio::time::Instant::now();
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push((
            start.elapsed().as_secs(),
            a.rss_kib(),
            b.rss_kib(),
            rss_kib(me),
        ));
    }
    let (mut requests, mut errors) = (0, 0);
    while let Some(r) = callers.join_next().await {
        let (ok, err) = r.unwrap();
        requests += ok + err;
        errors += err;
    }
    let c = proxy.shutdown().await.unwrap();
    assert_eq!(c.failed, 0, "{c:?}");
    Soak {
        requests,
        errors,
        rss,
    }
}

/// Memory is flat: from the end of the first quarter (allocator pools and caches warmed)
/// to the end, no process grows by more than a quarter plus 16 MiB. A leak of even a few
/// hundred bytes per request over these request counts would break it.
fn assert_flat(s: &Soak) {
    assert!(s.rss.len() >= 4, "{s:?}");
    let warm = s.rss[s.rss.len() / 4];
    let last = s.rss[s.rss.len() - 1];
    for (what, w, l) in [
        ("server a", warm.1, last.1),
        ("server b", warm.2, last.2),
        ("proxy (this process)", warm.3, last.3),
    ] {
        assert!(
            l <= w + w / 4 + 16 * 1024,
            "{what}: RSS grew from {w} KiB to {l} KiB: {s:?}"
        );
    }
}

/// The soak's own process: "this process" in [`Soak::rss`] must hold the proxy and its
/// callers alone, not the other tests this binary runs at the same time (a LoRA training run
/// beside it once grew it by 150 MB). So the test runs itself again, filtered to this one
/// test, with `SOAK_CHILD` set; the child soaks and prints its numbers, the parent checks.
const SOAK_CHILD: &str = "ROLLFLASH_SOAK_CHILD";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_short_has_no_errors_and_flat_memory() {
    if std::env::var_os(SOAK_CHILD).is_some() {
        let s = soak(15, 128).await;
        println!("SOAK {} {}", s.requests, s.errors);
        for (t, a, b, me) in &s.rss {
            println!("RSS {t} {a} {b} {me}");
        }
        return;
    }
    let child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "serve_faults::soak_short_has_no_errors_and_flat_memory",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SOAK_CHILD, "1")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    // A 15 s soak; a child that hangs is killed at the deadline, not waited on forever.
    let out = tokio::time::timeout(Duration::from_secs(300), child)
        .await
        .expect("the soak process ended within 300 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the soak process failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nums = |line: &str| -> Vec<u64> {
        line.split_whitespace()
            .skip(1)
            .map(|n| n.parse().unwrap())
            .collect()
    };
    // The harness prints the test's name before its first output, on the same line.
    let head = stdout
        .lines()
        .find_map(|l| l.find("SOAK ").map(|i| &l[i..]))
        .unwrap_or_else(|| panic!("no SOAK line: {stdout}"));
    let (requests, errors) = (nums(head)[0], nums(head)[1]);
    let rss = stdout
        .lines()
        .filter(|l| l.starts_with("RSS "))
        .map(|l| {
            let v = nums(l);
            (v[0], v[1], v[2], v[3])
        })
        .collect();
    let s = Soak {
        requests,
        errors,
        rss,
    };
    eprintln!(
        "soak 15 s x 128 callers: {} requests, {} errors, RSS KiB (t, a, b, proxy) first {:?} last {:?}",
        s.requests,
        s.errors,
        s.rss.first(),
        s.rss.last()
    );
    assert_eq!(s.errors, 0);
    assert!(s.requests > 0);
    assert_flat(&s);
}

/// The long soak: `ROLLFLASH_SOAK_SECS=600 cargo test --release -p rollflash --test it
/// soak_long -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long; run by hand (see RELIABILITY.md)"]
async fn soak_long() {
    let secs = std::env::var("ROLLFLASH_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let s = soak(secs, 256).await;
    for (t, a, b, me) in &s.rss {
        eprintln!("t={t}s rss_kib a={a} b={b} proxy={me}");
    }
    eprintln!(
        "soak {secs} s x 256 callers: {} requests, {} errors",
        s.requests, s.errors
    );
    assert_eq!(s.errors, 0);
    assert_flat(&s);
}
