//! The HTTP server behind `rollflash serve`: any [`Backend`] behind the SGLang-native API
//! (`sglang.rs`) and the OpenAI-compatible API (`openai.rs`).
//!
//! This module holds what both APIs share: the configuration, the request registry that gives
//! every generation a server-side [`RequestId`] (and maps SGLang `rid` strings to it), the
//! JSON error shape, the body extractor that turns serde failures into 400s naming the field,
//! API-key checking in constant time, and graceful shutdown.
//!
//! LoRA adapters (with an [`AdapterHost`]): `/load_lora_adapter` and `/v1/load_lora_adapter`
//! `{lora_name, lora_path}` open a backend serving the base with the adapter applied
//! unmerged, under `lora_name`; SGLang's `/generate` names it in `lora_path`, the OpenAI
//! routes in `model`; `/unload_lora_adapter` and `/v1/unload_lora_adapter` drop it. Adapter
//! directories are subject to the same [`WeightsAccess`] as checkpoints. Pause, resume and
//! abort reach the base and every adapter.
//!
//! Wire types live only in this module and in `crate::http`; the rest of the crate speaks
//! [`GenRequest`]/[`GenOutput`].

mod openai;
mod sglang;
mod text;

pub(crate) use sglang::parse_version;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rollflash_core::{GenOutput, GenRequest, Generated, PolicyVersion, RequestId, SamplingParams};
use rollflash_model::chat::ChatTemplate;
use rollflash_model::tokenizer::Tokenizer;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::backend::error_chain;
use crate::backend::{Backend, BackendError};

/// Where `POST /update_weights_from_disk` may load checkpoints from.
///
/// Loading a directory named by a client reads arbitrary files as the server's user, so it is
/// off unless the operator says where checkpoints live.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WeightsAccess {
    /// Every disk load is refused (403) with a message saying how to enable it.
    #[default]
    Disabled,
    /// Only directories under this root (after resolving `..` and symlinks of both) load;
    /// relative `model_path`s are taken relative to it.
    Under(PathBuf),
    /// Any directory the server can read (`--allow-weights-from-anywhere`): for trusted
    /// single-user setups only.
    Anywhere,
}

/// Settings of one server; [`ServerConfig::default`] holds every default.
#[derive(Clone, PartialEq)]
pub struct ServerConfig {
    /// Reported by `/v1/models` and `/get_model_info`; OpenAI requests naming another model get
    /// 404, as vLLM does, so a client pointed at the wrong server finds out.
    pub model_name: String,
    /// When set, every route but `GET /health` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Request bodies larger than this are refused with 413 before they are parsed.
    pub max_body_bytes: usize,
    /// Which checkpoint directories clients may ask the server to load.
    pub weights: WeightsAccess,
    /// The model's end-of-sequence tokens: generation stops at them unless a request says
    /// `ignore_eos` (SGLang and vLLM do the same).
    pub eos_token_ids: Vec<u32>,
    /// `max_tokens` of a chat completion that does not give one.
    pub default_chat_max_tokens: usize,
    /// The model's vocabulary (rows of its output layer), reported by `/get_model_info` so a
    /// trainer can check that its model and this server's agree before it sends token ids.
    pub vocab_size: Option<usize>,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is a secret: never print it, only whether there is one.
        f.debug_struct("ServerConfig")
            .field("model_name", &self.model_name)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("weights", &self.weights)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("default_chat_max_tokens", &self.default_chat_max_tokens)
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_name: "rollflash".to_string(),
            api_key: None,
            max_body_bytes: 4 << 20,
            weights: WeightsAccess::Disabled,
            eos_token_ids: Vec::new(),
            default_chat_max_tokens: 256,
            vocab_size: None,
        }
    }
}

/// Opens backends serving the base model with a PEFT LoRA adapter applied (for
/// `rollflash serve`: an engine on [`crate::adapted_model`] of its weights).
#[async_trait::async_trait]
pub trait AdapterHost: Send + Sync {
    /// A backend serving the adapter in `dir`, its tokens labelled `version`.
    async fn open(
        &self,
        dir: &Path,
        version: PolicyVersion,
    ) -> Result<Arc<dyn Backend>, BackendError>;
}

/// Everything the server serves: the backend, the text side of the model, and the settings.
pub struct ServerState {
    /// Generates; the server only translates wire formats in front of it.
    pub backend: Arc<dyn Backend>,
    /// Turns `text` prompts into ids and outputs into text; without one, only token-id prompts
    /// are accepted and outputs carry empty text.
    pub tokenizer: Option<Tokenizer>,
    /// Renders `/v1/chat/completions` messages; without one that route answers 400.
    pub chat_template: Option<ChatTemplate>,
    pub config: ServerConfig,
    /// Serves LoRA adapters loaded at run time; without one the adapter routes answer 400.
    pub adapters: Option<Arc<dyn AdapterHost>>,
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A setting is out of range.
    #[error("invalid server config: {0}")]
    Config(String),
    /// The weights root does not exist or cannot be resolved.
    #[error("weights root {path} cannot be resolved")]
    WeightsRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Accepting or serving connections failed.
    #[error("HTTP server failed")]
    Io(#[from] std::io::Error),
}

/// Serves `state` on `listener` until `shutdown` completes.
///
/// On shutdown the server stops accepting connections, aborts every generation still running
/// (their clients get the partial output with an `abort` finish reason, so no work vanishes
/// silently), waits for open requests to answer, and returns once the task that forwards
/// aborts to the backend has drained.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let cfg = state.config;
    if cfg.max_body_bytes == 0 {
        return Err(ServerError::Config(
            "max_body_bytes must be positive".into(),
        ));
    }
    let weights_root = match &cfg.weights {
        WeightsAccess::Under(root) => {
            Some(
                std::fs::canonicalize(root).map_err(|source| ServerError::WeightsRoot {
                    path: root.clone(),
                    source,
                })?,
            )
        }
        _ => None,
    };
    let (abort_tx, abort_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        backend: Arc::clone(&state.backend),
        adapter_host: state.adapters,
        adapters: Mutex::new(HashMap::new()),
        tokenizer: state.tokenizer,
        chat_template: state.chat_template,
        weights_root,
        next_id: AtomicU64::new(1),
        inflight: Mutex::new(Inflight::default()),
        abort_tx,
        shutting_down: AtomicBool::new(false),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        cfg,
    });
    let aborter = tokio::spawn(forward_aborts(Arc::clone(&shared), abort_rx));
    let app = router(Arc::clone(&shared));
    let on_shutdown = {
        let shared = Arc::clone(&shared);
        async move {
            shutdown.await;
            shared.begin_shutdown();
        }
    };
    tracing::info!(addr = ?listener.local_addr().ok(), model = %shared.cfg.model_name, "serving");
    drop(shared);
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(on_shutdown)
        .await;
    // The router (and with it the last sender of aborts) is gone once `serve` returns: the
    // forwarding task drains what was sent and ends.
    if let Err(e) = aborter.await {
        tracing::warn!("abort forwarding task failed: {e}");
    }
    served.map_err(ServerError::from)
}

/// Forwards aborts of generations whose HTTP request went away (client disconnect, shutdown)
/// to the backend. `Drop` cannot await, so guards send here instead.
async fn forward_aborts(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<RequestId>) {
    // Holds the state only through a weak reference: the router going away must still end
    // this task (the channel closes once the last `Shared` is dropped).
    let weak = Arc::downgrade(&shared);
    drop(shared);
    while let Some(id) = rx.recv().await {
        let Some(shared) = weak.upgrade() else { break };
        for backend in shared.all_backends() {
            if let Err(e) = backend.abort(id).await {
                tracing::warn!(%id, "abort of an abandoned request failed: {}", error_chain(&e));
            }
        }
    }
}

/// The router: SGLang-native and OpenAI routes behind the API-key check, `GET /health`
/// outside it (for liveness probes), JSON errors for unknown routes and methods.
fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.cfg.max_body_bytes;
    let protected = Router::new()
        .route("/generate", post(sglang::generate))
        .route("/pause_generation", post(sglang::pause_generation))
        .route("/continue_generation", post(sglang::continue_generation))
        .route("/abort_request", post(sglang::abort_request))
        .route(
            "/update_weights_from_disk",
            post(sglang::update_weights_from_disk),
        )
        .route(
            "/flush_cache",
            post(sglang::flush_cache).get(sglang::flush_cache),
        )
        .route("/get_model_info", get(sglang::get_model_info))
        .route("/get_server_info", get(sglang::get_server_info))
        .route("/get_weight_version", get(sglang::get_weight_version))
        .route("/load_lora_adapter", post(sglang::load_lora_adapter))
        .route("/unload_lora_adapter", post(sglang::unload_lora_adapter))
        .route("/v1/load_lora_adapter", post(openai::load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(openai::unload_lora_adapter))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/models", get(openai::models))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            Arc::clone(&shared),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(sglang::health))
        .merge(protected)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(shared)
}

/// Loaded adapters by name: their directory and the backend serving them.
type AdapterMap = HashMap<String, (PathBuf, Arc<dyn Backend>)>;

/// State shared by all handlers.
pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn Backend>,
    adapter_host: Option<Arc<dyn AdapterHost>>,
    /// Loaded adapters by name: their directory and the backend serving them.
    adapters: Mutex<AdapterMap>,
    pub(crate) tokenizer: Option<Tokenizer>,
    pub(crate) chat_template: Option<ChatTemplate>,
    pub(crate) cfg: ServerConfig,
    /// `WeightsAccess::Under`'s root, resolved once at start.
    weights_root: Option<PathBuf>,
    /// Server-side request ids: clients' ids are not trusted to be unique.
    next_id: AtomicU64,
    /// Generations in flight. A std `Mutex` is right here: the critical sections are a few
    /// map operations and never cross an `.await`.
    inflight: Mutex<Inflight>,
    abort_tx: mpsc::UnboundedSender<RequestId>,
    /// Set when shutdown begins: new generations are refused with 503.
    shutting_down: AtomicBool,
    /// Unix time the server started, reported as `created` by `/v1/models`.
    pub(crate) created: u64,
}

/// Generations in flight, by server id and by client `rid`.
#[derive(Default)]
struct Inflight {
    ids: HashSet<RequestId>,
    rids: HashMap<String, RequestId>,
}

impl Shared {
    fn inflight(&self) -> MutexGuard<'_, Inflight> {
        // A panic while holding the lock leaves two maps that are still consistent enough to
        // go on with (worst case a stale entry); poisoning must not take the server down.
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops taking generations and aborts those in flight. The flag is set under the
    /// registry lock, which registration also takes, so no generation slips in unaborted.
    fn begin_shutdown(&self) {
        let inflight = self.inflight();
        self.shutting_down.store(true, Ordering::SeqCst);
        let ids: Vec<RequestId> = inflight.ids.iter().copied().collect();
        drop(inflight);
        tracing::info!(
            inflight = ids.len(),
            "shutting down: aborting generations in flight"
        );
        for id in ids {
            let _ = self.abort_tx.send(id);
        }
    }

    fn adapter_map(&self) -> MutexGuard<'_, AdapterMap> {
        self.adapters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The base backend and every adapter's: what pause, resume and abort reach.
    pub(crate) fn all_backends(&self) -> Vec<Arc<dyn Backend>> {
        let mut all = vec![Arc::clone(&self.backend)];
        all.extend(self.adapter_map().values().map(|(_, b)| Arc::clone(b)));
        all
    }

    /// The backend a request naming `adapter` runs on (the base for `None`); 404 naming the
    /// loaded ones for an unknown name.
    pub(crate) fn backend_for(&self, adapter: Option<&str>) -> Result<Arc<dyn Backend>, ApiError> {
        let Some(name) = adapter else {
            return Ok(Arc::clone(&self.backend));
        };
        let map = self.adapter_map();
        match map.get(name) {
            Some((_, b)) => Ok(Arc::clone(b)),
            None => {
                let mut names: Vec<&String> = map.keys().collect();
                names.sort();
                Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("no adapter `{name}` is loaded (loaded: {names:?})"),
                ))
            }
        }
    }

    /// Whether `name` is a loaded adapter.
    pub(crate) fn has_adapter(&self, name: &str) -> bool {
        self.adapter_map().contains_key(name)
    }

    /// The loaded adapters' names and directories.
    pub(crate) fn adapter_list(&self) -> Vec<(String, PathBuf)> {
        let mut v: Vec<(String, PathBuf)> = self
            .adapter_map()
            .iter()
            .map(|(n, (p, _))| (n.clone(), p.clone()))
            .collect();
        v.sort();
        v
    }

    /// Opens the adapter in `path` (checked against [`WeightsAccess`]) under `name`,
    /// replacing one of that name. `version` labels its tokens (default: the base's).
    pub(crate) async fn load_adapter(
        &self,
        name: &str,
        path: &str,
        version: Option<PolicyVersion>,
    ) -> Result<(), ApiError> {
        let host = self
            .adapter_host
            .as_ref()
            .ok_or_else(|| ApiError::bad_request("this server does not serve LoRA adapters"))?;
        if name.is_empty() || name == self.cfg.model_name {
            return Err(ApiError::bad_request(format!(
                "lora_name must be non-empty and not the base model's name; got {name:?}"
            )));
        }
        let dir = self.resolve_weights_dir(path)?;
        let version = match version {
            Some(v) => v,
            None => self
                .backend
                .load()
                .await
                .map(|l| l.version)
                .unwrap_or_default(),
        };
        tracing::info!(adapter = name, dir = %dir.display(), %version, "loading LoRA adapter");
        let backend = host.open(&dir, version).await.map_err(|e| {
            // An adapter that does not load is the request's fault, not the server's.
            let mut err = ApiError::from_backend(&e);
            if matches!(e, BackendError::Engine(_)) {
                err.status = StatusCode::BAD_REQUEST;
            }
            err
        })?;
        self.adapter_map().insert(name.to_string(), (dir, backend));
        Ok(())
    }

    /// Drops the adapter `name`; 404 when none of that name is loaded. Requests running on
    /// it finish (the backend lives while they hold it).
    pub(crate) fn unload_adapter(&self, name: &str) -> Result<(), ApiError> {
        match self.adapter_map().remove(name) {
            Some(_) => Ok(()),
            None => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no adapter `{name}` is loaded"),
            )),
        }
    }

    /// The server id of a client `rid` in flight.
    pub(crate) fn lookup_rid(&self, rid: &str) -> Option<RequestId> {
        self.inflight().rids.get(rid).copied()
    }

    /// Every generation in flight.
    pub(crate) fn inflight_ids(&self) -> Vec<RequestId> {
        self.inflight().ids.iter().copied().collect()
    }

    /// Runs one generation through the backend under a fresh server id.
    ///
    /// `resumed_len` is our extension for resumed requests: the last `resumed_len` of
    /// `input_ids` are output of an earlier attempt. They are handed to the backend as
    /// `GenRequest::resume`, so token `i` keeps using random stream `i` of the seed, and
    /// `max_new_tokens` (which counts new tokens on the wire) is raised by as much. The
    /// returned output holds only the new tokens, as on the wire.
    pub(crate) async fn generate(
        self: &Arc<Self>,
        input_ids: Vec<u32>,
        params: SamplingParams,
        rid: Option<String>,
        resumed_len: usize,
        adapter: Option<&str>,
    ) -> Result<GenOutput, ApiError> {
        self.generate_watched(input_ids, params, rid, resumed_len, adapter, None)
            .await
    }

    /// As [`Shared::generate`], with the new tokens sent to `watch` as they are sampled (when
    /// the backend streams) and the generation aborted when `watch.stop` is notified.
    pub(crate) async fn generate_watched(
        self: &Arc<Self>,
        input_ids: Vec<u32>,
        mut params: SamplingParams,
        rid: Option<String>,
        resumed_len: usize,
        adapter: Option<&str>,
        watch: Option<Watch>,
    ) -> Result<GenOutput, ApiError> {
        let backend = self.backend_for(adapter)?;
        if resumed_len >= input_ids.len() && resumed_len > 0 {
            return Err(ApiError::bad_request(format!(
                "rollflash_resumed_len ({resumed_len}) must be smaller than the number of input ids ({})",
                input_ids.len()
            )));
        }
        params
            .validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let mut prompt = input_ids;
        let resume = (resumed_len > 0).then(|| {
            let tokens = prompt.split_off(prompt.len() - resumed_len);
            // Saturating: a client may send any `max_new_tokens`; overflow must not panic.
            params.max_new_tokens = params.max_new_tokens.saturating_add(resumed_len);
            Generated {
                logprobs: vec![0.0; tokens.len()],
                versions: vec![PolicyVersion::default(); tokens.len()],
                tokens,
            }
        });
        let mut guard = Registration::new(self, id, rid)?;
        let req = GenRequest {
            id,
            prompt,
            params,
            start_version: PolicyVersion::default(),
            resume,
        };
        tracing::debug!(%id, prompt_len = req.prompt.len(), resumed_len, "generate");
        let result = match watch {
            None => backend.generate(req).await,
            Some(w) => {
                let call = backend.generate_stream(req, w.tokens);
                tokio::pin!(call);
                tokio::select! {
                    r = call.as_mut() => r,
                    _ = w.stop.notified() => {
                        if let Err(e) = backend.abort(id).await {
                            tracing::warn!(%id, "abort after a stop string failed: {}", error_chain(&e));
                        }
                        call.await
                    }
                }
            }
        };
        guard.done = true;
        drop(guard);
        let mut out = result.map_err(|e| ApiError::from_backend(&e))?;
        if resumed_len > 0 {
            let new = out.output.tokens.len().saturating_sub(resumed_len);
            out.output.tokens = out.output.tokens.split_off(out.output.tokens.len() - new);
            out.output.logprobs = out
                .output
                .logprobs
                .split_off(out.output.logprobs.len() - new);
            out.output.versions = out
                .output
                .versions
                .split_off(out.output.versions.len() - new);
        }
        tracing::debug!(%id, output_len = out.output.len(), finish = ?out.finish_reason, "generated");
        Ok(out)
    }

    /// Tokenizes a text prompt; 400 when the model has no tokenizer.
    pub(crate) fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, ApiError> {
        let tok = self.tokenizer.as_ref().ok_or_else(|| {
            ApiError::bad_request("this model has no tokenizer: send token ids instead of text")
        })?;
        tok.encode(text, add_special_tokens)
            .map_err(|e| ApiError::bad_request(format!("cannot tokenize: {}", error_chain(&e))))
    }

    /// Detokenizes output, special tokens skipped; empty without a tokenizer.
    pub(crate) fn decode(&self, ids: &[u32]) -> Result<String, ApiError> {
        match &self.tokenizer {
            None => Ok(String::new()),
            Some(tok) => tok.decode(ids, true).map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("cannot detokenize: {}", error_chain(&e)),
                )
            }),
        }
    }

    /// The text of one token for log-prob listings (special tokens kept, so `<eos>` shows).
    pub(crate) fn token_text(&self, id: u32) -> String {
        self.tokenizer
            .as_ref()
            .and_then(|t| t.decode(&[id], false).ok())
            .unwrap_or_default()
    }

    /// Resolves a client-named checkpoint directory against the weights policy.
    ///
    /// Nonexistent paths and paths outside the root get the same 403 and message, so the
    /// route cannot be used to probe which paths exist outside the root.
    pub(crate) fn resolve_weights_dir(&self, requested: &str) -> Result<PathBuf, ApiError> {
        let denied = || {
            ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "model_path `{requested}` is not an existing directory under the weights root"
                ),
            )
        };
        match &self.cfg.weights {
            WeightsAccess::Disabled => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "loading weights from disk is disabled on this server: start it with \
                 --weights-root DIR (or --allow-weights-from-anywhere)",
            )),
            WeightsAccess::Anywhere => {
                let p = std::fs::canonicalize(requested).map_err(|e| {
                    ApiError::bad_request(format!(
                        "model_path `{requested}` cannot be resolved: {e}"
                    ))
                })?;
                if p.is_dir() {
                    Ok(p)
                } else {
                    Err(ApiError::bad_request(format!(
                        "model_path `{requested}` is not a directory"
                    )))
                }
            }
            WeightsAccess::Under(_) => {
                let root = self.weights_root.as_deref().ok_or_else(denied)?;
                let p = Path::new(requested);
                let joined = if p.is_absolute() {
                    p.to_path_buf()
                } else {
                    root.join(p)
                };
                let resolved = std::fs::canonicalize(&joined).map_err(|_| denied())?;
                if resolved.starts_with(root) && resolved.is_dir() {
                    Ok(resolved)
                } else {
                    Err(denied())
                }
            }
        }
    }
}

/// How a caller watches a generation: its new tokens as they come, and a signal to end it.
pub(crate) struct Watch {
    pub(crate) tokens: mpsc::UnboundedSender<Generated>,
    /// Notified once to abort the generation (a stop string matched).
    pub(crate) stop: Arc<tokio::sync::Notify>,
}

/// Keeps a generation in the registry while its HTTP request is open. Dropped without
/// `done` (the client went away, or shutdown dropped the handler), it asks the backend to
/// abort the generation, so a departed client does not keep a slot busy.
struct Registration {
    shared: Arc<Shared>,
    id: RequestId,
    rid: Option<String>,
    done: bool,
}

impl Registration {
    fn new(shared: &Arc<Shared>, id: RequestId, rid: Option<String>) -> Result<Self, ApiError> {
        let mut inflight = shared.inflight();
        if shared.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
            ));
        }
        if let Some(r) = &rid {
            if inflight.rids.contains_key(r) {
                return Err(ApiError::bad_request(format!(
                    "rid `{r}` is already in flight on this server"
                )));
            }
            inflight.rids.insert(r.clone(), id);
        }
        inflight.ids.insert(id);
        drop(inflight);
        Ok(Registration {
            shared: Arc::clone(shared),
            id,
            rid,
            done: false,
        })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut inflight = self.shared.inflight();
        inflight.ids.remove(&self.id);
        if let Some(r) = &self.rid {
            inflight.rids.remove(r);
        }
        drop(inflight);
        if !self.done {
            tracing::debug!(id = %self.id, "request dropped before the generation ended: aborting");
            let _ = self.shared.abort_tx.send(self.id);
        }
    }
}

/// An error answer: `{"error": {"message", "type", "code"}}` with a matching status, the
/// shape OpenAI clients parse.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// Maps a backend failure to a status: the client's fault is 4xx, the backend's 5xx.
    pub(crate) fn from_backend(e: &BackendError) -> Self {
        let status = match e {
            BackendError::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            BackendError::Unavailable { .. } | BackendError::Shutdown(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            BackendError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            BackendError::Protocol { .. } => StatusCode::BAD_GATEWAY,
            BackendError::Unsupported { .. } => StatusCode::NOT_IMPLEMENTED,
            BackendError::Engine(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, error_chain(e))
    }

    /// The OpenAI error `type` for a status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            s if s.is_client_error() => "invalid_request_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            _ => "server_error",
        }
    }

    /// The error object, for routes that add fields next to it.
    pub(crate) fn body(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(
            "error".into(),
            json!({ "message": self.message, "type": self.kind(), "code": self.status.as_u16() }),
        );
        m
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, "{}", self.message);
        } else {
            tracing::debug!(status = %self.status, "{}", self.message);
        }
        (self.status, Json(Value::Object(self.body()))).into_response()
    }
}

/// A JSON request body. Unlike axum's `Json` it does not insist on a `Content-Type` (curl's
/// `-d` sends a form type), answers our error shape, and reports wrong types as 400 with
/// serde's message and the path of the offending field (`sampling_params.temperature: invalid
/// type: string "hot", expected f64 at line 1 column 42`).
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            let status = r.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    status,
                    "request body is larger than the server's limit (--max-body-bytes)",
                )
            } else {
                ApiError::new(status, r.body_text())
            }
        })?;
        if bytes.is_empty() {
            // An empty body means "all defaults" for routes whose fields are all optional.
            return Json::<T>::from_bytes(b"{}")
                .map(|Json(v)| JsonBody(v))
                .map_err(|r| {
                    ApiError::bad_request(format!("request body is empty: {}", r.body_text()))
                });
        }
        Json::<T>::from_bytes(&bytes)
            .map(|Json(v)| JsonBody(v))
            .map_err(|r| ApiError::bad_request(format!("invalid JSON body: {}", r.body_text())))
    }
}

/// Checks `Authorization: Bearer <key>` when a key is configured.
async fn require_api_key(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let Some(expected) = shared.cfg.api_key.as_deref() else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match given {
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing API key: send `Authorization: Bearer <key>`",
        )
        .into_response(),
        Some(key) if constant_time_eq(key.as_bytes(), expected.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::new(StatusCode::UNAUTHORIZED, "invalid API key").into_response(),
    }
}

pub use rollflash_core::auth::constant_time_eq;

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not accept {method}", uri.path()),
    )
}

/// Fields clients commonly send that change what is generated but that this server does not
/// implement, with their neutral values: a request using one is refused rather than silently
/// served as if it had not.
const UNSUPPORTED_SAMPLING: &[(&str, NeutralValue)] = &[
    ("stop", NeutralValue::Empty),
    ("n", NeutralValue::Number(1.0)),
    ("best_of", NeutralValue::Number(1.0)),
    ("min_new_tokens", NeutralValue::Number(0.0)),
    ("min_tokens", NeutralValue::Number(0.0)),
    ("repetition_penalty", NeutralValue::Number(1.0)),
    ("frequency_penalty", NeutralValue::Number(0.0)),
    ("presence_penalty", NeutralValue::Number(0.0)),
    ("min_p", NeutralValue::Number(0.0)),
    ("logit_bias", NeutralValue::Empty),
    ("regex", NeutralValue::Empty),
    ("json_schema", NeutralValue::Empty),
    ("ebnf", NeutralValue::Empty),
    ("response_format", NeutralValue::Empty),
    ("tools", NeutralValue::Empty),
    ("echo", NeutralValue::False),
    ("suffix", NeutralValue::Empty),
];

#[derive(Debug, Clone, Copy)]
enum NeutralValue {
    /// `null`, `""`, `[]` or `{}`.
    Empty,
    Number(f64),
    False,
}

/// Refuses unsupported fields (see [`UNSUPPORTED_SAMPLING`]) set to a non-neutral value;
/// `prefix` names where they were (`sampling_params.`).
pub(crate) fn reject_unsupported(extra: &Map<String, Value>, prefix: &str) -> Result<(), ApiError> {
    for (name, neutral) in UNSUPPORTED_SAMPLING {
        let Some(v) = extra.get(*name) else { continue };
        let neutral_here = match (neutral, v) {
            (_, Value::Null) => true,
            (NeutralValue::Empty, Value::String(s)) => s.is_empty(),
            (NeutralValue::Empty, Value::Array(a)) => a.is_empty(),
            (NeutralValue::Empty, Value::Object(o)) => o.is_empty(),
            (NeutralValue::Number(x), Value::Number(n)) => n.as_f64() == Some(*x),
            (NeutralValue::False, Value::Bool(b)) => !b,
            _ => false,
        };
        if !neutral_here {
            return Err(ApiError::bad_request(format!(
                "{prefix}{name} is not supported by this server"
            )));
        }
    }
    Ok(())
}

/// The stop set of a request: its own stop ids plus the model's eos, or nothing at all with
/// `ignore_eos` (SGLang skips its whole stop-token check then, and so do we).
pub(crate) fn stop_set(shared: &Shared, mut ids: Vec<u32>, ignore_eos: bool) -> Vec<u32> {
    if ignore_eos {
        return Vec::new();
    }
    for &e in &shared.cfg.eos_token_ids {
        if !ids.contains(&e) {
            ids.push(e);
        }
    }
    ids
}

/// `top_k` as SGLang (-1 = off) and vLLM (0 or -1 = off) send it.
pub(crate) fn top_k(k: Option<i64>) -> usize {
    match k {
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_bytes_and_lengths() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn unsupported_fields_are_refused_only_when_set() {
        let ok: Map<String, Value> =
            serde_json::from_str(r#"{"stop": [], "n": 1, "echo": false, "logit_bias": null}"#)
                .unwrap();
        assert!(reject_unsupported(&ok, "").is_ok());
        let bad: Map<String, Value> = serde_json::from_str(r#"{"stop": ["\n"]}"#).unwrap();
        let e = reject_unsupported(&bad, "sampling_params.").unwrap_err();
        assert!(e.message.contains("sampling_params.stop"), "{}", e.message);
    }
}
