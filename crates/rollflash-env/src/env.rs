//! The `Env` trait: the Gymnasium / GEM shape (`reset(seed)`, `step(action)`) over text, and
//! the errors its calls end in.

use async_trait::async_trait;
use rollflash_core::error_chain;

/// Free-form details an environment reports next to an observation (as Gymnasium's `info`).
pub type Info = serde_json::Map<String, serde_json::Value>;

/// What `reset` returns: the first observation (for a language model, the task statement
/// including any instructions) and `info`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reset {
    pub observation: String,
    pub info: Info,
}

/// The `Reset::info` key under which an environment may give its first observation as chat
/// messages, `[{"role": …, "content": …}]` (the dataset task does): a renderer with a chat
/// template renders those instead of one user message holding `observation`, which stays
/// the plain-text form.
pub const PROMPT_MESSAGES: &str = "messages";

impl Reset {
    /// The first observation as chat messages, when `info` carries them (see
    /// [`PROMPT_MESSAGES`]); `None` when absent or not a list of `{role, content}` strings.
    pub fn messages(&self) -> Option<Vec<crate::dataset::PromptMessage>> {
        let v = self.info.get(PROMPT_MESSAGES)?;
        serde_json::from_value::<Vec<crate::dataset::PromptMessage>>(v.clone())
            .ok()
            .filter(|m| !m.is_empty())
    }
}

/// What `step` returns, with Gymnasium's meanings: `terminated` when the episode reached a
/// terminal state of the task (solved, failed, fell in a hole), `truncated` when it was cut
/// short for an outside reason (step limit).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    pub observation: String,
    pub reward: f64,
    pub terminated: bool,
    pub truncated: bool,
    pub info: Info,
}

impl Step {
    /// Whether the episode is over.
    pub fn done(&self) -> bool {
        self.terminated || self.truncated
    }
}

/// An error of any type, for causes that are open-ended (a panicked worker task, a generated
/// task that does not evaluate).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an environment call failed. A failed call costs its trajectory, never the run.
///
/// Messages include their causes, so `to_string()` alone says what happened; `source()` gives
/// the underlying error itself.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The environment itself failed (crashed, injected failure).
    #[error("environment failed: {0}")]
    Failed(String),
    /// The environment failed on an underlying error of its own; `what` says where.
    #[error("environment failed: {what}")]
    Internal {
        what: String,
        #[source]
        source: BoxError,
    },
    /// The environment returned something that is not a valid observation or reward.
    #[error("environment returned garbage: {0}")]
    Garbage(String),
    /// A remote environment answered a call with success, but with a body that is not the
    /// protocol's JSON.
    #[error("environment returned garbage: {url}: undecodable reply")]
    Undecodable {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    /// `step` was called before `reset` or after the episode ended.
    #[error("environment used out of order: {0}")]
    OutOfOrder(OutOfOrder),
    /// A configuration value is invalid; the message names the field.
    #[error("invalid environment config `{field}`: {reason}")]
    Config { field: String, reason: String },
    /// A dataset task's files could not be loaded or hold a bad row; the message names the
    /// file, the row and the field.
    /// Boxed: the row's details would make every `EnvError` (and the errors holding one)
    /// larger.
    #[error(transparent)]
    Data(Box<crate::dataset::DataError>),
    /// A remote environment could not be reached or answered with an error.
    #[error("remote environment {url}")]
    Remote {
        /// The request's URL.
        url: String,
        #[source]
        source: RemoteFailure,
    },
}

impl From<crate::dataset::DataError> for EnvError {
    fn from(e: crate::dataset::DataError) -> Self {
        EnvError::Data(Box::new(e))
    }
}

/// What was out of order in a call to an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutOfOrder {
    /// `step` before the first `reset`; `env` names the environment.
    StepBeforeReset { env: String },
    /// `step` after the episode ended, without a `reset` in between.
    StepAfterEnd { env: String },
    /// A remote server refused the call as out of order (`409`). Which of the above it was is
    /// only in the server's message, `reply` (status, kind and message).
    Remote { url: String, reply: String },
}

impl std::fmt::Display for OutOfOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutOfOrder::StepBeforeReset { env } => write!(f, "{env}: step before reset"),
            OutOfOrder::StepAfterEnd { env } => {
                write!(f, "{env}: step after the episode ended; call reset")
            }
            OutOfOrder::Remote { url, reply } => write!(f, "{url}: {reply}"),
        }
    }
}

/// Why a request to a remote environment failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteFailure {
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {}", error_chain(.0))]
    Client(#[source] reqwest::Error),
    /// No answer, or not all of one: connection refused or reset, timeout, a body cut off.
    /// `reqwest::Error::is_timeout` tells a timeout apart.
    #[error("{}", error_chain(.0))]
    Transport(#[source] reqwest::Error),
    /// The server answered with an error status. `kind` and `message` are those of the
    /// protocol's error body; for another body, no kind and the body's start as the message.
    #[error("{status}{}: {message}", kind.as_ref().map(|k| format!(" {k}")).unwrap_or_default())]
    Status {
        status: u16,
        kind: Option<String>,
        message: String,
    },
    /// A WebSocket session failed: the handshake was refused, the connection was lost, or a
    /// frame could not be sent or read. Boxed: tungstenite's error is large.
    #[error("websocket: {}", error_chain(.0))]
    WebSocket(#[source] Box<tokio_tungstenite::tungstenite::Error>),
    /// The server answered a session message with its error message (OpenEnv's
    /// `{"type": "error", "data": {"code", "message"}}`).
    #[error("{code}: {message}")]
    Session { code: String, message: String },
    /// No reply within the deadline (a WebSocket message; HTTP timeouts are `Transport`).
    #[error("no reply within {:.1}s", .0.as_secs_f64())]
    Timeout(std::time::Duration),
    /// The server closed the session; the reason it gave, if any.
    #[error("the server closed the session{}", .0.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Closed(Option<String>),
}

/// An environment over text. `reset` starts an episode from a seed (same seed, same
/// episode); `step` applies the model's action text. Implementations must not block the
/// async runtime: CPU-heavy work goes to `spawn_blocking`, waiting uses `tokio::time`.
#[async_trait]
pub trait Env: Send {
    /// Starts a new episode.
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError>;
    /// Applies one action and returns what followed.
    async fn step(&mut self, action: &str) -> Result<Step, EnvError>;
    /// Releases what the environment holds outside this process (a server-side
    /// environment, a session) once its trajectory is over, finished, failed or aborted.
    /// The environment stays usable: a later `reset` acquires anew. Default: nothing to
    /// release. Wrappers forward it.
    async fn close(&mut self) -> Result<(), EnvError> {
        Ok(())
    }
}

#[async_trait]
impl<E: Env + ?Sized> Env for Box<E> {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        (**self).reset(seed).await
    }
    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        (**self).step(action).await
    }
    async fn close(&mut self) -> Result<(), EnvError> {
        (**self).close().await
    }
}

/// The error for `step` before `reset` or after the episode ended.
pub(crate) fn out_of_order(env: &str, started: bool) -> EnvError {
    let env = env.to_string();
    EnvError::OutOfOrder(if started {
        OutOfOrder::StepAfterEnd { env }
    } else {
        OutOfOrder::StepBeforeReset { env }
    })
}
