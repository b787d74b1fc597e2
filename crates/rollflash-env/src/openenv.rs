//! An OpenEnv client: environments served by an OpenEnv server (`openenv-core`'s
//! `create_app`/`HTTPEnvServer`) as [`Env`]s.
//!
//! # Protocol (openenv-core 0.3.0, `openenv/core/env_server/http_server.py` and `types.py`)
//!
//! - `GET /health` → `{"status": "healthy"}`; `GET /schema` → `{"action", "observation",
//!   "state"}`, the JSON schemas of the environment's pydantic models.
//! - Episodes run over a WebSocket session on `/ws`: one environment instance per
//!   connection, created when it opens and destroyed when it closes. Client messages are
//!   `{"type": "reset", "data": {"seed": …}}`, `{"type": "step", "data": <action>}`,
//!   `{"type": "state"}` and `{"type": "close"}`; the server answers each of the first three
//!   with `{"type": "observation", "data": {"observation": {…}, "reward": r | null, "done":
//!   bool}}` (or `{"type": "state", "data": {…}}`), or with `{"type": "error", "data":
//!   {"message", "code"}}`. A server at its session limit (`max_concurrent_envs`) answers
//!   the connection with a `CAPACITY_REACHED` error and closes it.
//! - The HTTP `POST /reset` and `POST /step` routes build a fresh environment for every
//!   request and close it after, so they cannot carry a multi-turn episode: this client does
//!   not use them.
//!
//! # Mapping to text
//!
//! - **Action.** The model's text goes into one string field of the action
//!   (`action_field`), next to fixed fields (`action_extra`). Without `action_field`, the
//!   client reads the action schema at start and takes its only string property other than
//!   `metadata` and the fixed fields; with several (or none), it refuses and lists them.
//! - **Observation.** `observation_field` names the observation field that is the prompt
//!   text (a string is taken as is, anything else as its JSON). Without it: the only string
//!   field of the observation, or else the whole observation as JSON. The other fields go to
//!   [`Info`] (numeric ones become trajectory metrics).
//! - **Reward and end.** `reward` (`null` is 0) and `done` (→ `terminated`; OpenEnv has no
//!   truncation flag) come from the reply.
//!
//! One [`OpenEnvClient`] per run holds the HTTP client (one connection pool) and the resolved
//! mapping; each [`OpenEnv`] it makes opens its own session on its first `reset` and sends
//! `close` on [`Env::close`] (dropping one closes the connection, which ends the session on
//! the server too). Every request and message has the configured deadline; a failed message
//! drops the session, so the next `reset` starts a fresh one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::net::TcpStream;
use tokio::sync::OnceCell;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::env::{Env, EnvError, Info, OutOfOrder, RemoteFailure, Reset, Step};

/// Where an OpenEnv server is and how its actions and observations map to text.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenEnvConfig {
    /// Base URL, `http://host:port` (or `ws://`); the session is at `{url}/ws`. TLS
    /// (`https`, `wss`) is not built in: put a local proxy in front.
    pub url: String,
    /// Sent as `Authorization: Bearer <key>` on every request and on the WebSocket
    /// handshake (OpenEnv itself has no auth; a gateway in front may).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Deadline of each HTTP request, WebSocket connect and reply, in seconds.
    pub timeout_secs: f64,
    /// The action's string field that receives the model's text; `None`: the only string
    /// field of the action schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action_field: Option<String>,
    /// Fixed fields sent with every action.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub action_extra: Map<String, Value>,
    /// The observation field that is the text shown to the model; `None`: the only string
    /// field, else the whole observation as JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observation_field: Option<String>,
    /// Extra fields of every reset (besides `seed`), e.g. a task or difficulty.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub reset_extra: Map<String, Value>,
}

impl Default for OpenEnvConfig {
    fn default() -> Self {
        OpenEnvConfig {
            url: String::new(),
            api_key: None,
            timeout_secs: 30.0,
            action_field: None,
            action_extra: Map::new(),
            observation_field: None,
            reset_extra: Map::new(),
        }
    }
}

// By hand, so the API key never reaches a log.
impl std::fmt::Debug for OpenEnvConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenEnvConfig")
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout_secs", &self.timeout_secs)
            .field("action_field", &self.action_field)
            .field("action_extra", &self.action_extra)
            .field("observation_field", &self.observation_field)
            .field("reset_extra", &self.reset_extra)
            .finish()
    }
}

fn config_err(field: &str, reason: impl Into<String>) -> EnvError {
    EnvError::Config {
        field: field.to_string(),
        reason: reason.into(),
    }
}

impl OpenEnvConfig {
    /// `url` with the defaults otherwise.
    pub fn new(url: impl Into<String>) -> Self {
        OpenEnvConfig {
            url: url.into(),
            ..OpenEnvConfig::default()
        }
    }

    /// The per-request deadline.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_secs)
    }

    /// Checks what can be checked without the server; errors name the field.
    pub fn validate(&self) -> Result<(), EnvError> {
        self.urls()?;
        if !(self.timeout_secs > 0.0) || !self.timeout_secs.is_finite() {
            return Err(config_err("timeout_secs", "must be > 0"));
        }
        if let Some(f) = &self.action_field {
            if f.is_empty() {
                return Err(config_err("action_field", "must not be empty"));
            }
            if self.action_extra.contains_key(f) {
                return Err(config_err(
                    "action_extra",
                    format!("sets `{f}`, the action_field the model's text goes into"),
                ));
            }
        }
        if self.observation_field.as_deref() == Some("") {
            return Err(config_err("observation_field", "must not be empty"));
        }
        if self.reset_extra.contains_key("seed") {
            return Err(config_err(
                "reset_extra",
                "sets `seed`, which every reset sends itself (the task seed)",
            ));
        }
        Ok(())
    }

    /// The HTTP base and the WebSocket session URL.
    fn urls(&self) -> Result<(String, String), EnvError> {
        let base = self.url.trim_end_matches('/');
        let (http, ws) = if let Some(rest) = base.strip_prefix("http://") {
            (base.to_string(), format!("ws://{rest}"))
        } else if let Some(rest) = base.strip_prefix("ws://") {
            (format!("http://{rest}"), base.to_string())
        } else if base.starts_with("https://") || base.starts_with("wss://") {
            return Err(config_err(
                "url",
                "TLS is not built in: use http:// (a local TLS proxy can front a remote server)",
            ));
        } else {
            return Err(config_err(
                "url",
                format!("`{}` is not an http:// or ws:// URL", self.url),
            ));
        };
        if http.len() <= "http://".len() {
            return Err(config_err("url", "has no host"));
        }
        Ok((http, format!("{ws}/ws")))
    }
}

/// What the start-up check found on the server.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenEnvInfo {
    /// `GET /health`'s `status` (`healthy`).
    pub status: String,
    /// The action field the model's text goes into (configured or read from the schema).
    pub action_field: String,
    /// The action schema's property names.
    pub action_properties: Vec<String>,
    /// The observation schema's property names (without `done`, `reward`, `metadata`, which
    /// the server moves out of the observation).
    pub observation_properties: Vec<String>,
}

/// One run's client of an OpenEnv server, shared by the [`OpenEnv`]s it makes: the HTTP
/// client (one connection pool) and the text mapping, resolved once per run from the
/// server's schema (by [`OpenEnvClient::check`] at start, or by the first `step`).
#[derive(Debug, Clone)]
pub struct OpenEnvClient {
    cfg: OpenEnvConfig,
    http: reqwest::Client,
    base: String,
    ws_url: String,
    resolved: Arc<OnceCell<OpenEnvInfo>>,
}

impl OpenEnvClient {
    /// A client for `cfg` (validated); nothing is sent yet.
    pub fn new(cfg: OpenEnvConfig) -> Result<Self, EnvError> {
        cfg.validate()?;
        let (base, ws_url) = cfg.urls()?;
        let http = reqwest::Client::builder()
            .connect_timeout(cfg.timeout().min(Duration::from_secs(10)))
            .build()
            .map_err(|e| remote(&base, RemoteFailure::Client(e)))?;
        Ok(OpenEnvClient {
            cfg,
            http,
            base,
            ws_url,
            resolved: Arc::new(OnceCell::new()),
        })
    }

    /// [`OpenEnvClient::new`] and [`OpenEnvClient::check`].
    pub async fn connect(cfg: OpenEnvConfig) -> Result<Self, EnvError> {
        let c = OpenEnvClient::new(cfg)?;
        c.check().await?;
        Ok(c)
    }

    /// Checks the server: `GET /health` says healthy, `GET /schema` gives an action the
    /// model's text fits (the action field resolved, see the module docs), and a session on
    /// `/ws` opens (and is closed again). Each step has the configured deadline; a server
    /// that is down is named in the error.
    pub async fn check(&self) -> Result<OpenEnvInfo, EnvError> {
        let info = self.resolve().await?.clone();
        let mut probe = self.env();
        probe.open().await?;
        probe.close().await?;
        Ok(info)
    }

    /// The resolved mapping, fetching it once per run.
    async fn resolve(&self) -> Result<&OpenEnvInfo, EnvError> {
        self.resolved.get_or_try_init(|| self.fetch_info()).await
    }

    async fn fetch_info(&self) -> Result<OpenEnvInfo, EnvError> {
        let base = &self.base;
        let health: Value = get_json(&self.http, &self.cfg, &format!("{base}/health")).await?;
        let status = health
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if status != "healthy" {
            return Err(EnvError::Garbage(format!(
                "{base}/health: status {status:?}, not \"healthy\""
            )));
        }
        let schema_url = format!("{base}/schema");
        let schema: Value = get_json(&self.http, &self.cfg, &schema_url).await?;
        let action = schema.get("action").cloned().unwrap_or(Value::Null);
        let action_field = resolve_action_field(&self.cfg, &action)
            .map_err(|reason| config_err("action_field", format!("{schema_url}: {reason}")))?;
        let observation_properties = properties(schema.get("observation"))
            .into_iter()
            .filter(|p| !matches!(p.as_str(), "done" | "reward" | "metadata"))
            .collect();
        Ok(OpenEnvInfo {
            status,
            action_field,
            action_properties: properties(Some(&action)),
            observation_properties,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &OpenEnvConfig {
        &self.cfg
    }

    /// The HTTP base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// A new environment; its session opens on the first `reset`.
    pub fn env(&self) -> OpenEnv {
        OpenEnv {
            client: self.clone(),
            ws: None,
            state: Episode::None,
        }
    }
}

/// The action field the model's text goes into: the configured one (checked against the
/// schema when it lists properties), or the schema's only free string property.
fn resolve_action_field(cfg: &OpenEnvConfig, action: &Value) -> Result<String, String> {
    let props = action.get("properties").and_then(Value::as_object);
    if let Some(f) = &cfg.action_field {
        return match props {
            Some(p) if !p.contains_key(f) => Err(format!(
                "the action has no field `{f}` (fields: {})",
                p.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
            _ => Ok(f.clone()),
        };
    }
    let Some(props) = props else {
        return Err("the action schema lists no properties; set action_field".into());
    };
    let strings: Vec<&String> = props
        .iter()
        .filter(|(k, v)| {
            k.as_str() != "metadata"
                && !cfg.action_extra.contains_key(k.as_str())
                && v.get("type").and_then(Value::as_str) == Some("string")
        })
        .map(|(k, _)| k)
        .collect();
    match strings.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(format!(
            "the action has no free string field for the model's text (fields: {}); set action_field",
            props.keys().cloned().collect::<Vec<_>>().join(", ")
        )),
        many => Err(format!(
            "the action has several string fields ({}); set action_field to one",
            many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        )),
    }
}

fn properties(schema: Option<&Value>) -> Vec<String> {
    schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

fn remote(url: &str, source: RemoteFailure) -> EnvError {
    EnvError::Remote {
        url: url.to_string(),
        source,
    }
}

async fn get_json(
    http: &reqwest::Client,
    cfg: &OpenEnvConfig,
    url: &str,
) -> Result<Value, EnvError> {
    let mut req = http.get(url).timeout(cfg.timeout());
    if let Some(k) = &cfg.api_key {
        req = req.bearer_auth(k);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| remote(url, RemoteFailure::Transport(e)))?;
    let status = resp.status().as_u16();
    let ok = resp.status().is_success();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| remote(url, RemoteFailure::Transport(e)))?;
    if !ok {
        // FastAPI's errors are `{"detail": …}`.
        let message = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("detail").map(Value::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(200).collect());
        return Err(remote(
            url,
            RemoteFailure::Status {
                status,
                kind: None,
                message,
            },
        ));
    }
    serde_json::from_slice(&bytes).map_err(|source| EnvError::Undecodable {
        url: url.to_string(),
        source,
    })
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Where the session's episode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Episode {
    /// No reset yet on this session.
    None,
    Running,
    Done,
}

/// One OpenEnv session as an [`Env`].
pub struct OpenEnv {
    client: OpenEnvClient,
    ws: Option<Ws>,
    state: Episode,
}

impl std::fmt::Debug for OpenEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenEnv")
            .field("url", &self.client.ws_url)
            .field("connected", &self.ws.is_some())
            .field("state", &self.state)
            .finish()
    }
}

/// The observation part of a reply's `data`.
#[derive(Debug, Deserialize)]
struct ObservationData {
    #[serde(default)]
    observation: Map<String, Value>,
    #[serde(default)]
    reward: Option<f64>,
    #[serde(default)]
    done: bool,
}

impl OpenEnv {
    /// Whether a session is open.
    pub fn connected(&self) -> bool {
        self.ws.is_some()
    }

    /// The session environment's state (`{"type": "state"}`), e.g. `episode_id` and
    /// `step_count`.
    pub async fn state(&mut self) -> Result<Map<String, Value>, EnvError> {
        if self.ws.is_none() {
            return Err(EnvError::OutOfOrder(OutOfOrder::StepBeforeReset {
                env: format!("openenv {}", self.client.base),
            }));
        }
        let reply = self
            .call(serde_json::json!({"type": "state"}), "state")
            .await?;
        match reply {
            Value::Object(m) => Ok(m),
            other => Err(EnvError::Garbage(format!(
                "{}: state is not an object: {other}",
                self.client.ws_url
            ))),
        }
    }

    async fn open(&mut self) -> Result<(), EnvError> {
        let url = &self.client.ws_url;
        let mut req = url
            .as_str()
            .into_client_request()
            .map_err(|e| remote(url, RemoteFailure::WebSocket(Box::new(e))))?;
        if let Some(k) = &self.client.cfg.api_key {
            let v = HeaderValue::from_str(&format!("Bearer {k}"))
                .map_err(|_| config_err("api_key", "is not a valid header value"))?;
            req.headers_mut().insert("authorization", v);
        }
        let deadline = self.client.cfg.timeout();
        let (ws, _) = tokio::time::timeout(deadline, tokio_tungstenite::connect_async(req))
            .await
            .map_err(|_| remote(url, RemoteFailure::Timeout(deadline)))?
            .map_err(|e| remote(url, RemoteFailure::WebSocket(Box::new(e))))?;
        self.ws = Some(ws);
        self.state = Episode::None;
        Ok(())
    }

    /// Sends `msg` and returns the reply's `data`; any failure drops the session.
    async fn call(&mut self, msg: Value, what: &str) -> Result<Value, EnvError> {
        let r = self.exchange(msg, what).await;
        if r.is_err() {
            self.ws = None;
            self.state = Episode::None;
        }
        r
    }

    async fn exchange(&mut self, msg: Value, what: &str) -> Result<Value, EnvError> {
        let url = self.client.ws_url.clone();
        let deadline = self.client.cfg.timeout();
        let ws = self
            .ws
            .as_mut()
            .ok_or_else(|| remote(&url, RemoteFailure::Closed(Some("not connected".into()))))?;
        let exchange = async {
            ws.send(Message::text(msg.to_string()))
                .await
                .map_err(|e| remote(&url, RemoteFailure::WebSocket(Box::new(e))))?;
            loop {
                let frame = match ws.next().await {
                    None => return Err(remote(&url, RemoteFailure::Closed(None))),
                    Some(f) => {
                        f.map_err(|e| remote(&url, RemoteFailure::WebSocket(Box::new(e))))?
                    }
                };
                match frame {
                    Message::Text(t) => return Ok(t.to_string()),
                    Message::Close(c) => {
                        let reason = c
                            .map(|c| format!("{} {}", u16::from(c.code), c.reason))
                            .filter(|r| !r.trim().is_empty());
                        return Err(remote(&url, RemoteFailure::Closed(reason)));
                    }
                    Message::Binary(_) => {
                        return Err(EnvError::Garbage(format!(
                            "{url}: a binary frame in reply to {what}"
                        )))
                    }
                    // Pings are answered by tungstenite itself.
                    Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
                }
            }
        };
        let text = tokio::time::timeout(deadline, exchange)
            .await
            .map_err(|_| remote(&url, RemoteFailure::Timeout(deadline)))??;
        let reply: Value = serde_json::from_str(&text).map_err(|source| EnvError::Undecodable {
            url: url.clone(),
            source,
        })?;
        let kind = reply
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let data = reply.get("data").cloned().unwrap_or(Value::Null);
        match kind {
            "error" => {
                let field = |k: &str| {
                    data.get(k)
                        .map(|v| {
                            v.as_str()
                                .map(str::to_string)
                                .unwrap_or_else(|| v.to_string())
                        })
                        .unwrap_or_default()
                };
                let mut message = field("message");
                if let Some(errors) = data.get("errors") {
                    message.push_str(&format!(": {errors}"));
                }
                Err(remote(
                    &url,
                    RemoteFailure::Session {
                        code: field("code"),
                        message,
                    },
                ))
            }
            "observation" | "state" => Ok(data),
            other => Err(EnvError::Garbage(format!(
                "{url}: reply of type {other:?} to {what}"
            ))),
        }
    }

    fn observation(&self, data: Value, what: &str) -> Result<(String, f64, bool, Info), EnvError> {
        let url = &self.client.ws_url;
        let d: ObservationData = serde_json::from_value(data).map_err(|e| {
            EnvError::Garbage(format!("{url}: {what} reply is not an observation: {e}"))
        })?;
        let reward = d.reward.unwrap_or(0.0);
        if !reward.is_finite() {
            return Err(EnvError::Garbage(format!("{url}: non-finite reward")));
        }
        let mut info = d.observation;
        let text = match &self.client.cfg.observation_field {
            Some(f) => match info.remove(f) {
                Some(Value::String(s)) => s,
                Some(v) => v.to_string(),
                None => {
                    return Err(EnvError::Garbage(format!(
                        "{url}: the observation has no field `{f}` (observation_field)"
                    )))
                }
            },
            None => {
                let strings: Vec<&String> = info
                    .iter()
                    .filter(|(_, v)| v.is_string())
                    .map(|(k, _)| k)
                    .collect();
                match strings.as_slice() {
                    [one] => {
                        let key = (*one).clone();
                        match info.remove(&key) {
                            Some(Value::String(s)) => s,
                            _ => String::new(),
                        }
                    }
                    _ => Value::Object(std::mem::take(&mut info)).to_string(),
                }
            }
        };
        Ok((text, reward, d.done, info))
    }
}

#[async_trait]
impl Env for OpenEnv {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        if self.ws.is_none() {
            self.open().await?;
        }
        let mut data = self.client.cfg.reset_extra.clone();
        data.insert("seed".into(), Value::from(seed));
        let reply = self
            .call(serde_json::json!({"type": "reset", "data": data}), "reset")
            .await?;
        let (observation, _, done, info) = self.observation(reply, "reset")?;
        self.state = if done {
            Episode::Done
        } else {
            Episode::Running
        };
        Ok(Reset { observation, info })
    }

    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let env = || format!("openenv {}", self.client.base);
        match (self.ws.is_some(), self.state) {
            (true, Episode::Running) => {}
            (_, Episode::Done) => {
                return Err(EnvError::OutOfOrder(OutOfOrder::StepAfterEnd {
                    env: env(),
                }))
            }
            _ => {
                return Err(EnvError::OutOfOrder(OutOfOrder::StepBeforeReset {
                    env: env(),
                }))
            }
        }
        let field = self.client.resolve().await?.action_field.clone();
        let mut data = self.client.cfg.action_extra.clone();
        data.insert(field, Value::String(action.to_string()));
        let reply = self
            .call(serde_json::json!({"type": "step", "data": data}), "step")
            .await?;
        let (observation, reward, done, info) = self.observation(reply, "step")?;
        if done {
            self.state = Episode::Done;
        }
        Ok(Step {
            observation,
            reward,
            terminated: done,
            truncated: false,
            info,
        })
    }

    /// Ends the session: `{"type": "close"}`, then the WebSocket close handshake, within the
    /// deadline. The server destroys the session's environment either way once the
    /// connection is gone.
    async fn close(&mut self) -> Result<(), EnvError> {
        let Some(mut ws) = self.ws.take() else {
            return Ok(());
        };
        self.state = Episode::None;
        let url = self.client.ws_url.clone();
        let deadline = self.client.cfg.timeout();
        let close = async {
            ws.send(Message::text(r#"{"type":"close"}"#))
                .await
                .map_err(|e| remote(&url, RemoteFailure::WebSocket(Box::new(e))))?;
            // The server closes its side after `close`; read until it does.
            match ws.close(None).await {
                Ok(()) => {}
                Err(tokio_tungstenite::tungstenite::Error::ConnectionClosed)
                | Err(tokio_tungstenite::tungstenite::Error::AlreadyClosed) => return Ok(()),
                Err(e) => return Err(remote(&url, RemoteFailure::WebSocket(Box::new(e)))),
            }
            while let Some(f) = ws.next().await {
                if f.is_err() {
                    break;
                }
            }
            Ok(())
        };
        tokio::time::timeout(deadline, close)
            .await
            .map_err(|_| remote(&url, RemoteFailure::Timeout(deadline)))?
    }
}
