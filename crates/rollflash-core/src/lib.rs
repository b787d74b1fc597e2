//! `rollflash-core`: pure data shared by every crate — ids, policy versions, generation
//! requests and outputs, trajectories, and the scheduling state machines.
//! No I/O and no tensors live here.

pub mod auth;
pub mod buffer;
pub mod controller;
pub mod error;
pub mod gen;
pub mod proxy;
pub mod redundancy;
pub mod timeline;
pub mod trajectory;

pub use error::{error_chain, IoError};
pub use gen::{GenOutput, GenRequest, Generated, InvalidParams, SamplingParams, ServedRun};
pub use trajectory::{Trajectory, TrajectoryEnd, TurnTiming};

use serde::{Deserialize, Serialize};

/// A policy version: bumped by every optimizer step. Weights on every backend carry one, and
/// every generated token records the version that produced it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct PolicyVersion(pub u64);

impl PolicyVersion {
    /// The version after one more optimizer step.
    pub fn next(self) -> Self {
        PolicyVersion(self.0 + 1)
    }
}

impl std::fmt::Display for PolicyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// Identifies one generation request across the proxy, backends and engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "req{}", self.0)
    }
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was sampled (it is included in the output).
    Stop,
    /// `max_new_tokens` or the model's context length was reached.
    Length,
    /// The request was aborted; the tokens so far are returned and may be resumed.
    Aborted,
}

/// What happens to in-flight requests when generation pauses for a weight sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// In-flight requests are aborted and return their partial tokens; after the sync they
    /// are resumed from those tokens under the new weights, keeping their start version.
    #[default]
    Abort,
    /// In-flight requests keep running; each token records the version that produced it.
    Keep,
}
