//! `rollflash bench-proxy`: the control plane's own cost. Requests go through the LLMProxy to
//! no-compute backends, so what is measured is queueing, routing and task hand-offs alone:
//! requests/s, the latency the proxy adds (p50/p99), and resident memory at high concurrency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use rollflash_core::proxy::LeastLoaded;
use rollflash_core::{GenRequest, SamplingParams};
use rollflash_rollout::{Backend, BackendEntry, InstantBackend, LlmProxy, ProxyConfig};

#[derive(Debug, Args)]
pub struct BenchProxyArgs {
    /// Concurrent callers (each waits for its answer before sending the next request).
    #[arg(long, value_delimiter = ',', default_value = "1,100,10000")]
    concurrency: Vec<usize>,
    /// Requests per concurrency level.
    #[arg(long, default_value_t = 200_000)]
    requests: usize,
    /// Backends behind the proxy.
    #[arg(long, default_value_t = 4)]
    backends: usize,
    /// Admission limit per backend.
    #[arg(long, default_value_t = 4096)]
    max_running: usize,
    /// Tokens each (instant) response carries.
    #[arg(long, default_value_t = 16)]
    tokens: usize,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Go through one HTTP server on loopback (the `rollflash serve` server over an instant
    /// backend, reached by the SGLang-native client) instead of calling backends in process.
    #[arg(long)]
    http: bool,
}

/// One measured level.
#[derive(Debug, Clone)]
pub struct Level {
    pub concurrency: usize,
    pub requests: usize,
    pub secs: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub rss_mib: f64,
}

pub fn run(a: BenchProxyArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads.max(1))
        .enable_all()
        .build()?;
    println!(
        "proxy control plane{}: {} instant backends × max_running {}, {} worker threads, {} tokens per response",
        if a.http { " through one HTTP server on loopback" } else { "" },
        if a.http { 1 } else { a.backends },
        a.max_running,
        a.threads,
        a.tokens
    );
    println!(
        "{:>12} {:>10} {:>12} {:>12} {:>12} {:>10}",
        "concurrency", "requests", "requests/s", "p50 (µs)", "p99 (µs)", "RSS (MiB)"
    );
    for &c in &a.concurrency {
        let level = rt.block_on(measure(&a, c))?;
        println!(
            "{:>12} {:>10} {:>12.0} {:>12.1} {:>12.1} {:>10.1}",
            level.concurrency,
            level.requests,
            level.requests as f64 / level.secs,
            level.p50.as_secs_f64() * 1e6,
            level.p99.as_secs_f64() * 1e6,
            level.rss_mib
        );
    }
    Ok(())
}

async fn measure(a: &BenchProxyArgs, concurrency: usize) -> Result<Level> {
    let mut server = None;
    let backends: Vec<BackendEntry> = if a.http {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let state = rollflash_rollout::ServerState {
            backend: Arc::new(InstantBackend::new("instant")),
            tokenizer: None,
            chat_template: None,
            config: rollflash_rollout::ServerConfig::default(),
            adapters: None,
        };
        let task = tokio::spawn(rollflash_rollout::serve(listener, state, async move {
            let _ = stop_rx.await;
        }));
        server = Some((stop_tx, task));
        let client =
            rollflash_rollout::SglangBackend::new(rollflash_rollout::HttpBackendConfig::new(url))?;
        vec![BackendEntry {
            backend: Arc::new(client) as Arc<dyn Backend>,
            route: rollflash_rollout::WeightRoute::Direct,
            max_running_requests: a.max_running,
            update_timeout: None,
        }]
    } else {
        (0..a.backends.max(1))
            .map(|i| BackendEntry {
                backend: Arc::new(InstantBackend::new(format!("instant-{i}"))) as Arc<dyn Backend>,
                route: rollflash_rollout::WeightRoute::Direct,
                max_running_requests: a.max_running,
                update_timeout: None,
            })
            .collect()
    };
    let proxy = LlmProxy::start(backends, Box::new(LeastLoaded), ProxyConfig::default());
    let h = proxy.handle();
    let concurrency = concurrency.max(1);
    let per_caller = a.requests.div_ceil(concurrency).max(1);
    let params = SamplingParams {
        max_new_tokens: a.tokens.max(1),
        ..Default::default()
    };
    let start = Instant::now();
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let h = h.clone();
        let params = params.clone();
        callers.spawn(async move {
            let mut lat = Vec::with_capacity(per_caller);
            for _ in 0..per_caller {
                let req = GenRequest::new(h.next_id(), vec![1, 2, 3, 4], params.clone());
                let t = Instant::now();
                h.generate(req).await?;
                lat.push(t.elapsed());
            }
            Ok::<_, rollflash_rollout::ProxyError>(lat)
        });
    }
    // Resident memory with every caller's request in flight or queued.
    tokio::task::yield_now().await;
    let rss_mib = rss_mib();
    let mut all = Vec::with_capacity(per_caller * concurrency);
    while let Some(r) = callers.join_next().await {
        all.extend(r??);
    }
    let secs = start.elapsed().as_secs_f64();
    proxy.shutdown().await?;
    if let Some((stop, task)) = server {
        let _ = stop.send(());
        let _ = task.await;
    }
    all.sort_unstable();
    let q = |p: f64| all[((p * all.len() as f64) as usize).min(all.len() - 1)];
    Ok(Level {
        concurrency,
        requests: all.len(),
        secs,
        p50: q(0.5),
        p99: q(0.99),
        rss_mib: rss_mib.max(self::rss_mib()),
    })
}

/// Resident set size of this process, from `/proc/self/status` (0 where unavailable).
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
