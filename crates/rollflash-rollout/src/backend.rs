//! The `Backend` trait: one seam for everything that generates — the embedded engine or a
//! remote server — and the types it speaks.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
pub use rollflash_core::PauseMode;
use rollflash_core::{GenOutput, GenRequest, Generated, PolicyVersion, RequestId};
use rollflash_model::model::Transformer;

/// New policy weights for a backend.
#[derive(Clone)]
pub enum WeightUpdate {
    /// Weights already in this process (the embedded engine swaps an `Arc`, no copy).
    InProcess {
        model: Arc<Transformer>,
        version: PolicyVersion,
    },
    /// A Hugging Face directory the trainer wrote (remote servers reload from it).
    Disk {
        path: PathBuf,
        version: PolicyVersion,
    },
    /// Weights a remote trainer holds, named by its URI (a Tinker server's `tinker://…`
    /// sampler path): only backends of that server can load them.
    Remote { uri: String, version: PolicyVersion },
    /// A LoRA adapter in PEFT's layout (`adapter_config.json`, `adapter_model.safetensors`)
    /// for the base model the server already holds: the server loads it under `name` and
    /// applies it unmerged; generation names the adapter, so a few MB move per version
    /// instead of the whole model.
    Adapter {
        dir: PathBuf,
        name: String,
        version: PolicyVersion,
    },
}

impl WeightUpdate {
    /// The version these weights are.
    pub fn version(&self) -> PolicyVersion {
        match self {
            WeightUpdate::InProcess { version, .. }
            | WeightUpdate::Disk { version, .. }
            | WeightUpdate::Remote { version, .. }
            | WeightUpdate::Adapter { version, .. } => *version,
        }
    }
}

impl std::fmt::Debug for WeightUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightUpdate::InProcess { version, .. } => f
                .debug_struct("InProcess")
                .field("version", version)
                .finish(),
            WeightUpdate::Disk { path, version } => f
                .debug_struct("Disk")
                .field("path", path)
                .field("version", version)
                .finish(),
            WeightUpdate::Remote { uri, version } => f
                .debug_struct("Remote")
                .field("uri", uri)
                .field("version", version)
                .finish(),
            WeightUpdate::Adapter { dir, name, version } => f
                .debug_struct("Adapter")
                .field("dir", dir)
                .field("name", name)
                .field("version", version)
                .finish(),
        }
    }
}

/// How busy a backend is, for routing and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendLoad {
    /// Requests generating now.
    pub running: usize,
    /// Requests accepted but waiting for a slot inside the backend.
    pub waiting: usize,
    /// The policy version of the weights it serves.
    pub version: PolicyVersion,
}

/// An error of any type: the causes of a backend failure are open (a transport or decoding
/// error, io, a joined task, the engine).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a backend call failed.
///
/// Where an underlying error caused it, that error is the `source`; messages include its text
/// too, so `to_string()` alone (a retry's reason, a log line) still says what happened.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The request itself is invalid (bad params, prompt too long); retrying will not help.
    /// `source` is the engine's error when the engine refused it.
    #[error("invalid request: {reason}{}", cause(.source))]
    InvalidRequest {
        reason: String,
        #[source]
        source: Option<BoxError>,
    },
    /// The backend could not be reached or failed; the request may be retried elsewhere.
    /// `source` is the transport (or spawn, or task) error, when there is one.
    #[error("backend {backend} unavailable: {reason}{}", cause(.source))]
    Unavailable {
        backend: String,
        reason: String,
        #[source]
        source: Option<BoxError>,
    },
    /// The backend did not answer in time.
    #[error("backend {backend} timed out after {secs:.1}s")]
    Timeout { backend: String, secs: f64 },
    /// The backend answered with something we cannot interpret. `source` is the decoding
    /// error, when there is one.
    #[error("backend {backend} protocol error: {reason}{}", cause(.source))]
    Protocol {
        backend: String,
        reason: String,
        #[source]
        source: Option<BoxError>,
    },
    /// The backend cannot perform this operation (e.g. in-process weights over HTTP).
    #[error("backend {backend} does not support {what}")]
    Unsupported { backend: String, what: String },
    /// The backend was shut down.
    #[error("backend {0} is shut down")]
    Shutdown(String),
    /// The engine failed.
    #[error("engine error")]
    Engine(#[from] rollflash_model::ModelError),
}

/// `": "` and the text of `source` with its own causes (a `reqwest` error's `Display` alone
/// hides the one that matters: connection refused, timed out), or nothing.
fn cause(source: &Option<BoxError>) -> String {
    match source {
        Some(e) => format!(": {}", error_chain(e.as_ref())),
        None => String::new(),
    }
}

impl BackendError {
    /// Whether the same request may succeed on another try or another backend.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            BackendError::Unavailable { .. }
                | BackendError::Timeout { .. }
                | BackendError::Shutdown(_)
        )
    }
}

/// The log-probs at one position of a scored sequence: of the token there, and of the most
/// likely tokens (best first), all under `log_softmax(logits / temperature)`.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenScore {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Something that generates tokens with log-probs.
///
/// Contract (checked by the conformance suite in `tests/it/conformance.rs` against every
/// implementation):
/// - `generate` returns the whole output, including any `resume` part, with one log-prob
///   and one version per token; `start_version` is copied from the request.
/// - An aborted request (by `abort`, or by `pause(Abort)`) is not an error: it returns
///   `FinishReason::Aborted` with the tokens generated so far.
/// - While paused, `generate` accepts requests but starts no new tokens until `resume`.
/// - `update_weights` changes the version of every token generated after it returns.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A short name for logs and metrics (e.g. `engine-0`, `http://127.0.0.1:30000`).
    fn name(&self) -> &str;
    /// Generates one request to completion (or abort).
    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError>;
    /// Aborts one request; its `generate` returns with `FinishReason::Aborted`. Unknown or
    /// finished ids are ignored.
    async fn abort(&self, id: RequestId) -> Result<(), BackendError>;
    /// Stops generating. `Abort` aborts everything in flight; `Keep` holds it in place.
    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError>;
    /// Continues after `pause`.
    async fn resume(&self) -> Result<(), BackendError>;
    /// Loads new weights; returns when tokens are generated with them.
    async fn update_weights(&self, update: &WeightUpdate) -> Result<(), BackendError>;
    /// Current load and version.
    async fn load(&self) -> Result<BackendLoad, BackendError>;
    /// Ok when the backend can serve.
    async fn health(&self) -> Result<(), BackendError>;

    /// As `generate`, and sends the new tokens (after any resumed part) to `tokens` as they
    /// are sampled, in order; what the returned output holds beyond what was sent is sent by
    /// nobody (the caller takes the tail from the output). The default sends nothing.
    async fn generate_stream(
        &self,
        req: GenRequest,
        tokens: tokio::sync::mpsc::UnboundedSender<Generated>,
    ) -> Result<GenOutput, BackendError> {
        drop(tokens);
        self.generate(req).await
    }

    /// Scores `tokens` under the current weights: entry `i` is about `tokens[i + 1]` given
    /// `tokens[..=i]`, with the `top` most likely alternatives (`temperature` > 0). Backends
    /// that hold no model answer `Unsupported` (the default).
    async fn score(
        &self,
        tokens: &[u32],
        temperature: f64,
        top: usize,
    ) -> Result<Vec<TokenScore>, BackendError> {
        let _ = (tokens, temperature, top);
        Err(BackendError::Unsupported {
            backend: self.name().to_string(),
            what: "scoring token sequences (prompt log-probs, top log-prob alternatives)".into(),
        })
    }
}

/// One home for how an error prints with its causes: the core's.
pub(crate) use rollflash_core::error_chain;
