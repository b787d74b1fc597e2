//! The dashboard's HTTP server (axum): the page and its assets, embedded in the binary, and
//! JSON routes the page polls. Every route reads the run directory afresh, so the same
//! server shows a run while it runs (`rollflash train --dashboard`) and after it finished
//! (`rollflash dashboard RUN_DIR`); [`Live`] adds what only the running process knows
//! (its phase, the proxy's queue and running requests).
//!
//! Routes: `GET /` (the page), `/app.js`, `/style.css`, `/api/metrics` (`{"steps": [...],
//! "summary": ...}`), `/api/timeline` (`{"events": [...]}`, `?since_ms=` for the newer
//! ones), `/api/trajectories` (`{"trajectories": [...], "total": n}`, newest first;
//! `?min_reward=`, `?max_reward=`, `?limit=`, default 50), `/api/live`. A file that does not
//! parse is a 500 whose `error` names the file and line.
//!
//! Access: loopback by default. An address beyond loopback is refused without an API key;
//! with one, every route wants `Authorization: Bearer KEY` or `?key=KEY` (the page passes on
//! the `key` of its own address, so `http://host:port/?key=KEY` opens it in a browser).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::files::{FileError, RunDir};

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE_CSS: &str = include_str!("../assets/style.css");

/// How long shutdown waits for open connections before it drops them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The dashboard could not start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("dashboard {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Beyond loopback without a key: anyone on the network could read the run.
    #[error(
        "dashboard {addr} is not a loopback address: set an API key (dashboard.api_key_env, \
         or ROLLFLASH_API_KEY) or bind 127.0.0.1"
    )]
    NeedsApiKey { addr: SocketAddr },
}

/// What the running process adds to the files: a snapshot of the rollout plane.
#[async_trait]
pub trait LiveSource: Send + Sync {
    /// A JSON object (`queue_depth`, `backends: [{name, running, in_rotation}]`, …).
    async fn snapshot(&self) -> Value;
}

#[derive(Default)]
struct LiveInner {
    phase: String,
    eval_before: Option<Value>,
    source: Option<Arc<dyn LiveSource>>,
}

/// The running process's side of the page: its phase, the evaluation before RL, and the
/// rollout plane while it exists. Cheap to clone; a finished run's dashboard has none.
#[derive(Clone, Default)]
pub struct Live(Arc<Mutex<LiveInner>>);

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

impl Live {
    fn with<R>(&self, f: impl FnOnce(&mut LiveInner) -> R) -> R {
        // A std mutex over a few fields, never held across an await.
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// What the run is doing (`warm-up`, `evaluation`, `rl`, `done`).
    pub fn set_phase(&self, phase: &str) {
        self.with(|l| l.phase = phase.to_string());
    }

    /// The held-out evaluation before RL (the `summary.json` has both once the run ends).
    pub fn set_eval_before(&self, eval: Option<Value>) {
        self.with(|l| l.eval_before = eval);
    }

    /// The rollout plane to snapshot; `None` once it is shut down.
    pub fn set_source(&self, source: Option<Arc<dyn LiveSource>>) {
        self.with(|l| l.source = source);
    }
}

/// Where and what to serve.
#[derive(Debug, Clone)]
pub struct DashboardConfig {
    pub addr: SocketAddr,
    /// Required beyond loopback.
    pub api_key: Option<String>,
    pub run_dir: PathBuf,
}

#[derive(Clone)]
struct AppState {
    dir: RunDir,
    live: Live,
    /// Whether the process serving is the run itself.
    running: bool,
}

/// A serving dashboard; [`Dashboard::shutdown`] stops it.
#[derive(Debug)]
pub struct Dashboard {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Dashboard {
    /// Binds and serves `cfg.run_dir`. `live` is the running process's state (`None` for a
    /// finished run).
    pub async fn start(cfg: DashboardConfig, live: Option<Live>) -> Result<Self, DashboardError> {
        if !cfg.addr.ip().is_loopback() && cfg.api_key.is_none() {
            return Err(DashboardError::NeedsApiKey { addr: cfg.addr });
        }
        let listener = tokio::net::TcpListener::bind(cfg.addr)
            .await
            .map_err(|source| DashboardError::Bind {
                addr: cfg.addr,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| DashboardError::Bind {
                addr: cfg.addr,
                source,
            })?;
        let state = AppState {
            dir: RunDir::new(cfg.run_dir),
            running: live.is_some(),
            live: live.unwrap_or_default(),
        };
        let key = Arc::new(cfg.api_key);
        let app = router(state).layer(middleware::from_fn(move |req, next| {
            let key = Arc::clone(&key);
            async move { check_key(key.as_deref(), req, next).await }
        }));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                tracing::warn!(error = %rollflash_core::error_chain(&e), "dashboard stopped");
            }
        });
        Ok(Dashboard {
            addr,
            stop: Some(stop),
            task,
        })
    }

    /// The bound address (the OS picks the port when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving; waits a moment for open requests, then drops them.
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route("/api/metrics", get(metrics))
        .route("/api/timeline", get(timeline))
        .route("/api/trajectories", get(trajectories))
        .route("/api/live", get(live))
        .with_state(state)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn check_key(key: Option<&str>, req: Request, next: Next) -> Response {
    let Some(key) = key else {
        return next.run(req).await;
    };
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let query = req.uri().query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("key="))
            .map(str::to_string)
    });
    let ok = |k: &str| rollflash_core::auth::constant_time_eq(k.as_bytes(), key.as_bytes());
    if bearer.is_some_and(ok) || query.as_deref().is_some_and(ok) {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "this dashboard wants its API key: ?key=KEY or Authorization: Bearer KEY"})),
        )
            .into_response()
    }
}

/// A file that cannot be read or parsed, as the page shows it.
fn file_error(e: FileError) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({ "error": rollflash_core::error_chain(&e) })),
    )
        .into_response()
}

async fn metrics(State(st): State<AppState>) -> Response {
    let read = move || -> Result<Value, FileError> {
        Ok(json!({ "steps": st.dir.metrics()?, "summary": st.dir.summary()? }))
    };
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(e)) => file_error(e),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            rollflash_core::error_chain(&e),
        )
            .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct TimelineQuery {
    since_ms: Option<u64>,
}

async fn timeline(State(st): State<AppState>, Query(q): Query<TimelineQuery>) -> Response {
    match tokio::task::spawn_blocking(move || st.dir.timeline()).await {
        Ok(Ok(mut events)) => {
            if let Some(since) = q.since_ms {
                events.retain(|e| e.end_ms >= since);
            }
            Json(json!({ "events": events })).into_response()
        }
        Ok(Err(e)) => file_error(e),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            rollflash_core::error_chain(&e),
        )
            .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct TrajectoryQuery {
    min_reward: Option<f64>,
    max_reward: Option<f64>,
    limit: Option<usize>,
}

async fn trajectories(State(st): State<AppState>, Query(q): Query<TrajectoryQuery>) -> Response {
    match tokio::task::spawn_blocking(move || st.dir.trajectories()).await {
        Ok(Ok(all)) => {
            let total = all.len();
            let list: Vec<_> = all
                .into_iter()
                .rev()
                .filter(|t| q.min_reward.is_none_or(|m| t.reward >= m))
                .filter(|t| q.max_reward.is_none_or(|m| t.reward <= m))
                .take(q.limit.unwrap_or(50))
                .collect();
            Json(json!({ "trajectories": list, "total": total })).into_response()
        }
        Ok(Err(e)) => file_error(e),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            rollflash_core::error_chain(&e),
        )
            .into_response(),
    }
}

/// Bound on the live snapshot: a proxy that does not answer leaves it out.
const SNAPSHOT_DEADLINE: Duration = Duration::from_secs(1);

async fn live(State(st): State<AppState>) -> Response {
    let (phase, eval_before, source) = st
        .live
        .with(|l| (l.phase.clone(), l.eval_before.clone(), l.source.clone()));
    let rollout = match source {
        Some(s) => tokio::time::timeout(SNAPSHOT_DEADLINE, s.snapshot())
            .await
            .ok(),
        None => None,
    };
    Json(json!({
        "running": st.running,
        "phase": if st.running { phase } else { "finished".into() },
        "eval_before": eval_before,
        "rollout": rollout,
        "now_ms": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }))
    .into_response()
}
