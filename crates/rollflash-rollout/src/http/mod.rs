//! HTTP client backends: [`SglangBackend`] for SGLang's native API (and `rollflash serve`),
//! [`VllmBackend`] for vLLM on its own RL routes, [`OpenAiBackend`] for OpenAI-compatible
//! servers (`rollflash serve`, others), [`TinkerBackend`] for a Tinker server's sampling API
//! (through `rollflash-tinker`'s client, which has its own transport and retries; it shares
//! only the registry of requests in flight, the seed and the resume split below).
//!
//! This module holds what they share: the connection settings ([`HttpBackendConfig`]), one
//! `reqwest` client with bounded retries and exponential backoff, the mapping of transport
//! and status failures to [`BackendError`], and the registry of requests in flight that
//! `abort` and `pause` act on; `common` holds `HttpCommon` (the state and the `load`,
//! `update_weights` and adapter steps the SGLang, vLLM and OpenAI clients write alike), the
//! client-side pause of OpenAI and Tinker, and the answer every `generate` builds.
//!
//! Retries: connection failures and 408/429/5xx answers are retried up to `max_retries`
//! times, for every call. All calls are safe to repeat: control routes are idempotent, and a
//! generation that failed produced nothing we received, so it is simply asked again (with the
//! same seed). Timeouts are never retried: the server may still be working on the request.

mod common;
mod openai;
mod sglang;
mod tinker;
mod vllm;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rollflash_core::{GenRequest, Generated, PolicyVersion, RequestId};
use serde_json::{json, Value};
use tokio::sync::Notify;

pub use openai::{ChatCompletion, OpenAiBackend, OpenAiConfig, WeightHook};
pub use sglang::SglangBackend;
pub use tinker::{TinkerBackend, TinkerBackendConfig};
pub use vllm::{VllmBackend, VllmPause};

use crate::backend::BackendError;

/// How to reach one server; [`HttpBackendConfig::new`] fills in the defaults.
#[derive(Clone, PartialEq)]
pub struct HttpBackendConfig {
    /// The server root, e.g. `http://127.0.0.1:30000` (a trailing `/v1` is accepted for
    /// OpenAI servers). Only `http://`: the client is built without TLS.
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Limit on one whole call, generation included: generous, since a long generation is
    /// one call.
    pub timeout: Duration,
    /// Limit on opening a connection: short, so a dead server is noticed fast.
    pub connect_timeout: Duration,
    /// Extra attempts after a connection failure or a 408/429/5xx answer.
    pub max_retries: u32,
    /// First wait before a retry; doubled each time up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// The policy version the server starts with; tokens get it when the server does not
    /// report versions, until the first `update_weights` through this backend.
    pub initial_version: PolicyVersion,
}

impl std::fmt::Debug for HttpBackendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpBackendConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff_initial", &self.backoff_initial)
            .field("backoff_max", &self.backoff_max)
            .field("initial_version", &self.initial_version)
            .finish()
    }
}

impl HttpBackendConfig {
    /// Defaults for a server at `base_url`: 10 min per call, 5 s to connect, 3 retries
    /// backing off from 100 ms to 5 s, no API key, version 0.
    pub fn new(base_url: impl Into<String>) -> Self {
        HttpBackendConfig {
            base_url: base_url.into(),
            api_key: None,
            timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(5),
            max_retries: 3,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            initial_version: PolicyVersion::default(),
        }
    }

    /// Checks the settings; errors name the field.
    fn validate(&self) -> Result<(), BackendError> {
        let bad = |reason: String| {
            Err(BackendError::InvalidRequest {
                reason,
                source: None,
            })
        };
        if !self.base_url.starts_with("http://") {
            return bad(format!(
                "base_url must start with http:// (this build has no TLS), got {:?}",
                self.base_url
            ));
        }
        if self.timeout.is_zero() || self.connect_timeout.is_zero() {
            return bad("timeout and connect_timeout must be positive".into());
        }
        if self.backoff_initial > self.backoff_max {
            return bad("backoff_initial must not exceed backoff_max".into());
        }
        Ok(())
    }
}

/// The `reqwest` client of one backend, with its retry policy and error mapping.
pub(crate) struct HttpClient {
    /// The backend's name in errors and logs: its base URL.
    name: String,
    /// `base_url` without a trailing `/`.
    base: String,
    client: reqwest::Client,
    cfg: HttpBackendConfig,
}

impl HttpClient {
    pub(crate) fn new(cfg: &HttpBackendConfig) -> Result<Self, BackendError> {
        cfg.validate()?;
        let base = cfg.base_url.trim_end_matches('/').to_string();
        let mut builder = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.connect_timeout);
        if is_loopback(&base) {
            // An `HTTP_PROXY` in the environment must not send local traffic away.
            builder = builder.no_proxy();
        }
        let client = builder.build().map_err(|e| BackendError::Unavailable {
            backend: base.clone(),
            reason: "cannot build the HTTP client".into(),
            source: Some(Box::new(e)),
        })?;
        Ok(HttpClient {
            name: base.clone(),
            base,
            client,
            cfg: cfg.clone(),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn config(&self) -> &HttpBackendConfig {
        &self.cfg
    }

    /// `POST base + route` with a JSON body; the JSON answer (`null` for an empty body).
    pub(crate) async fn post(&self, route: &str, body: &Value) -> Result<Value, BackendError> {
        self.call(reqwest::Method::POST, route, Some(body), Answer::Json)
            .await
    }

    /// `POST` to a route whose success may be plain text (vLLM's LoRA routes answer
    /// `Success: LoRA adapter '…' added successfully.`): JSON as JSON, other text as a JSON
    /// string.
    pub(crate) async fn post_text_ok(
        &self,
        route: &str,
        body: &Value,
    ) -> Result<Value, BackendError> {
        self.call(reqwest::Method::POST, route, Some(body), Answer::JsonOrText)
            .await
    }

    /// `GET base + route`; the JSON answer (`null` for an empty body).
    pub(crate) async fn get(&self, route: &str) -> Result<Value, BackendError> {
        self.call(reqwest::Method::GET, route, None, Answer::Json)
            .await
    }

    async fn call(
        &self,
        method: reqwest::Method,
        route: &str,
        body: Option<&Value>,
        answer: Answer,
    ) -> Result<Value, BackendError> {
        let mut delay = self.cfg.backoff_initial;
        let mut attempt = 0;
        loop {
            match self.once(method.clone(), route, body, answer).await {
                Err(e) if e.retryable() && attempt < self.cfg.max_retries => {
                    tracing::debug!(
                        backend = %self.name, %method, route, attempt,
                        "retrying after {delay:?}: {}", e.describe()
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.cfg.backoff_max);
                    attempt += 1;
                }
                result => return result.map_err(|e| e.into_backend(self, &method, route)),
            }
        }
    }

    async fn once(
        &self,
        method: reqwest::Method,
        route: &str,
        body: Option<&Value>,
        answer: Answer,
    ) -> Result<Value, CallError> {
        let mut rb = self.client.request(method, format!("{}{route}", self.base));
        if let Some(key) = &self.cfg.api_key {
            rb = rb.bearer_auth(key);
        }
        if let Some(b) = body {
            rb = rb.json(b);
        }
        let resp = rb.send().await.map_err(CallError::Transport)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(CallError::Transport)?;
        if !status.is_success() {
            return Err(CallError::Status {
                status: status.as_u16(),
                message: error_message(&bytes),
            });
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        match serde_json::from_slice(&bytes) {
            Ok(v) => Ok(v),
            Err(_) if answer == Answer::JsonOrText => {
                Ok(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
            }
            Err(source) => Err(CallError::Decode {
                source,
                body: truncate(&String::from_utf8_lossy(&bytes)),
            }),
        }
    }

    /// A protocol error naming this backend.
    pub(crate) fn protocol(&self, route: &str, reason: impl std::fmt::Display) -> BackendError {
        BackendError::Protocol {
            backend: self.name.clone(),
            reason: format!("{route}: {reason}"),
            source: None,
        }
    }
}

/// Which API a server speaks, for [`probe_server`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerApi {
    /// SGLang's native routes (SGLang, `rollflash serve`).
    Sglang,
    /// OpenAI-compatible routes (vLLM, `rollflash serve`, others).
    OpenAi,
}

/// What a server says about itself, as far as its API tells.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerInfo {
    /// The served model: SGLang's `model_path`, or the first id of `/v1/models`.
    pub model: Option<String>,
    /// The version of the weights it generates with (SGLang's `weight_version`).
    pub weight_version: Option<PolicyVersion>,
    /// Rows of the model's output layer (`rollflash serve` reports it; SGLang and vLLM do
    /// not).
    pub vocab_size: Option<usize>,
    /// The model's end-of-sequence tokens (`rollflash serve` reports them).
    pub eos_token_ids: Option<Vec<u32>>,
    /// The longest sequence it accepts (vLLM's `max_model_len` in `/v1/models`).
    pub max_model_len: Option<usize>,
}

/// Asks the server at `cfg.base_url` whether it is up and what it serves: `GET /health`,
/// then `GET /get_model_info` (SGLang) or `GET /v1/models` (OpenAI; then `/get_model_info`
/// too where the server has it, as `rollflash serve` does). Every call is bounded by `cfg`'s
/// timeouts and retries, so a server that is down is reported as `Unavailable` naming it.
pub async fn probe_server(
    cfg: &HttpBackendConfig,
    api: ServerApi,
) -> Result<ServerInfo, BackendError> {
    let mut cfg = cfg.clone();
    if api == ServerApi::OpenAi {
        let trimmed = cfg.base_url.trim_end_matches('/');
        cfg.base_url = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
    }
    let http = HttpClient::new(&cfg)?;
    match http.get("/health").await {
        // OpenAI proper has no `/health`; `/v1/models` below is the liveness check there.
        Err(BackendError::Unsupported { .. }) if api == ServerApi::OpenAi => {}
        r => {
            r?;
        }
    }
    let mut info = ServerInfo::default();
    if api == ServerApi::OpenAi {
        let models = http.get("/v1/models").await?;
        let first = models.pointer("/data/0");
        info.model = first
            .and_then(|m| m.get("id"))
            .and_then(Value::as_str)
            .map(str::to_string);
        info.max_model_len = first
            .and_then(|m| m.get("max_model_len"))
            .and_then(Value::as_u64)
            .map(|n| n as usize);
    }
    let model_info = match http.get("/get_model_info").await {
        Ok(v) => v,
        Err(BackendError::Unsupported { .. }) if api == ServerApi::OpenAi => Value::Null,
        Err(e) => return Err(e),
    };
    if info.model.is_none() {
        info.model = model_info
            .get("model_path")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    info.weight_version = model_info
        .get("weight_version")
        .and_then(crate::server::parse_version);
    info.vocab_size = model_info
        .get("vocab_size")
        .and_then(Value::as_u64)
        .map(|n| n as usize);
    info.eos_token_ids = model_info
        .get("eos_token_ids")
        .and_then(|v| serde_json::from_value(v.clone()).ok());
    Ok(info)
}

/// The token ids the server's own tokenizer gives `text`, no special tokens added: vLLM's
/// `POST /tokenize {model, prompt, add_special_tokens: false}` (at the server's root, beside
/// `/v1`). `None` where the server has no such route. For servers that do not report their
/// vocabulary: comparing one probe text's ids with the trainer's tokenizer catches a server
/// that serves another tokenizer, which a matching vocabulary size would not anyway.
pub async fn server_tokenize(
    cfg: &HttpBackendConfig,
    model: Option<&str>,
    text: &str,
) -> Result<Option<Vec<u32>>, BackendError> {
    let mut cfg = cfg.clone();
    let trimmed = cfg.base_url.trim_end_matches('/');
    cfg.base_url = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
    let http = HttpClient::new(&cfg)?;
    let mut body = json!({"prompt": text, "add_special_tokens": false});
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    let answer = match http.post("/tokenize", &body).await {
        Ok(v) => v,
        Err(BackendError::Unsupported { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let ids = answer
        .get("tokens")
        .and_then(|t| serde_json::from_value::<Vec<u32>>(t.clone()).ok())
        .ok_or_else(|| http.protocol("/tokenize", "no `tokens` list of ids in the answer"))?;
    Ok(Some(ids))
}

/// The weights version the server reports it generates with now: SGLang's
/// `GET /get_weight_version`, else `weight_version` in `GET /get_model_info`.
pub(crate) async fn served_version(http: &HttpClient) -> Result<PolicyVersion, BackendError> {
    let (route, answer) = match http.get("/get_weight_version").await {
        Ok(v) => ("/get_weight_version", v),
        Err(BackendError::Unsupported { .. }) => {
            ("/get_model_info", http.get("/get_model_info").await?)
        }
        Err(e) => return Err(e),
    };
    answer
        .get("weight_version")
        .and_then(crate::server::parse_version)
        .ok_or_else(|| {
            http.protocol(
                route,
                "reports no integer `weight_version`, so the loaded weights cannot be verified",
            )
        })
}

/// After a load of `version`: the server must report serving it (never assumed: a load that
/// answered success but left the old weights in place is an error).
pub(crate) async fn verify_served_version(
    http: &HttpClient,
    version: PolicyVersion,
) -> Result<(), BackendError> {
    let served = served_version(http).await?;
    if served != version {
        return Err(BackendError::Protocol {
            backend: http.name().to_string(),
            reason: format!(
                "after loading weights version {version} the server reports weight_version {served}"
            ),
            source: None,
        });
    }
    Ok(())
}

/// Whether an `http://` URL names this machine.
fn is_loopback(url: &str) -> bool {
    let rest = url.trim_start_matches("http://");
    let host = if let Some(v6) = rest.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        rest.split([':', '/']).next().unwrap_or_default()
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// What a successful answer's body must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Json,
    JsonOrText,
}

/// One failed attempt.
enum CallError {
    /// No answer: connection refused or reset, timeout, broken body.
    Transport(reqwest::Error),
    /// An answer with a non-2xx status, and the message found in its body.
    Status { status: u16, message: String },
    /// A 2xx answer that is not JSON, and the start of it.
    Decode {
        source: serde_json::Error,
        body: String,
    },
}

impl CallError {
    fn retryable(&self) -> bool {
        match self {
            CallError::Transport(e) => !e.is_timeout(),
            CallError::Status { status, .. } => {
                matches!(status, 408 | 429) || (*status >= 500 && *status != 501)
            }
            CallError::Decode { .. } => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            CallError::Transport(e) => crate::backend::error_chain(e),
            CallError::Status { status, message } => format!("HTTP {status}: {message}"),
            CallError::Decode { source, body } => format!("answer is not JSON ({source}): {body}"),
        }
    }

    /// The `BackendError` a caller sees once retries are spent: the request's fault
    /// (`InvalidRequest`), a missing route (`Unsupported`), an unusable server (`Unavailable`,
    /// `Timeout`), or an answer we cannot use (`Protocol`, also for a rejected API key, which
    /// no retry fixes).
    fn into_backend(
        self,
        client: &HttpClient,
        method: &reqwest::Method,
        route: &str,
    ) -> BackendError {
        let backend = client.name.clone();
        match self {
            CallError::Transport(e) if e.is_timeout() => BackendError::Timeout {
                backend,
                secs: client.cfg.timeout.as_secs_f64(),
            },
            CallError::Transport(e) => BackendError::Unavailable {
                backend,
                reason: format!("{method} {route}"),
                source: Some(Box::new(e)),
            },
            CallError::Decode { source, body } => BackendError::Protocol {
                backend,
                reason: format!("{method} {route}: answer is not JSON: {body}"),
                source: Some(Box::new(source)),
            },
            CallError::Status { status, message } => match status {
                400 | 403 | 413 | 415 | 422 => BackendError::InvalidRequest {
                    reason: format!("{backend} {method} {route}: HTTP {status}: {message}"),
                    source: None,
                },
                404 | 405 | 501 => BackendError::Unsupported {
                    backend,
                    what: format!("{method} {route} (HTTP {status}: {message})"),
                },
                408 | 429 | 500..=599 => BackendError::Unavailable {
                    backend,
                    reason: format!("{method} {route}: HTTP {status}: {message}"),
                    source: None,
                },
                _ => BackendError::Protocol {
                    backend,
                    reason: format!("{method} {route}: HTTP {status}: {message}"),
                    source: None,
                },
            },
        }
    }
}

/// The message of an error answer: OpenAI/our `{"error": {"message"}}`, `{"error": "..."}`,
/// SGLang's `{"message"}`, FastAPI's `{"detail"}`, or the raw text.
fn error_message(bytes: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
        let found = v
            .pointer("/error/message")
            .or_else(|| v.get("error").filter(|e| e.is_string()))
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"));
        if let Some(m) = found {
            return match m {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
        }
    }
    truncate(&String::from_utf8_lossy(bytes))
}

fn truncate(s: &str) -> String {
    const MAX: usize = 500;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Requests in flight on one backend, so `abort` and `pause(Abort)` can reach them. A std
/// `Mutex`: each critical section is one map operation and never crosses an `.await`.
#[derive(Default)]
pub(crate) struct Registry {
    inner: Mutex<HashMap<RequestId, Entry>>,
}

struct Entry {
    /// Signalled once to abort; `Notify` keeps the signal if the request is not waiting on
    /// it yet, so an abort that races the start of a request is not lost.
    abort: Arc<Notify>,
    /// Held client-side by a pause rather than sent.
    waiting: bool,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<RequestId, Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a request; the same id twice at once is refused, as the engine does.
    pub(crate) fn register(
        &self,
        id: RequestId,
        backend: &str,
    ) -> Result<Ticket<'_>, BackendError> {
        let mut map = self.lock();
        if map.contains_key(&id) {
            return Err(BackendError::InvalidRequest {
                reason: format!("{id} is already running on backend {backend}"),
                source: None,
            });
        }
        let abort = Arc::new(Notify::new());
        map.insert(
            id,
            Entry {
                abort: Arc::clone(&abort),
                waiting: false,
            },
        );
        Ok(Ticket {
            registry: self,
            id,
            abort,
        })
    }

    /// Signals one request to abort; unknown ids are ignored.
    pub(crate) fn abort(&self, id: RequestId) {
        if let Some(e) = self.lock().get(&id) {
            e.abort.notify_one();
        }
    }

    /// Signals every request to abort.
    pub(crate) fn abort_all(&self) {
        for e in self.lock().values() {
            e.abort.notify_one();
        }
    }

    /// `(running, waiting)`.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let map = self.lock();
        let waiting = map.values().filter(|e| e.waiting).count();
        (map.len() - waiting, waiting)
    }

    fn set_waiting(&self, id: RequestId, waiting: bool) {
        if let Some(e) = self.lock().get_mut(&id) {
            e.waiting = waiting;
        }
    }
}

/// One request's registration; dropping it unregisters.
pub(crate) struct Ticket<'a> {
    registry: &'a Registry,
    id: RequestId,
    abort: Arc<Notify>,
}

impl Ticket<'_> {
    /// Completes when the request is to be aborted.
    pub(crate) async fn aborted(&self) {
        self.abort.notified().await;
    }

    /// Marks the request as held by a client-side pause (for `load`).
    pub(crate) fn set_waiting(&self, waiting: bool) {
        self.registry.set_waiting(self.id, waiting);
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}

/// The policy version tokens get when the server does not say, kept current by
/// `update_weights`.
pub(crate) struct KnownVersion(AtomicU64);

impl KnownVersion {
    pub(crate) fn new(v: PolicyVersion) -> Self {
        KnownVersion(AtomicU64::new(v.0))
    }

    pub(crate) fn get(&self) -> PolicyVersion {
        PolicyVersion(self.0.load(Ordering::SeqCst))
    }

    pub(crate) fn set(&self, v: PolicyVersion) {
        self.0.store(v.0, Ordering::SeqCst);
    }
}

/// The seed sent for a request. The server assigns its own ids, so the id-derived seed the
/// engine would use ([`rollflash_core::SamplingParams::seed_for`]) is sent explicitly, and a request samples
/// the same tokens over HTTP as in process.
pub(crate) fn request_seed(req: &GenRequest) -> u64 {
    req.params.seed_for(req.id)
}

/// What remains to generate for `req`: the resumed part and the new-token budget. `None`
/// when the resumed part already fills `max_new_tokens`.
pub(crate) fn split_resume(req: &GenRequest) -> (Generated, Option<usize>) {
    let resumed = req.resume.clone().unwrap_or_default();
    let left = req
        .params
        .max_new_tokens
        .checked_sub(resumed.len())
        .filter(|&n| n > 0);
    (resumed, left)
}

/// A backoff schedule for repeated control calls (re-sent aborts).
pub(crate) fn next_delay(cur: Duration, cfg: &HttpBackendConfig) -> Duration {
    (cur * 2).min(cfg.backoff_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_found_in_every_shape() {
        assert_eq!(error_message(br#"{"error": {"message": "bad"}}"#), "bad");
        assert_eq!(error_message(br#"{"error": "bad"}"#), "bad");
        assert_eq!(
            error_message(br#"{"object": "error", "message": "bad"}"#),
            "bad"
        );
        assert_eq!(error_message(br#"{"detail": "bad"}"#), "bad");
        assert_eq!(error_message(b"plain bad"), "plain bad");
    }

    #[test]
    fn loopback_urls_are_recognised() {
        assert!(is_loopback("http://127.0.0.1:30000"));
        assert!(is_loopback("http://localhost/v1"));
        assert!(is_loopback("http://[::1]:8000"));
        assert!(!is_loopback("http://10.0.0.2:30000"));
        assert!(!is_loopback("http://example.com"));
    }

    #[test]
    fn config_validation_names_the_problem() {
        let e = HttpClient::new(&HttpBackendConfig::new("https://x"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("http://"), "{e}");
        let mut c = HttpBackendConfig::new("http://x");
        c.backoff_initial = Duration::from_secs(10);
        assert!(HttpClient::new(&c).is_err());
    }
}
