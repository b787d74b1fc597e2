//! The one error type of the model crate: what went wrong, with the file, tensor or field named.

use std::path::PathBuf;

use rollflash_core::IoError;

/// Everything that can fail in `rollflash-model`.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A tensor operation failed inside candle.
    #[error("tensor operation failed")]
    Tensor(#[from] candle_core::Error),

    /// A file the model directory must contain is not there.
    #[error("missing {what}: {path}")]
    MissingFile { path: PathBuf, what: &'static str },

    /// A file could not be read or written: what was being done, on which path, and why
    /// (the one shape every crate's I/O failure takes).
    #[error(transparent)]
    Io(#[from] IoError),

    /// A safetensors file is corrupt or truncated.
    #[error("cannot read safetensors file {path}")]
    Safetensors {
        path: PathBuf,
        /// Boxed: keeps `ModelError` (and every error that wraps it) small.
        #[source]
        source: Box<candle_core::Error>,
    },

    /// A JSON file did not parse.
    #[error("invalid JSON in {path}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// A configuration value is missing, of the wrong kind, or inconsistent.
    #[error("invalid model config field `{field}`: {reason}")]
    Config { field: String, reason: String },

    /// The checkpoint's architecture is not one we implement.
    #[error("unsupported architecture `{0}` (supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)")]
    UnsupportedArchitecture(String),

    /// A tensor the architecture needs is absent from the checkpoint.
    #[error("checkpoint has no tensor `{name}`")]
    MissingTensor { name: String },

    /// A tensor has a different shape than the config implies.
    #[error("tensor `{name}` has shape {got:?}, config implies {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },

    /// A tensor is stored in a dtype we cannot load.
    #[error("tensor `{name}` has unsupported dtype {dtype}")]
    UnsupportedDtype { name: String, dtype: String },

    /// The tokenizer failed to load or to encode/decode.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),

    /// The chat template failed to parse or render.
    #[error("chat template error")]
    Template(#[source] minijinja::Error),

    /// A GGUF file could not be read or converted.
    #[error("GGUF error: {0}")]
    Gguf(String),

    /// A request to the engine or trainer was malformed (bad token id, empty prompt, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// A thread pool could not be built.
    #[error("could not build a thread pool of {threads} threads")]
    ThreadPool {
        threads: usize,
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
}

/// Result alias for the model crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl From<rollflash_core::InvalidParams> for ModelError {
    fn from(e: rollflash_core::InvalidParams) -> Self {
        ModelError::InvalidRequest(e.0)
    }
}
