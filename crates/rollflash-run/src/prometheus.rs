//! The Prometheus endpoint of a training run (`[metrics] prometheus = "127.0.0.1:9400"` or
//! `--metrics-addr`): `GET /metrics` in the text exposition format 0.0.4, with the latest
//! step's gauges, the cumulative sample accounting as counters, and the LLM proxy's queue,
//! request counters and token throughput.

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use rollflash_rollout::ProxyHandle;
use tokio::sync::oneshot;

use rollflash_trainer::StepRecord;

/// The values the endpoint shows, updated by the run after every step.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    pub steps_done: u64,
    pub version: u64,
    pub reward: f64,
    pub accuracy: f64,
    pub loss: f64,
    pub samples_per_s: f64,
    pub tokens_per_s: f64,
    pub staleness_max: u64,
    pub weight_sync_ms: f64,
    pub accounting: rollflash_core::buffer::Accounting,
}

impl Gauges {
    /// Takes the values of a just-published step.
    pub fn update(&mut self, r: &StepRecord) {
        let wall = r.wall.as_secs_f64().max(1e-9);
        self.steps_done = r.step as u64 + 1;
        self.version = r.version.0 + 1;
        self.reward = r.mean_reward;
        self.accuracy = r.accuracy;
        self.loss = r.stats.loss;
        self.samples_per_s = r.samples as f64 / wall;
        self.tokens_per_s = r.tokens as f64 / wall;
        self.staleness_max = r.staleness_max;
        self.weight_sync_ms = r.sync.total().as_secs_f64() * 1e3;
        self.accounting = r.accounting;
    }
}

/// Shared between the run (writer, once per step) and the server (reader, per scrape):
/// a plain mutex is right for a copy of a few numbers, held for microseconds.
pub type SharedGauges = Arc<Mutex<Gauges>>;

/// The proxy whose queue and counters a scrape adds, once the run has one: the endpoint
/// starts with the run, before the warm-up builds the rollout plane. A plain mutex around
/// a handle clone, taken for nanoseconds per scrape.
type ProxySlot = Arc<Mutex<Option<ProxyHandle>>>;

#[derive(Clone)]
struct AppState {
    gauges: SharedGauges,
    proxy: ProxySlot,
}

/// A running endpoint; stop it with [`PromServer::shutdown`]. Dropped without it (a run
/// that fails on the way), it still tells its task to stop.
#[derive(Debug)]
pub struct PromServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    proxy: ProxySlot,
}

impl Drop for PromServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl PromServer {
    /// Binds `addr` and serves `/metrics` from `gauges` (and `proxy`, while it runs; see
    /// [`PromServer::set_proxy`]).
    pub async fn start(
        addr: SocketAddr,
        gauges: SharedGauges,
        proxy: Option<ProxyHandle>,
    ) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let proxy: ProxySlot = Arc::new(Mutex::new(proxy));
        let app = Router::new()
            .route("/metrics", get(scrape))
            .with_state(AppState {
                gauges,
                proxy: Arc::clone(&proxy),
            });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                tracing::warn!(error = %rollflash_core::error_chain(&e), "prometheus endpoint stopped");
            }
        });
        Ok(PromServer {
            addr,
            stop: Some(stop),
            task,
            proxy,
        })
    }

    /// The proxy whose metrics scrapes add from now on (`None`: none, once it is shut down).
    pub fn set_proxy(&self, proxy: Option<ProxyHandle>) {
        match self.proxy.lock() {
            Ok(mut p) => *p = proxy,
            Err(poisoned) => *poisoned.into_inner() = proxy,
        }
    }

    /// The bound address (the port is chosen by the OS when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and waits for the server task.
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }
}

async fn scrape(State(st): State<AppState>) -> impl IntoResponse {
    let g = match st.gauges.lock() {
        Ok(g) => g.clone(),
        // A panic while updating leaves numbers that are still numbers.
        Err(p) => p.into_inner().clone(),
    };
    // The handle is cloned out so the lock is not held across the proxy's reply.
    let handle = match st.proxy.lock() {
        Ok(p) => p.clone(),
        Err(p) => p.into_inner().clone(),
    };
    let proxy = match handle {
        Some(p) => p.metrics().await.ok(),
        None => None,
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render(&g, proxy.as_ref()),
    )
}

/// The exposition text.
// Long on purpose: a flat list of metrics in exposition order, each one `metric` call or one
// row of a table; split, the order of the page would be spread over several functions.
pub fn render(g: &Gauges, proxy: Option<&rollflash_rollout::ProxyMetrics>) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(out, "# HELP rollflash_{name} {help}");
        let _ = writeln!(out, "# TYPE rollflash_{name} {kind}");
        let _ = writeln!(out, "rollflash_{name} {}", fmt(value));
    };
    metric(
        "steps_total",
        "counter",
        "Training steps completed.",
        g.steps_done as f64,
    );
    metric(
        "policy_version",
        "gauge",
        "Current policy version.",
        g.version as f64,
    );
    metric(
        "reward",
        "gauge",
        "Mean reward of the last batch.",
        g.reward,
    );
    metric(
        "accuracy",
        "gauge",
        "Success fraction of the last batch.",
        g.accuracy,
    );
    metric("loss", "gauge", "Loss of the last step.", g.loss);
    metric(
        "samples_per_second",
        "gauge",
        "Trained samples per second over the last step.",
        g.samples_per_s,
    );
    metric(
        "tokens_per_second",
        "gauge",
        "Trained tokens per second over the last step.",
        g.tokens_per_s,
    );
    metric(
        "staleness_max",
        "gauge",
        "Largest staleness (versions) in the last batch.",
        g.staleness_max as f64,
    );
    metric(
        "weight_sync_milliseconds",
        "gauge",
        "Duration of the last weight sync.",
        g.weight_sync_ms,
    );
    let a = g.accounting;
    for (name, v, help) in [
        ("samples_started_total", a.started, "Samples started."),
        ("samples_trained_total", a.trained, "Samples trained on."),
        (
            "samples_filtered_total",
            a.filtered,
            "Samples filtered out.",
        ),
        (
            "samples_dropped_stale_total",
            a.dropped_stale,
            "Samples dropped as older than alpha.",
        ),
        ("samples_aborted_total", a.aborted, "Samples aborted."),
        ("samples_failed_total", a.failed, "Samples failed."),
    ] {
        metric(name, "counter", help, v as f64);
    }
    metric(
        "samples_running",
        "gauge",
        "Samples generating.",
        a.running as f64,
    );
    metric(
        "samples_buffered",
        "gauge",
        "Samples waiting for a batch.",
        a.buffered as f64,
    );
    if let Some(p) = proxy {
        metric(
            "proxy_queue_depth",
            "gauge",
            "Requests queued in the proxy.",
            p.queue_depth as f64,
        );
        let c = &p.counters;
        for (name, v, help) in [
            (
                "proxy_requests_submitted_total",
                c.submitted,
                "Requests submitted.",
            ),
            (
                "proxy_requests_completed_total",
                c.completed,
                "Requests completed.",
            ),
            (
                "proxy_requests_aborted_total",
                c.aborted,
                "Requests aborted.",
            ),
            ("proxy_requests_failed_total", c.failed, "Requests failed."),
            ("proxy_retries_total", c.retries, "Request retries."),
            (
                "proxy_request_timeouts_total",
                c.timeouts,
                "Generation attempts cancelled past their deadline.",
            ),
            (
                "proxy_preempted_total",
                c.preempted,
                "Requests re-queued by a weight sync in abort mode.",
            ),
        ] {
            metric(name, "counter", help, v as f64);
        }
        metric(
            "proxy_tokens_total",
            "counter",
            "Generated tokens.",
            p.tokens as f64,
        );
        metric(
            "proxy_tokens_per_second",
            "gauge",
            "Generated tokens per second since the proxy started.",
            p.tokens_per_sec,
        );
        let _ = writeln!(
            out,
            "# HELP rollflash_backend_running Requests running per backend."
        );
        let _ = writeln!(out, "# TYPE rollflash_backend_running gauge");
        for (name, running, _) in &p.backends {
            let _ = writeln!(
                out,
                "rollflash_backend_running{{backend=\"{}\"}} {running}",
                escape(name)
            );
        }
    }
    out
}

/// Prometheus' float format: `NaN`, `+Inf`, `-Inf` spelled its way.
fn fmt(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Label values escape backslash, quote and newline.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
