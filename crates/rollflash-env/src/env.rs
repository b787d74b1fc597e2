//! The `Env` trait: the Gymnasium / GEM shape (`reset(seed)`, `step(action)`) over text.

use async_trait::async_trait;

/// Free-form details an environment reports next to an observation (as Gymnasium's `info`).
pub type Info = serde_json::Map<String, serde_json::Value>;

/// What `reset` returns: the first observation (for a language model, the task statement
/// including any instructions) and `info`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reset {
    pub observation: String,
    pub info: Info,
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

/// Why an environment call failed. A failed call costs its trajectory, never the run.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The environment itself failed (crashed, injected failure, remote error).
    #[error("environment failed: {0}")]
    Failed(String),
    /// The environment returned something that is not a valid observation or reward.
    #[error("environment returned garbage: {0}")]
    Garbage(String),
    /// `step` was called before `reset` or after the episode ended.
    #[error("environment used out of order: {0}")]
    OutOfOrder(String),
    /// A configuration value is invalid; the message names the field.
    #[error("invalid environment config `{field}`: {reason}")]
    Config { field: String, reason: String },
    /// A remote environment could not be reached or answered with an error.
    #[error("remote environment {url}: {reason}")]
    Remote { url: String, reason: String },
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
}

#[async_trait]
impl<E: Env + ?Sized> Env for Box<E> {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        (**self).reset(seed).await
    }
    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        (**self).step(action).await
    }
}
