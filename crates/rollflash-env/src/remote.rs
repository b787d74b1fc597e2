//! Remote environments: the HTTP protocol, the server behind `rollflash env-serve`, and the `Env` that talks to it.
//!
//! Environments that are slow, need isolation, or live on other machines sit behind a small
//! JSON-over-HTTP protocol. [`serve`] runs the server; [`RemoteEnv`] is an [`Env`] that
//! forwards `reset`/`step` to it, so rollout code cannot tell the difference.
//!
//! # Protocol
//!
//! All bodies are JSON; every request except `GET /health` needs
//! `Authorization: Bearer <key>` when the server has an API key.
//!
//! | request | body | reply |
//! |---|---|---|
//! | `POST /envs` | an [`EnvSpec`], e.g. `{"name": "frozen_lake", "map": "8x8"}` | `201 {"env_id": "1"}` |
//! | `POST /envs/{id}/reset` | `{"seed": 7}` | `{"observation": "...", "info": {...}}` |
//! | `POST /envs/{id}/step` | `{"action": "Left"}` | `{"observation", "reward", "terminated", "truncated", "info"}` |
//! | `DELETE /envs/{id}` | none | `204` |
//! | `GET /health` | none | `{"status": "ok", "envs": 3}` |
//!
//! Errors are `{"error": {"kind": ..., "message": ...}}` with these statuses and kinds:
//! 400 `bad_request` (malformed JSON, unknown environment name or field, invalid config),
//! 401 `unauthorized`, 404 `not_found` (unknown environment id or route), 405
//! `method_not_allowed` (a known route with another method),
//! 409 `out_of_order` (step before reset or after the episode ended), 413 `too_large` (body
//! over the limit, 1 MiB by default), 500 `env_failed` / `garbage` (the environment failed),
//! 503 `capacity` (the live-environment cap is reached).
//!
//! Each environment lives until `DELETE`, until the server stops, or — with an idle timeout —
//! until a `POST /envs` finds it unused for longer than the timeout. Calls on one environment
//! are serialised; different environments run concurrently.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::env::{Env, EnvError, Info, OutOfOrder, RemoteFailure, Reset, Step};
use crate::envs::{make_env, EnvConfig, EnvSpec};
use crate::verify::python::PythonPool;

/// Default request body limit: far above any action or spec, far below memory trouble.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// Reply of `POST /envs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateResponse {
    /// The new environment's id, used in the other routes.
    pub env_id: String,
}

/// Body of `POST /envs/{id}/reset`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResetRequest {
    pub seed: u64,
}

/// Reply of `POST /envs/{id}/reset`: [`Reset`] on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResetResponse {
    pub observation: String,
    #[serde(default)]
    pub info: Info,
}

/// Body of `POST /envs/{id}/step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRequest {
    pub action: String,
}

/// Reply of `POST /envs/{id}/step`: [`Step`] on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepResponse {
    pub observation: String,
    pub reward: f64,
    pub terminated: bool,
    pub truncated: bool,
    #[serde(default)]
    pub info: Info,
}

/// Reply of `GET /health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthResponse {
    pub status: String,
    /// Live environments.
    pub envs: usize,
}

/// An error reply: `{"error": {"kind", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The inside of [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Machine-readable class (see the module docs).
    pub kind: String,
    /// For people.
    pub message: String,
}

/// Configuration of the environment server.
#[derive(Clone)]
pub struct EnvServerConfig {
    /// When set, every route but `/health` needs `Authorization: Bearer <api_key>`.
    pub api_key: Option<String>,
    /// Most live environments at once; `POST /envs` beyond it answers 503. Bounds memory
    /// when clients forget `DELETE`.
    pub max_envs: usize,
    /// Environments unused for this long are dropped when a new one is created.
    pub idle_timeout: Option<Duration>,
    /// Largest request body in bytes; larger ones answer 413.
    pub body_limit: usize,
    /// Environment names this server builds (`None`: all of [`crate::envs::ENV_NAMES`] but
    /// `dataset`, which reads files named by the client).
    pub allowed_envs: Option<Vec<String>>,
    /// The worker pool for dataset specs whose reward is a Python function (`reward =
    /// { python = … }`); `None`: such specs are refused, saying how to start one.
    pub python: Option<PythonPool>,
}

impl Default for EnvServerConfig {
    fn default() -> Self {
        EnvServerConfig {
            api_key: None,
            max_envs: 1024,
            idle_timeout: None,
            body_limit: DEFAULT_BODY_LIMIT,
            allowed_envs: None,
            python: None,
        }
    }
}

// By hand, so the API key never reaches a log.
impl std::fmt::Debug for EnvServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvServerConfig")
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("max_envs", &self.max_envs)
            .field("idle_timeout", &self.idle_timeout)
            .field("body_limit", &self.body_limit)
            .field("allowed_envs", &self.allowed_envs)
            .field("python", &self.python.is_some())
            .finish()
    }
}

pub use rollflash_core::auth::constant_time_eq;

/// One live environment. A tokio mutex, because a call holds it across `await`s (latency
/// sleeps, real I/O); it also serialises concurrent calls on one environment, which `Env`'s
/// `&mut self` requires anyway.
type SharedEnv = Arc<tokio::sync::Mutex<Box<dyn Env>>>;

struct Entry {
    env: SharedEnv,
    last_used: Instant,
}

/// The table of live environments. A std mutex: every critical section is a map operation
/// that never awaits.
#[derive(Default)]
struct Table {
    envs: HashMap<u64, Entry>,
    next_id: u64,
}

struct Shared {
    cfg: EnvServerConfig,
    table: Mutex<Table>,
}

impl Shared {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave a HashMap half-updated in a way that
        // matters here, so a poisoned lock is still usable.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The environment with `id`, marking it used.
    fn get(&self, id: &str) -> Result<SharedEnv, ApiError> {
        let not_found = || {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no environment with id {id:?}"),
            )
        };
        let key: u64 = id.parse().map_err(|_| not_found())?;
        let mut table = self.table();
        let entry = table.envs.get_mut(&key).ok_or_else(not_found)?;
        entry.last_used = Instant::now();
        Ok(entry.env.clone())
    }
}

/// An error reply.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

impl From<EnvError> for ApiError {
    fn from(e: EnvError) -> Self {
        let (status, kind) = match &e {
            EnvError::OutOfOrder(_) => (StatusCode::CONFLICT, "out_of_order"),
            EnvError::Config { .. } | EnvError::Data(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            EnvError::Garbage(_) | EnvError::Undecodable { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "garbage")
            }
            EnvError::Failed(_) | EnvError::Internal { .. } | EnvError::Remote { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "env_failed")
            }
        };
        ApiError::new(status, kind, e.to_string())
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        let status = r.status();
        let kind = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "too_large"
        } else {
            "bad_request"
        };
        ApiError::new(status, kind, r.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                kind: self.kind.to_string(),
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

/// Parses a JSON body ourselves: axum's `Json` extractor answers 415/422 in plain text, the
/// protocol promises 400 with a JSON message.
fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

async fn create(
    State(st): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<CreateResponse>), ApiError> {
    let spec: EnvSpec = parse_body(body)?;
    if let Some(allowed) = &st.cfg.allowed_envs {
        if !allowed.iter().any(|a| a == spec.name()) {
            return Err(ApiError::bad_request(format!(
                "environment `{}` is not served here (served: {})",
                spec.name(),
                allowed.join(", ")
            )));
        }
    } else if spec.name() == "dataset" {
        // A dataset spec names files on this machine: served only when asked for by name,
        // so an open server does not read whatever path a client sends.
        return Err(ApiError::bad_request(
            "environment `dataset` reads server-side files and is served only with `--env dataset`",
        ));
    }
    if let (EnvConfig::Dataset(task), Some(pool)) = (&spec.env, &st.cfg.python) {
        // Every environment of this server shares the one pool.
        task.set_python_pool(pool.clone());
    }
    let env = make_env(&spec)?;
    let mut table = st.table();
    if let Some(idle) = st.cfg.idle_timeout {
        let now = Instant::now();
        // An environment whose lock is taken is in a call right now, hence not idle.
        table
            .envs
            .retain(|_, e| now.duration_since(e.last_used) <= idle || e.env.try_lock().is_err());
    }
    if table.envs.len() >= st.cfg.max_envs {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "capacity",
            format!("{} environments are live, the limit", table.envs.len()),
        ));
    }
    table.next_id += 1;
    let id = table.next_id;
    table.envs.insert(
        id,
        Entry {
            env: Arc::new(tokio::sync::Mutex::new(env)),
            last_used: Instant::now(),
        },
    );
    tracing::debug!(id, name = spec.name(), "created environment");
    Ok((
        StatusCode::CREATED,
        Json(CreateResponse {
            env_id: id.to_string(),
        }),
    ))
}

async fn reset(
    State(st): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ResetResponse>, ApiError> {
    let req: ResetRequest = parse_body(body)?;
    let env = st.get(&id)?;
    let mut env = env.lock_owned().await;
    let r = env.reset(req.seed).await?;
    Ok(Json(ResetResponse {
        observation: r.observation,
        info: r.info,
    }))
}

async fn step(
    State(st): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<StepResponse>, ApiError> {
    let req: StepRequest = parse_body(body)?;
    let env = st.get(&id)?;
    let mut env = env.lock_owned().await;
    let s = env.step(&req.action).await?;
    Ok(Json(StepResponse {
        observation: s.observation,
        reward: s.reward,
        terminated: s.terminated,
        truncated: s.truncated,
        info: s.info,
    }))
}

async fn delete(
    State(st): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let removed = id
        .parse::<u64>()
        .ok()
        .and_then(|k| st.table().envs.remove(&k));
    match removed {
        Some(_) => Ok(StatusCode::NO_CONTENT),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no environment with id {id:?}"),
        )),
    }
}

async fn health(State(st): State<Arc<Shared>>) -> Json<HealthResponse> {
    Json(HealthResponse {
        status: "ok".into(),
        envs: st.table().envs.len(),
    })
}

async fn fallback() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// A known route with the wrong method: the JSON error shape too (axum's default is an empty
/// body), naming what was tried.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not accept {method}", uri.path()),
    )
}

/// Rejects requests without the right bearer token (when a key is configured).
async fn require_key(State(st): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let Some(key) = &st.cfg.api_key else {
        return next.run(req).await;
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match presented {
        Some(token) if constant_time_eq(token.as_bytes(), key.as_bytes()) => next.run(req).await,
        _ => {
            let mut resp = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong API key (Authorization: Bearer <key>)",
            )
            .into_response();
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            resp
        }
    }
}

/// The server's routes, for embedding in a larger axum app; [`serve`] is the usual entry.
pub fn router(cfg: EnvServerConfig) -> Router {
    let body_limit = cfg.body_limit;
    let st = Arc::new(Shared {
        cfg,
        table: Mutex::new(Table::default()),
    });
    let protected = Router::new()
        .route("/envs", post(create))
        .route("/envs/{id}/reset", post(reset))
        .route("/envs/{id}/step", post(step))
        .route("/envs/{id}", axum::routing::delete(delete))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(st.clone(), require_key));
    Router::new()
        .route("/health", get(health))
        .merge(protected)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(st)
}

/// Serves the protocol on `listener` until `shutdown` completes, then finishes the requests in
/// flight and returns. Environments are dropped with the server.
pub async fn serve(
    listener: tokio::net::TcpListener,
    cfg: EnvServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(cfg))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Where and how a [`RemoteEnv`] reaches its server.
#[derive(Clone, PartialEq)]
pub struct RemoteEnvConfig {
    /// Server base URL, e.g. `http://127.0.0.1:8123`.
    pub url: String,
    /// The environment to create there.
    pub spec: EnvSpec,
    /// Bearer token, when the server needs one.
    pub api_key: Option<String>,
    /// Per-request timeout: a hung server costs one call, not the rollout worker.
    pub timeout: Duration,
}

impl RemoteEnvConfig {
    /// `spec` on the server at `url`, without a key, with a 60 s timeout.
    pub fn new(url: impl Into<String>, spec: EnvSpec) -> Self {
        RemoteEnvConfig {
            url: url.into(),
            spec,
            api_key: None,
            timeout: Duration::from_secs(60),
        }
    }
}

// By hand, so the API key never reaches a log.
impl std::fmt::Debug for RemoteEnvConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEnvConfig")
            .field("url", &self.url)
            .field("spec", &self.spec)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// An [`Env`] served by a remote [`serve`] process.
///
/// The server-side environment is created lazily by the first `reset` (and re-created once if
/// the server forgot it, e.g. after idle eviction or a restart). Errors: a `409` reply is
/// [`EnvError::OutOfOrder`], a success reply that does not decode is
/// [`EnvError::Undecodable`], everything else is [`EnvError::Remote`] with the request URL and
/// a [`RemoteFailure`]: the `reqwest` error of a connection failure or timeout, or the status
/// and message of an error reply.
///
/// [`Env::close`] deletes the server-side environment. `Drop` cannot await: dropping a
/// `RemoteEnv` that still has one (its task was cancelled) sends the `DELETE` from a spawned
/// task when a tokio runtime is running, best effort and within the request timeout; else the
/// environment lives until the server's idle timeout or shutdown.
#[derive(Debug)]
pub struct RemoteEnv {
    client: reqwest::Client,
    cfg: RemoteEnvConfig,
    base: String,
    env_id: Option<String>,
}

impl RemoteEnv {
    /// A remote environment with its own HTTP client (one per run: [`RemoteEnvClient`]).
    pub fn new(cfg: RemoteEnvConfig) -> Result<Self, EnvError> {
        Ok(RemoteEnvClient::new(cfg)?.env())
    }

    /// A remote environment sharing `client` (and its connection pool) with others.
    pub fn with_client(client: reqwest::Client, cfg: RemoteEnvConfig) -> Self {
        let base = cfg.url.trim_end_matches('/').to_string();
        RemoteEnv {
            client,
            cfg,
            base,
            env_id: None,
        }
    }

    /// The server-side id, once created.
    pub fn env_id(&self) -> Option<&str> {
        self.env_id.as_deref()
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let req = req.timeout(self.cfg.timeout);
        match &self.cfg.api_key {
            Some(k) => req.bearer_auth(k),
            None => req,
        }
    }

    /// POSTs `body` as JSON and decodes a success reply.
    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        url: &str,
        body: &B,
    ) -> Result<T, Failure> {
        let resp = self
            .authed(self.client.post(url).json(body))
            .send()
            .await
            .map_err(|e| Failure::Other(remote(url, RemoteFailure::Transport(e))))?;
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            let err = error_reply(url, resp).await;
            return Err(if status == 404 {
                Failure::NotFound(err)
            } else {
                Failure::Other(err)
            });
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| Failure::Other(remote(url, RemoteFailure::Transport(e))))?;
        serde_json::from_slice(&bytes).map_err(|source| {
            Failure::Other(EnvError::Undecodable {
                url: url.to_string(),
                source,
            })
        })
    }

    async fn create(&mut self) -> Result<String, EnvError> {
        let url = format!("{}/envs", self.base);
        let r: CreateResponse = self
            .post(&url, &self.cfg.spec)
            .await
            .map_err(Failure::into_error)?;
        self.env_id = Some(r.env_id.clone());
        Ok(r.env_id)
    }

    async fn reset_on(&self, id: &str, seed: u64) -> Result<ResetResponse, Failure> {
        let url = format!("{}/envs/{id}/reset", self.base);
        self.post(&url, &ResetRequest { seed }).await
    }
}

/// A failed request, with "the server does not know this environment" kept apart so `reset`
/// can re-create it.
enum Failure {
    NotFound(EnvError),
    Other(EnvError),
}

impl Failure {
    fn into_error(self) -> EnvError {
        match self {
            Failure::NotFound(e) | Failure::Other(e) => e,
        }
    }
}

fn remote(url: &str, source: RemoteFailure) -> EnvError {
    EnvError::Remote {
        url: url.to_string(),
        source,
    }
}

/// Turns an error reply into an `EnvError`, keeping the server's kind and message.
async fn error_reply(url: &str, resp: reqwest::Response) -> EnvError {
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    let failure = match serde_json::from_str::<ErrorBody>(&text) {
        Ok(b) => RemoteFailure::Status {
            status,
            kind: Some(b.error.kind),
            message: b.error.message,
        },
        Err(_) => RemoteFailure::Status {
            status,
            kind: None,
            message: text.chars().take(200).collect(),
        },
    };
    if status == StatusCode::CONFLICT.as_u16() {
        EnvError::OutOfOrder(OutOfOrder::Remote {
            url: url.to_string(),
            reply: failure.to_string(),
        })
    } else {
        remote(url, failure)
    }
}

/// `DELETE /envs/{id}`: done (or already gone, `404`), or why not.
async fn delete_env(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    api_key: Option<&str>,
    timeout: Duration,
) -> Result<(), EnvError> {
    let url = format!("{base}/envs/{id}");
    let mut req = client.delete(&url).timeout(timeout);
    if let Some(k) = api_key {
        req = req.bearer_auth(k);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| remote(&url, RemoteFailure::Transport(e)))?;
    if resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND.as_u16() {
        Ok(())
    } else {
        Err(error_reply(&url, resp).await)
    }
}

impl Drop for RemoteEnv {
    fn drop(&mut self) {
        let Some(id) = self.env_id.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, base) = (self.client.clone(), self.base.clone());
        let (key, timeout) = (self.cfg.api_key.clone(), self.cfg.timeout);
        rt.spawn(async move {
            if let Err(e) = delete_env(&client, &base, &id, key.as_deref(), timeout).await {
                tracing::debug!(error = %rollflash_core::error_chain(&e), "could not delete a dropped remote environment");
            }
        });
    }
}

#[async_trait]
impl Env for RemoteEnv {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        let id = match &self.env_id {
            Some(id) => id.clone(),
            None => self.create().await?,
        };
        let r = match self.reset_on(&id, seed).await {
            Ok(r) => r,
            Err(Failure::NotFound(_)) => {
                // Evicted or the server restarted: one fresh environment, one more try.
                self.env_id = None;
                let id = self.create().await?;
                self.reset_on(&id, seed)
                    .await
                    .map_err(Failure::into_error)?
            }
            Err(Failure::Other(e)) => return Err(e),
        };
        Ok(Reset {
            observation: r.observation,
            info: r.info,
        })
    }

    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let Some(id) = &self.env_id else {
            return Err(EnvError::OutOfOrder(OutOfOrder::StepBeforeReset {
                env: "remote env".into(),
            }));
        };
        let url = format!("{}/envs/{id}/step", self.base);
        let body = StepRequest {
            action: action.to_string(),
        };
        let s: StepResponse = match self.post(&url, &body).await {
            Ok(s) => s,
            Err(Failure::NotFound(e)) => {
                // The episode is gone with its environment; the next reset makes a new one.
                self.env_id = None;
                return Err(e);
            }
            Err(Failure::Other(e)) => return Err(e),
        };
        if !s.reward.is_finite() {
            return Err(EnvError::Garbage(format!("{url}: non-finite reward")));
        }
        Ok(Step {
            observation: s.observation,
            reward: s.reward,
            terminated: s.terminated,
            truncated: s.truncated,
            info: s.info,
        })
    }

    /// Deletes the server-side environment (if any). The `RemoteEnv` stays usable: the next
    /// `reset` creates a new one.
    async fn close(&mut self) -> Result<(), EnvError> {
        let Some(id) = self.env_id.take() else {
            return Ok(());
        };
        delete_env(
            &self.client,
            &self.base,
            &id,
            self.cfg.api_key.as_deref(),
            self.cfg.timeout,
        )
        .await
    }
}

/// The client side of one run's remote environments: one HTTP client (one connection pool)
/// shared by every [`RemoteEnv`] it makes, and the start-up check.
#[derive(Debug, Clone)]
pub struct RemoteEnvClient {
    client: reqwest::Client,
    cfg: RemoteEnvConfig,
}

impl RemoteEnvClient {
    /// A client for `cfg`'s server. Connecting is bounded by the request timeout too (at
    /// most 10 s), so a server that is down fails fast.
    pub fn new(cfg: RemoteEnvConfig) -> Result<Self, EnvError> {
        let client = reqwest::Client::builder()
            .connect_timeout(cfg.timeout.min(Duration::from_secs(10)))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| remote(&cfg.url, RemoteFailure::Client(e)))?;
        Ok(RemoteEnvClient { client, cfg })
    }

    /// The configuration environments are made from.
    pub fn config(&self) -> &RemoteEnvConfig {
        &self.cfg
    }

    /// A new environment on the shared connection pool (no request is sent until `reset`).
    pub fn env(&self) -> RemoteEnv {
        RemoteEnv::with_client(self.client.clone(), self.cfg.clone())
    }

    /// Checks that the server is up and builds the configured environment: `GET /health`,
    /// then a probe environment created (which checks the API key and that the server
    /// accepts the spec) and deleted. Each request has the configured timeout.
    pub async fn check(&self) -> Result<HealthResponse, EnvError> {
        let base = self.cfg.url.trim_end_matches('/');
        let url = format!("{base}/health");
        let resp = self
            .client
            .get(&url)
            .timeout(self.cfg.timeout)
            .send()
            .await
            .map_err(|e| remote(&url, RemoteFailure::Transport(e)))?;
        if !resp.status().is_success() {
            return Err(error_reply(&url, resp).await);
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| remote(&url, RemoteFailure::Transport(e)))?;
        let health: HealthResponse =
            serde_json::from_slice(&bytes).map_err(|source| EnvError::Undecodable {
                url: url.clone(),
                source,
            })?;
        let mut probe = self.env();
        probe.create().await?;
        probe.close().await?;
        Ok(health)
    }
}
