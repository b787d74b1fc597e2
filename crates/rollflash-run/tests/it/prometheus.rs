//! The Prometheus endpoint: scraped over HTTP, it serves the text exposition format 0.0.4
//! with the last step's gauges, the sample accounting and the proxy's metrics; it is up
//! from the run's start, before the warm-up.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rollflash_core::buffer::Accounting;
use rollflash_core::proxy::LeastLoaded;
use rollflash_core::PolicyVersion;
use rollflash_rollout::{Backend, BackendEntry, InstantBackend, LlmProxy, ProxyConfig};
use rollflash_run::prometheus::{Gauges, PromServer};
use rollflash_trainer::{StepRecord, StepStats};

fn record() -> StepRecord {
    StepRecord {
        step: 4,
        version: PolicyVersion(4),
        samples: 32,
        tokens: 640,
        mean_reward: 0.75,
        accuracy: 0.5,
        sampled_entropy: 1.2,
        staleness: 0.5,
        staleness_hist: vec![(0, 16), (1, 16)],
        staleness_max: 1,
        wall: Duration::from_secs(2),
        train: Duration::from_secs(1),
        wait: Duration::ZERO,
        rollout_idle: Duration::ZERO,
        turn_generate: Duration::ZERO,
        turn_env: Duration::ZERO,
        elapsed: Duration::from_secs(10),
        sync: Default::default(),
        stats: StepStats {
            loss: 0.25,
            metrics: Vec::new(),
            behav_kl_by_backend: Vec::new(),
        },
        accounting: Accounting {
            started: 200,
            trained: 160,
            aborted: 8,
            running: 32,
            ..Default::default()
        },
    }
}

/// The value of an unlabelled sample line `name value`.
fn value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_shows_the_step_the_accounting_and_the_proxy() {
    let proxy = LlmProxy::start(
        vec![BackendEntry {
            backend: Arc::new(InstantBackend::with_delay("i0", Duration::ZERO)) as Arc<dyn Backend>,
            route: rollflash_rollout::WeightRoute::Direct,
            max_running_requests: 4,
            update_timeout: None,
        }],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let gauges = Arc::new(Mutex::new(Gauges::default()));
    gauges.lock().unwrap().update(&record());
    let server = PromServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Arc::clone(&gauges),
        Some(proxy.handle()),
    )
    .await
    .unwrap();
    assert!(server.addr().ip().is_loopback());
    let resp = reqwest::get(format!("http://{}/metrics", server.addr()))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let text = resp.text().await.unwrap();
    assert_eq!(value(&text, "rollflash_steps_total"), 5.0);
    assert_eq!(value(&text, "rollflash_policy_version"), 5.0);
    assert_eq!(value(&text, "rollflash_reward"), 0.75);
    assert_eq!(value(&text, "rollflash_samples_per_second"), 16.0);
    assert_eq!(value(&text, "rollflash_staleness_max"), 1.0);
    assert_eq!(value(&text, "rollflash_samples_started_total"), 200.0);
    assert_eq!(value(&text, "rollflash_samples_trained_total"), 160.0);
    assert_eq!(value(&text, "rollflash_samples_running"), 32.0);
    assert_eq!(value(&text, "rollflash_proxy_queue_depth"), 0.0);
    assert!(
        text.contains("rollflash_backend_running{backend=\"i0\"} 0"),
        "{text}"
    );
    // Every sample line is preceded by its HELP and TYPE.
    assert!(text.contains("# TYPE rollflash_samples_trained_total counter"));
    assert!(text.contains("# TYPE rollflash_reward gauge"));
    server.shutdown().await;
    proxy.shutdown().await.unwrap();
}

/// The endpoint comes up with the run, before the warm-up: a run stopped at its first
/// warm-up step (the stop flag is set before it starts) has already bound it and told its
/// address, and ends as interrupted during the warm-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_is_up_before_the_warm_up() {
    use rollflash_run::config::TrainConfig;
    use rollflash_run::pipeline::{self, PipelineError, RunOptions};

    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig::load(
        None,
        &[
            format!("output_dir={:?}", dir.path().display().to_string()),
            "warmup.steps=5".into(),
            "metrics.progress=false".into(),
        ],
    )
    .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stop = rollflash_trainer::StopFlag::new();
    stop.stop();
    let out = pipeline::run_with(
        cfg,
        RunOptions {
            metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
            metrics_bound: Some(tx),
            stop,
            ..Default::default()
        },
    )
    .await;
    match out {
        Err(PipelineError::Interrupted { phase }) => assert_eq!(phase, "the warm-up"),
        other => panic!("expected an interruption in the warm-up, got {other:?}"),
    }
    let addr = rx.await.expect("the endpoint's address before the warm-up");
    assert!(addr.ip().is_loopback());
}
