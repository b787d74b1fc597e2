//! `TinkerClient`: the Tinker protocol over HTTP — typed calls, futures retrieved by long
//! polling under a deadline, bounded retries, and errors that keep what the server said.
//!
//! Every call that queues work on the server (create_model, forward_backward, optim_step,
//! save_weights*, load_weights, asample, unload_model) answers with a future id; the client
//! then long-polls `retrieve_future` until the result is there. What is retried, and why:
//! - a connection that could not be made: the request never reached the server, so
//!   resending is safe for every call (bounded by [`RetryPolicy::max_retries`]);
//! - 408/429/502/503/504 and client-side timeouts: only for calls that are safe to repeat
//!   (`retrieve_future`, reads, heartbeats, and forward_backward/optim_step with a non-zero
//!   `seq_id`, which the server deduplicates per model);
//! - a `retrieve_future` that ends without a result (a 408 after the server's own long poll,
//!   a `try_again`, our poll timeout): polled again until the future's deadline.
//!
//! A failed future (SkyRL: HTTP 400 `{detail}` from retrieve_future; hosted Tinker: a
//! `{error, category}` body) is [`TinkerError::FutureFailed`], naming the call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use reqwest::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::archive::SamplerPath;
use crate::datum::{Datum, ForwardOutput, SampleOutput};
use crate::proto::{self, ProtoError};
use crate::types::{self, AdamParams, FutureControl, LoraConfig, SamplingParams};

/// How transient failures are retried. Backoff doubles from `initial_backoff` up to
/// `max_backoff`.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Retries of one request (not counting the first try), and the number of consecutive
    /// connection failures a future's poll tolerates: a server that stays down is reported
    /// after about `max_retries` backoffs, not at the future's deadline.
    pub max_retries: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX);
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}

/// Where the server is and how long to wait for it.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `http://host:port` (no `/api/v1`).
    pub base_url: String,
    /// Sent as `X-API-Key` (hosted Tinker and TuFT require one; SkyRL ignores it).
    pub api_key: Option<String>,
    /// One HTTP request that is not a long poll.
    pub request_timeout: Duration,
    /// One `retrieve_future` long poll. The SDK uses 45 s; SkyRL holds a poll up to 300 s
    /// and then answers 408. Either way the client polls again.
    pub poll_timeout: Duration,
    /// How long to wait for one future in all. A JIT compile on a cold server takes tens of
    /// seconds; a large batch on a busy cluster, minutes.
    pub future_deadline: Duration,
    pub retry: RetryPolicy,
}

impl ClientConfig {
    /// Defaults for a server at `base_url`.
    pub fn new(base_url: impl Into<String>) -> ClientConfig {
        ClientConfig {
            base_url: base_url.into(),
            api_key: None,
            request_timeout: Duration::from_secs(60),
            poll_timeout: Duration::from_secs(45),
            future_deadline: Duration::from_secs(1800),
            retry: RetryPolicy::default(),
        }
    }
}

/// A reply body that could not be read as what the call returns.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("invalid JSON")]
    Json(#[from] serde_json::Error),
    #[error("invalid protobuf")]
    Protobuf(#[from] prost::DecodeError),
    #[error("invalid array in the protobuf")]
    Array(#[from] ProtoError),
    #[error("{0}")]
    Shape(String),
}

/// Everything that can go wrong talking to a Tinker server. Server answers keep their
/// status and body; transport failures keep the `reqwest` error as the source.
#[derive(Debug, thiserror::Error)]
pub enum TinkerError {
    /// No connection could be made (after retries): the server is down or the URL wrong.
    #[error("{call}: cannot reach the Tinker server at {url}")]
    Unreachable {
        call: &'static str,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The connection failed mid-request, or the request timed out.
    #[error("{call}: request to {url} failed")]
    Transport {
        call: &'static str,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an error status.
    #[error("{call}: {url} answered HTTP {status}: {body}")]
    Status {
        call: &'static str,
        url: String,
        status: u16,
        body: String,
    },
    /// The server ran the request and it failed.
    #[error("{call}: request {request_id} failed on the server: {message}")]
    FutureFailed {
        call: &'static str,
        request_id: String,
        /// The HTTP status it came with (SkyRL: 400), if it came as an error status.
        status: Option<u16>,
        /// The server's error text (`detail` or `error`).
        message: String,
        /// `user` / `server` / `unknown`, when the server classifies it.
        category: Option<String>,
        /// The whole body as sent.
        body: String,
    },
    /// The future was not done by the deadline.
    #[error("{call}: request {request_id} not done after {waited:?}")]
    FutureTimeout {
        call: &'static str,
        request_id: String,
        waited: Duration,
    },
    /// The reply could not be decoded.
    #[error("{call}: cannot decode the reply from {url}")]
    Decode {
        call: &'static str,
        url: String,
        #[source]
        source: DecodeError,
    },
    /// The call's arguments were refused before sending.
    #[error("{call}: {reason}")]
    InvalidInput { call: &'static str, reason: String },
    /// The HTTP client itself could not be built.
    #[error("cannot build the HTTP client")]
    Setup(#[source] reqwest::Error),
}

impl TinkerError {
    /// The HTTP status the server answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            TinkerError::Status { status, .. } => Some(*status),
            TinkerError::FutureFailed { status, .. } => *status,
            _ => None,
        }
    }

    /// The body the server answered with, if it answered with an error.
    pub fn body(&self) -> Option<&str> {
        match self {
            TinkerError::Status { body, .. } | TinkerError::FutureFailed { body, .. } => Some(body),
            _ => None,
        }
    }

    /// The `detail` of a FastAPI error body (a string, or the 422 list as JSON text).
    pub fn detail(&self) -> Option<String> {
        let body: types::ErrorBody = serde_json::from_str(self.body()?).ok()?;
        Some(match body.detail {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        })
    }

    /// Whether the server could not be reached at all (down, or the wrong address).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, TinkerError::Unreachable { .. })
    }
}

/// Whether resending a request is safe.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Repeat {
    /// Only when the connection was never made.
    IfNotSent,
    /// Also after an answer that says "try again" or a timeout.
    Safe,
}

/// A body to send.
enum Body<'a> {
    None,
    Json(&'a (dyn ErasedSerialize + Sync)),
    Proto(Vec<u8>),
}

/// `Serialize` is not object safe; this is the one method we need of it.
trait ErasedSerialize {
    fn to_json(&self) -> Result<Vec<u8>, serde_json::Error>;
}

impl<T: Serialize> ErasedSerialize for T {
    fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

/// A successful reply.
struct Reply {
    url: String,
    body: Vec<u8>,
}

/// What a finished future returned.
enum FutureResult {
    Json(serde_json::Value),
    Proto(Vec<u8>),
}

/// What a client has spent on the protocol so far: HTTP round trips, bytes each way, the
/// time spent waiting for answers (the server's queue and compute, plus the round trips
/// themselves), sleeping between retries, and encoding and decoding bodies. Differences of
/// two snapshots ([`Traffic::since`]) are what one training step cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Traffic {
    /// HTTP requests answered or failed (submissions, long polls, plain calls).
    pub requests: u64,
    /// Request bodies sent, bytes.
    pub bytes_out: u64,
    /// Response bodies received, bytes.
    pub bytes_in: u64,
    /// From sending a request to holding its whole answer, summed.
    pub waiting: Duration,
    /// Sleeping between retries and polls.
    pub backoff: Duration,
    /// Encoding requests (JSON, protobuf) and decoding results, on this side.
    pub codec: Duration,
}

impl Traffic {
    /// What was spent between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        Traffic {
            requests: self.requests.saturating_sub(earlier.requests),
            bytes_out: self.bytes_out.saturating_sub(earlier.bytes_out),
            bytes_in: self.bytes_in.saturating_sub(earlier.bytes_in),
            waiting: self.waiting.saturating_sub(earlier.waiting),
            backoff: self.backoff.saturating_sub(earlier.backoff),
            codec: self.codec.saturating_sub(earlier.codec),
        }
    }
}

/// [`Traffic`]'s counters, shared by a client's clones.
#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    waiting_ns: AtomicU64,
    backoff_ns: AtomicU64,
    codec_ns: AtomicU64,
}

fn add_ns(c: &AtomicU64, d: Duration) {
    c.fetch_add(
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

impl Counters {
    /// One request of `out` bytes answered with `inn` bytes after `waited`.
    fn request(&self, out: usize, inn: usize, waited: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes_out.fetch_add(out as u64, Ordering::Relaxed);
        self.bytes_in.fetch_add(inn as u64, Ordering::Relaxed);
        add_ns(&self.waiting_ns, waited);
    }

    fn snapshot(&self) -> Traffic {
        let d = |c: &AtomicU64| Duration::from_nanos(c.load(Ordering::Relaxed));
        Traffic {
            requests: self.requests.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            waiting: d(&self.waiting_ns),
            backoff: d(&self.backoff_ns),
            codec: d(&self.codec_ns),
        }
    }
}

/// A client of one Tinker server. Cheap to clone (the connection pool and the [`Traffic`]
/// counters are shared).
#[derive(Clone, Debug)]
pub struct TinkerClient {
    http: reqwest::Client,
    cfg: Arc<ClientConfig>,
    counters: Arc<Counters>,
}

impl TinkerClient {
    /// A client for `cfg.base_url`. Nothing is sent yet.
    pub fn new(cfg: ClientConfig) -> Result<TinkerClient, TinkerError> {
        let http = reqwest::Client::builder()
            .build()
            .map_err(TinkerError::Setup)?;
        Ok(TinkerClient {
            http,
            cfg: Arc::new(ClientConfig {
                base_url: cfg.base_url.trim_end_matches('/').to_string(),
                ..cfg
            }),
            counters: Arc::default(),
        })
    }

    /// A clone sharing the connection pool but counting its own [`Traffic`] (a heartbeat
    /// beside a learner, whose steps' figures it would otherwise blur).
    pub fn counted_apart(&self) -> TinkerClient {
        TinkerClient {
            counters: Arc::default(),
            ..self.clone()
        }
    }

    /// What this client (and its clones) have spent on the protocol so far.
    pub fn traffic(&self) -> Traffic {
        self.counters.snapshot()
    }

    /// Adds `d` to the codec time (for results decoded by callers).
    fn codec(&self, d: Duration) {
        add_ns(&self.counters.codec_ns, d);
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    fn url(&self, route: &str) -> String {
        format!("{}/api/v1/{route}", self.cfg.base_url)
    }

    /// Sends one request with the retry rules of the module docs.
    async fn send(
        &self,
        call: &'static str,
        method: reqwest::Method,
        route: &str,
        body: Body<'_>,
        repeat: Repeat,
    ) -> Result<Reply, TinkerError> {
        let url = self.url(route);
        let encoding = std::time::Instant::now();
        let (bytes, content_type) = match body {
            Body::None => (None, None),
            Body::Json(v) => {
                let b = v.to_json().map_err(|e| TinkerError::InvalidInput {
                    call,
                    reason: format!("cannot encode the request as JSON: {e}"),
                })?;
                (Some(b), Some("application/json"))
            }
            Body::Proto(b) => (Some(b), Some(proto::CONTENT_TYPE)),
        };
        self.codec(encoding.elapsed());
        let sent = bytes.as_ref().map_or(0, Vec::len);
        let mut attempt = 0u32;
        loop {
            let mut req = self
                .http
                .request(method.clone(), &url)
                .timeout(self.cfg.request_timeout);
            if let Some(key) = &self.cfg.api_key {
                req = req.header("X-API-Key", key);
            }
            if let (Some(b), Some(ct)) = (&bytes, content_type) {
                req = req.header(CONTENT_TYPE, ct).body(b.clone());
            }
            let retry_left = attempt < self.cfg.retry.max_retries;
            let asked = std::time::Instant::now();
            let answer = req.send().await;
            if answer.is_err() {
                self.counters.request(sent, 0, asked.elapsed());
            }
            match answer {
                Err(e) => {
                    let may_retry = e.is_connect() || (repeat == Repeat::Safe && e.is_timeout());
                    if may_retry && retry_left {
                        tracing::debug!(call, %url, error = %e, attempt, "retrying");
                    } else if e.is_connect() {
                        return Err(TinkerError::Unreachable {
                            call,
                            url,
                            source: e,
                        });
                    } else {
                        return Err(TinkerError::Transport {
                            call,
                            url,
                            source: e,
                        });
                    }
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let body = resp.bytes().await;
                    self.counters.request(
                        sent,
                        body.as_ref().map_or(0, |b| b.len()),
                        asked.elapsed(),
                    );
                    let body = body.map_err(|e| TinkerError::Transport {
                        call,
                        url: url.clone(),
                        source: e,
                    })?;
                    if (200..300).contains(&status) {
                        return Ok(Reply {
                            url,
                            body: body.to_vec(),
                        });
                    }
                    if !(repeat == Repeat::Safe && retryable_status(status) && retry_left) {
                        return Err(TinkerError::Status {
                            call,
                            url,
                            status,
                            body: String::from_utf8_lossy(&body).into_owned(),
                        });
                    }
                    tracing::debug!(call, %url, status, attempt, "retrying");
                }
            }
            let pause = self.cfg.retry.backoff(attempt);
            tokio::time::sleep(pause).await;
            add_ns(&self.counters.backoff_ns, pause);
            attempt += 1;
        }
    }

    async fn post_json<Req: Serialize + Sync, Resp: DeserializeOwned>(
        &self,
        call: &'static str,
        route: &str,
        body: &Req,
        repeat: Repeat,
    ) -> Result<Resp, TinkerError> {
        let reply = self
            .send(call, reqwest::Method::POST, route, Body::Json(body), repeat)
            .await?;
        decode_json(call, &reply.url, &reply.body)
    }

    /// Posts a request that queues work, then waits for its future.
    async fn submit(
        &self,
        call: &'static str,
        route: &str,
        body: Body<'_>,
        repeat: Repeat,
        want_proto: bool,
    ) -> Result<(String, FutureResult), TinkerError> {
        let reply = self
            .send(call, reqwest::Method::POST, route, body, repeat)
            .await?;
        let pending: types::FuturePending = decode_json(call, &reply.url, &reply.body)?;
        let result = self
            .retrieve_future(call, &pending.request_id, want_proto)
            .await?;
        Ok((pending.request_id, result))
    }

    /// Long-polls one future until it has a result, it fails, or the deadline passes.
    // Long on purpose: one poll loop whose every answer (transport error, status, control
    // body) updates the same failure count and backoff flag; split, each piece would have
    // to hand both back and the loop would no longer read as the protocol it follows.
    async fn retrieve_future(
        &self,
        call: &'static str,
        request_id: &str,
        want_proto: bool,
    ) -> Result<FutureResult, TinkerError> {
        let url = self.url("retrieve_future");
        let start = Instant::now();
        let deadline = start + self.cfg.future_deadline;
        let body = serde_json::to_vec(&types::RetrieveFutureRequest {
            request_id: request_id.to_string(),
            allow_metadata_only: false,
        })
        .map_err(|e| TinkerError::InvalidInput {
            call,
            reason: format!("cannot encode retrieve_future: {e}"),
        })?;
        let accept = if want_proto {
            proto::CONTENT_TYPE
        } else {
            "application/json"
        };
        // Consecutive failures without an answer; any answer resets it (the server is up).
        let mut failures = 0u32;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(TinkerError::FutureTimeout {
                    call,
                    request_id: request_id.to_string(),
                    waited: now - start,
                });
            }
            let mut req = self
                .http
                .post(&url)
                .timeout(self.cfg.poll_timeout.min(deadline - now))
                .header(CONTENT_TYPE, "application/json")
                .header(ACCEPT, accept)
                .body(body.clone());
            if let Some(key) = &self.cfg.api_key {
                req = req.header("X-API-Key", key);
            }
            let mut backoff = false;
            let asked = std::time::Instant::now();
            let answer = req.send().await;
            if answer.is_err() {
                self.counters.request(body.len(), 0, asked.elapsed());
            }
            match answer {
                Err(e) if e.is_timeout() => {
                    // Our poll ended before the server's: ask again.
                }
                Err(e) => {
                    failures += 1;
                    if failures > self.cfg.retry.max_retries {
                        return Err(if e.is_connect() {
                            TinkerError::Unreachable {
                                call,
                                url,
                                source: e,
                            }
                        } else {
                            TinkerError::Transport {
                                call,
                                url,
                                source: e,
                            }
                        });
                    }
                    backoff = true;
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let proto_body = is_proto(resp.headers().get(CONTENT_TYPE));
                    let got = resp.bytes().await;
                    self.counters.request(
                        body.len(),
                        got.as_ref().map_or(0, |b| b.len()),
                        asked.elapsed(),
                    );
                    let bytes = match got {
                        Ok(b) => b,
                        Err(e) if e.is_timeout() => continue,
                        Err(e) => {
                            return Err(TinkerError::Transport {
                                call,
                                url,
                                source: e,
                            })
                        }
                    };
                    let text = || String::from_utf8_lossy(&bytes).into_owned();
                    match status {
                        200..=299 if proto_body => return Ok(FutureResult::Proto(bytes.to_vec())),
                        200..=299 => {
                            let v: serde_json::Value = decode_json(call, &url, &bytes)?;
                            let control: Option<FutureControl> =
                                serde_json::from_value(v.clone()).ok();
                            match control {
                                Some(c) if c.is_try_again() || c.is_metadata_only() => {
                                    failures = 0;
                                    backoff = true;
                                }
                                Some(FutureControl {
                                    error: Some(err),
                                    category,
                                    ..
                                }) if !err.is_null() => {
                                    return Err(TinkerError::FutureFailed {
                                        call,
                                        request_id: request_id.to_string(),
                                        status: None,
                                        message: value_text(&err),
                                        category,
                                        body: text(),
                                    });
                                }
                                _ => return Ok(FutureResult::Json(v)),
                            }
                        }
                        // The server's long poll ended without a result.
                        408 => failures = 0,
                        // SkyRL's failed future. (The SDK also retries a bare 400 a few
                        // times, for proxies that inject them; a 400 with a FastAPI body
                        // is the server's own answer.)
                        400 => {
                            let body = text();
                            let message = serde_json::from_str::<types::ErrorBody>(&body)
                                .map(|b| value_text(&b.detail))
                                .unwrap_or_else(|_| body.clone());
                            return Err(TinkerError::FutureFailed {
                                call,
                                request_id: request_id.to_string(),
                                status: Some(status),
                                message,
                                category: None,
                                body,
                            });
                        }
                        s if retryable_status(s) && failures < self.cfg.retry.max_retries => {
                            failures += 1;
                            backoff = true;
                        }
                        _ => {
                            return Err(TinkerError::Status {
                                call,
                                url,
                                status,
                                body: text(),
                            })
                        }
                    }
                }
            }
            if backoff {
                let pause = self
                    .cfg
                    .retry
                    .backoff(failures.saturating_sub(1))
                    .min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
                add_ns(&self.counters.backoff_ns, pause);
            }
        }
    }

    /// `GET /api/v1/healthz`: the API answers (SkyRL answers before its engine is up).
    pub async fn healthz(&self) -> Result<(), TinkerError> {
        self.send(
            "healthz",
            reqwest::Method::GET,
            "healthz",
            Body::None,
            Repeat::IfNotSent,
        )
        .await
        .map(|_| ())
    }

    /// `GET /api/v1/get_server_capabilities`: the models served.
    pub async fn capabilities(&self) -> Result<types::ServerCapabilities, TinkerError> {
        let call = "get_server_capabilities";
        let reply = self
            .send(call, reqwest::Method::GET, call, Body::None, Repeat::Safe)
            .await?;
        decode_json(call, &reply.url, &reply.body)
    }

    /// Opens a session; returns its id. Keep it alive with [`Self::heartbeat`] (see
    /// `heartbeat.rs`).
    pub async fn create_session(&self, tags: Vec<String>) -> Result<String, TinkerError> {
        let req = types::CreateSessionRequest {
            tags,
            user_metadata: Default::default(),
            sdk_version: types::SDK_VERSION.to_string(),
            kind: "create_session",
        };
        let resp: types::CreateSessionResponse = self
            .post_json("create_session", "create_session", &req, Repeat::IfNotSent)
            .await?;
        if let Some(e) = resp.error_message.filter(|e| !e.is_empty()) {
            return Err(TinkerError::FutureFailed {
                call: "create_session",
                request_id: resp.session_id,
                status: None,
                message: e.clone(),
                category: None,
                body: e,
            });
        }
        Ok(resp.session_id)
    }

    /// Tells the server the session is alive.
    pub async fn heartbeat(&self, session_id: &str) -> Result<(), TinkerError> {
        let req = types::SessionHeartbeatRequest {
            session_id: session_id.to_string(),
            kind: "session_heartbeat",
        };
        let _: serde_json::Value = self
            .post_json("session_heartbeat", "session_heartbeat", &req, Repeat::Safe)
            .await?;
        Ok(())
    }

    /// Creates a LoRA training model on `base_model` and waits until it exists. Returns its
    /// id. `model_seq_id` counts the session's models.
    pub async fn create_model(
        &self,
        session_id: &str,
        model_seq_id: u32,
        base_model: &str,
        lora: LoraConfig,
    ) -> Result<types::CreateModelResult, TinkerError> {
        let call = "create_model";
        let req = types::CreateModelRequest {
            session_id: session_id.to_string(),
            model_seq_id,
            base_model: base_model.to_string(),
            lora_config: lora,
            kind: call,
        };
        let (_, result) = self
            .submit(call, call, Body::Json(&req), Repeat::IfNotSent, false)
            .await?;
        self.json_result(call, result)
    }

    /// `POST /api/v1/get_info`.
    pub async fn get_info(&self, model_id: &str) -> Result<types::ModelInfo, TinkerError> {
        let req = types::GetInfoRequest {
            model_id: model_id.to_string(),
            kind: "get_info",
        };
        self.post_json("get_info", "get_info", &req, Repeat::Safe)
            .await
    }

    /// Frees a model's slot on the server (SkyRL has `max_lora_adapters` of them).
    pub async fn unload_model(&self, model_id: &str) -> Result<(), TinkerError> {
        let call = "unload_model";
        let req = types::GetInfoRequest {
            model_id: model_id.to_string(),
            kind: call,
        };
        self.submit(call, call, Body::Json(&req), Repeat::IfNotSent, false)
            .await
            .map(|_| ())
    }

    /// Computes the loss and accumulates its gradient (applied by [`Self::optim_step`]).
    ///
    /// `seq_id` is the model's idempotency key: a resent request with the same id gets
    /// the same future back (409 if the data differ). 0 means none on the wire, so count
    /// from 1. `loss_fn` is one of the server's built-ins (SkyRL's JAX backend:
    /// `cross_entropy`, `importance_sampling`, `ppo`, `cispo`); `loss_fn_config` its knobs
    /// (`clip_low_threshold`, `clip_high_threshold` for ppo/cispo).
    pub async fn forward_backward(
        &self,
        model_id: &str,
        seq_id: i32,
        data: &[Datum],
        loss_fn: &str,
        loss_fn_config: &[(String, f64)],
    ) -> Result<ForwardOutput, TinkerError> {
        self.model_pass(
            "forward_backward",
            model_id,
            seq_id,
            data,
            loss_fn,
            loss_fn_config,
            false,
        )
        .await
    }

    /// The same pass without gradients (the current policy's log-probs and the loss).
    pub async fn forward(
        &self,
        model_id: &str,
        seq_id: i32,
        data: &[Datum],
        loss_fn: &str,
    ) -> Result<ForwardOutput, TinkerError> {
        self.model_pass("forward", model_id, seq_id, data, loss_fn, &[], true)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn model_pass(
        &self,
        call: &'static str,
        model_id: &str,
        seq_id: i32,
        data: &[Datum],
        loss_fn: &str,
        loss_fn_config: &[(String, f64)],
        forward_only: bool,
    ) -> Result<ForwardOutput, TinkerError> {
        if data.is_empty() {
            return Err(TinkerError::InvalidInput {
                call,
                reason: "no datums".into(),
            });
        }
        for (i, d) in data.iter().enumerate() {
            d.check(i)
                .map_err(|reason| TinkerError::InvalidInput { call, reason })?;
        }
        let encoding = std::time::Instant::now();
        let req = proto::ForwardBackwardRequest {
            model_id: model_id.to_string(),
            seq_id,
            data: data.iter().map(Datum::to_proto).collect(),
            loss_fn: loss_fn.to_string(),
            loss_fn_config: loss_fn_config.iter().cloned().collect(),
            forward_only,
        };
        let repeat = if seq_id != 0 {
            Repeat::Safe
        } else {
            Repeat::IfNotSent
        };
        let body = req.encode_to_vec();
        self.codec(encoding.elapsed());
        let (_, result) = self
            .submit(call, "forward_backward", Body::Proto(body), repeat, true)
            .await?;
        let url = self.url("retrieve_future");
        let decoding = std::time::Instant::now();
        let out = match result {
            FutureResult::Proto(b) => {
                let msg = proto::ForwardBackwardOutput::decode(b.as_slice()).map_err(|e| {
                    TinkerError::Decode {
                        call,
                        url: url.clone(),
                        source: e.into(),
                    }
                })?;
                ForwardOutput::from_proto(msg).map_err(|e| TinkerError::Decode {
                    call,
                    url: url.clone(),
                    source: e.into(),
                })?
            }
            FutureResult::Json(v) => {
                ForwardOutput::from_json(serde_json::from_value(v).map_err(|e| {
                    TinkerError::Decode {
                        call,
                        url: url.clone(),
                        source: e.into(),
                    }
                })?)
            }
        };
        self.codec(decoding.elapsed());
        if out.outputs.len() != data.len() {
            return Err(TinkerError::Decode {
                call,
                url,
                source: DecodeError::Shape(format!(
                    "{} outputs for {} datums",
                    out.outputs.len(),
                    data.len()
                )),
            });
        }
        Ok(out)
    }

    /// Applies the accumulated gradient with Adam; returns the server's metrics (SkyRL:
    /// `skyrl.ai/grad_norm`, `skyrl.ai/learning_rate`).
    pub async fn optim_step(
        &self,
        model_id: &str,
        seq_id: i32,
        adam: AdamParams,
    ) -> Result<std::collections::BTreeMap<String, f64>, TinkerError> {
        let call = "optim_step";
        let req = types::OptimStepRequest {
            model_id: model_id.to_string(),
            seq_id,
            adam_params: adam,
            kind: call,
        };
        let repeat = if seq_id != 0 {
            Repeat::Safe
        } else {
            Repeat::IfNotSent
        };
        let (_, result) = self
            .submit(call, call, Body::Json(&req), repeat, false)
            .await?;
        let r: types::OptimStepResult = self.json_result(call, result)?;
        Ok(r.metrics.unwrap_or_default())
    }

    /// Saves the current weights for sampling under `name` (`^[a-zA-Z0-9_-]+$`); returns
    /// the `tinker://…` path a sampling session is created from.
    pub async fn save_weights_for_sampler(
        &self,
        model_id: &str,
        name: &str,
    ) -> Result<String, TinkerError> {
        self.save("save_weights_for_sampler", model_id, name).await
    }

    /// Saves the training state (weights and Adam moments) under `name`; returns the
    /// `tinker://<model>/weights/<name>` path [`Self::load_state`] takes. The SDK's
    /// `save_state` (route `save_weights`).
    pub async fn save_state(&self, model_id: &str, name: &str) -> Result<String, TinkerError> {
        self.save("save_weights", model_id, name).await
    }

    async fn save(
        &self,
        call: &'static str,
        model_id: &str,
        name: &str,
    ) -> Result<String, TinkerError> {
        check_name(call, name)?;
        let req = types::SaveWeightsRequest {
            model_id: model_id.to_string(),
            path: name.to_string(),
            seq_id: None,
            kind: call,
        };
        let (_, result) = self
            .submit(call, call, Body::Json(&req), Repeat::IfNotSent, false)
            .await?;
        let r: types::SaveWeightsResult = self.json_result(call, result)?;
        r.path.ok_or_else(|| TinkerError::Decode {
            call,
            url: self.url("retrieve_future"),
            source: DecodeError::Shape("the result has no path".into()),
        })
    }

    /// Loads a training state saved by [`Self::save_state`] into `model_id`, which must be
    /// fresh (SkyRL allows it only as a model's first request). `optimizer`: also the Adam
    /// moments. The SDK's `load_state` (route `load_weights`).
    pub async fn load_state(
        &self,
        model_id: &str,
        path: &str,
        optimizer: bool,
    ) -> Result<(), TinkerError> {
        let call = "load_weights";
        let req = types::LoadWeightsRequest {
            model_id: model_id.to_string(),
            path: path.to_string(),
            optimizer,
            seq_id: None,
            kind: call,
        };
        self.submit(call, call, Body::Json(&req), Repeat::IfNotSent, false)
            .await
            .map(|_| ())
    }

    /// The archive of sampler weights (`GET …/training_runs/<model>/checkpoints/<id>/archive`):
    /// for a LoRA model on SkyRL, a `.tar.gz` of the PEFT adapter
    /// ([`crate::archive::unpack_adapter`] unpacks it). The SDK names the checkpoint
    /// `sampler_weights/<name>`, SkyRL 0.4.0's route takes `<name>` alone: the first is tried,
    /// then the second on 404 or 405. The server answers with a redirect to the bytes (followed) or,
    /// as the SDK also accepts, with JSON `{url}` of a signed download, fetched without our key.
    pub async fn sampler_archive(&self, path: &SamplerPath) -> Result<Vec<u8>, TinkerError> {
        let call = "get_checkpoint_archive_url";
        let route = |id: &str| format!("training_runs/{}/checkpoints/{id}/archive", path.model_id);
        let sdk = route(&format!("sampler_weights/{}", path.name));
        let reply = match self
            .send(call, reqwest::Method::GET, &sdk, Body::None, Repeat::Safe)
            .await
        {
            // SkyRL routes the SDK's id to its DELETE route (405) or nowhere (404).
            Err(e) if matches!(e.status(), Some(404 | 405)) => {
                self.send(
                    call,
                    reqwest::Method::GET,
                    &route(&path.name),
                    Body::None,
                    Repeat::Safe,
                )
                .await?
            }
            other => other?,
        };
        #[derive(Deserialize)]
        struct SignedUrl {
            url: String,
        }
        let Ok(signed) = serde_json::from_slice::<SignedUrl>(&reply.body) else {
            return Ok(reply.body);
        };
        let call = "download checkpoint archive";
        let failed = |source| TinkerError::Transport {
            call,
            url: signed.url.clone(),
            source,
        };
        let resp = self
            .http
            .get(&signed.url)
            .timeout(self.cfg.request_timeout)
            .send()
            .await
            .map_err(failed)?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(failed)?;
        if !(200..300).contains(&status) {
            return Err(TinkerError::Status {
                call,
                url: signed.url.clone(),
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        Ok(body.to_vec())
    }

    /// Opens a sampling session on saved weights (`model_path`, a `tinker://` path) or on
    /// the base model. `seq_id` counts the session's sampling sessions.
    pub async fn create_sampling_session(
        &self,
        session_id: &str,
        seq_id: u32,
        source: SamplerSource<'_>,
    ) -> Result<String, TinkerError> {
        let (model_path, base_model) = match source {
            SamplerSource::ModelPath(p) => (Some(p.to_string()), None),
            SamplerSource::BaseModel(m) => (None, Some(m.to_string())),
        };
        let req = types::CreateSamplingSessionRequest {
            session_id: session_id.to_string(),
            sampling_session_seq_id: seq_id,
            model_path,
            base_model,
            kind: "create_sampling_session",
        };
        let resp: types::CreateSamplingSessionResponse = self
            .post_json(
                "create_sampling_session",
                "create_sampling_session",
                &req,
                Repeat::IfNotSent,
            )
            .await?;
        Ok(resp.sampling_session_id)
    }

    /// Samples `num_samples` continuations of `prompt` in a sampling session.
    /// `prompt_logprobs`: also the log-prob of each prompt token under the sampled weights
    /// (`compute_logprobs` is this with `max_tokens: 1`), one per prompt token, the first
    /// `None` (it has no context), whichever of the two layouts the server sends.
    pub async fn sample(
        &self,
        sampling_session_id: &str,
        seq_id: i32,
        prompt: &[i32],
        num_samples: u32,
        params: SamplingParams,
        prompt_logprobs: bool,
    ) -> Result<SampleOutput, TinkerError> {
        let call = "asample";
        if prompt.is_empty() {
            return Err(TinkerError::InvalidInput {
                call,
                reason: "empty prompt".into(),
            });
        }
        let req = types::SampleRequest {
            num_samples,
            prompt: types::ModelInput::tokens(prompt.to_vec()),
            sampling_params: params,
            sampling_session_id: sampling_session_id.to_string(),
            seq_id,
            prompt_logprobs,
            topk_prompt_logprobs: 0,
            kind: "sample",
        };
        let (_, result) = self
            .submit(call, call, Body::Json(&req), Repeat::IfNotSent, true)
            .await?;
        let url = self.url("retrieve_future");
        let mut out = match result {
            FutureResult::Proto(b) => {
                let msg = proto::SampleResponse::decode(b.as_slice()).map_err(|e| {
                    TinkerError::Decode {
                        call,
                        url: url.clone(),
                        source: e.into(),
                    }
                })?;
                SampleOutput::from_proto(msg).map_err(|e| TinkerError::Decode {
                    call,
                    url: url.clone(),
                    source: e.into(),
                })?
            }
            FutureResult::Json(v) => {
                SampleOutput::from_json(serde_json::from_value(v).map_err(|e| {
                    TinkerError::Decode {
                        call,
                        url: url.clone(),
                        source: e.into(),
                    }
                })?)
            }
        };
        // Hosted Tinker sends one prompt log-prob per prompt token, the first undefined;
        // SkyRL's JAX backend leaves the first out. Align both to the prompt.
        if let Some(lp) = &mut out.prompt_logprobs {
            if lp.len() + 1 == prompt.len() {
                lp.insert(0, None);
            }
            if lp.len() != prompt.len() {
                return Err(TinkerError::Decode {
                    call,
                    url,
                    source: DecodeError::Shape(format!(
                        "{} prompt logprobs for {} prompt tokens",
                        lp.len(),
                        prompt.len()
                    )),
                });
            }
        }
        Ok(out)
    }

    fn json_result<T: DeserializeOwned>(
        &self,
        call: &'static str,
        result: FutureResult,
    ) -> Result<T, TinkerError> {
        let url = self.url("retrieve_future");
        match result {
            FutureResult::Json(v) => serde_json::from_value(v).map_err(|e| TinkerError::Decode {
                call,
                url,
                source: e.into(),
            }),
            FutureResult::Proto(_) => Err(TinkerError::Decode {
                call,
                url,
                source: DecodeError::Shape("a protobuf result where JSON was expected".into()),
            }),
        }
    }
}

/// What a sampling session samples from.
#[derive(Clone, Copy, Debug)]
pub enum SamplerSource<'a> {
    /// Weights saved by `save_weights_for_sampler` (`tinker://…`).
    ModelPath(&'a str),
    /// The served base model, without an adapter.
    BaseModel(&'a str),
}

/// Names of saved weights: the server's `^[a-zA-Z0-9_-]+$`, at most 255 characters.
fn check_name(call: &'static str, name: &str) -> Result<(), TinkerError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(TinkerError::InvalidInput {
            call,
            reason: format!("checkpoint name {name:?} is not [a-zA-Z0-9_-]{{1,255}}"),
        })
    }
}

fn is_proto(ct: Option<&HeaderValue>) -> bool {
    ct.and_then(|v| v.to_str().ok())
        .is_some_and(|s| s.starts_with(proto::CONTENT_TYPE))
}

/// Statuses that say "not now": a timeout, rate limiting, or a gateway/restart hiccup.
/// 500 is not among them: SkyRL uses it for errors that repeat.
fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 502 | 503 | 504)
}

fn value_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn decode_json<T: DeserializeOwned>(
    call: &'static str,
    url: &str,
    body: &[u8],
) -> Result<T, TinkerError> {
    serde_json::from_slice(body).map_err(|e| TinkerError::Decode {
        call,
        url: url.to_string(),
        source: e.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_saturates() {
        let r = RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
        };
        assert_eq!(r.backoff(0), Duration::from_millis(100));
        assert_eq!(r.backoff(1), Duration::from_millis(200));
        assert_eq!(r.backoff(2), Duration::from_millis(350));
        assert_eq!(r.backoff(40), Duration::from_millis(350));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("x", "step-3_a").is_ok());
        assert!(check_name("x", "a/b").is_err());
        assert!(check_name("x", "").is_err());
    }

    #[test]
    fn detail_reads_fastapi_bodies() {
        let e = TinkerError::Status {
            call: "c",
            url: "u".into(),
            status: 404,
            body: r#"{"detail":"Model not found"}"#.into(),
        };
        assert_eq!(e.detail().as_deref(), Some("Model not found"));
        assert_eq!(e.status(), Some(404));
    }
}
