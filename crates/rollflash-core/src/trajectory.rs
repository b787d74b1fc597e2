//! Trajectories and groups: what a rollout produces and training consumes, as plain data.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::PolicyVersion;

/// How a trajectory ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "reason")]
pub enum TrajectoryEnd {
    /// The environment reached a terminal state (solved, failed the task, fell in a hole).
    Terminated,
    /// The environment cut the episode short (its own step limit).
    Truncated,
    /// The manager's turn limit was reached.
    MaxTurns,
    /// The token budget (prompt + all turns) was used up.
    MaxTokens,
    /// Aborted before finishing: its group was already complete (redundancy), or shutdown.
    Aborted,
    /// The environment or the backend failed; the reason is recorded.
    Failed(String),
}

impl TrajectoryEnd {
    /// Whether the trajectory can be trained on (it ended on its own terms).
    pub fn is_usable(&self) -> bool {
        !matches!(self, TrajectoryEnd::Aborted | TrajectoryEnd::Failed(_))
    }
}

/// Timings of one turn: generation and the environment step that followed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnTiming {
    /// Time from asking the proxy for the turn to its answer (queueing included).
    pub generate: Duration,
    /// Time the environment took to step.
    pub env: Duration,
    /// Tokens the model generated in this turn.
    pub tokens: usize,
}

/// One full episode as a single token sequence. Every per-token vector has `tokens.len()`
/// entries. Model tokens have `loss_mask` 1, their behaviour log-prob, and the version
/// that produced them; prompt and observation tokens have mask 0, log-prob 0, and the
/// trajectory's start version.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    pub tokens: Vec<u32>,
    pub loss_mask: Vec<u8>,
    pub logprobs: Vec<f32>,
    pub versions: Vec<PolicyVersion>,
    /// Length of the first prompt (everything before the first model token).
    pub prompt_len: usize,
    /// The policy version when the trajectory started: what α is checked against.
    pub start_version: PolicyVersion,
    /// Sum of the environment's step rewards.
    pub reward: f64,
    /// The reward of each step.
    pub step_rewards: Vec<f64>,
    pub turns: Vec<TurnTiming>,
    pub end: Option<TrajectoryEnd>,
    /// The seed the environment was reset with (identifies the task).
    pub seed: u64,
    /// Index within its group.
    pub index: usize,
    /// The numeric entries of the environment's `info` on the last step (for math,
    /// `format_free`: the answer scored without the format check), for evaluation and
    /// per-step metrics.
    #[serde(default)]
    pub env_metrics: Vec<(String, f64)>,
    /// The text entries of the environment's `info` on the last step (a verdict, a reward
    /// function's error, a test's output), each cut to [`ENV_TEXT_MAX_CHARS`], so the
    /// trajectory view can say why a sample scored what it did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_text: Vec<(String, String)>,
    /// Which backends generated the model tokens (those with `loss_mask` 1), in order; empty
    /// when not known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub served_by: Vec<crate::gen::ServedRun>,
}

/// The most characters of one [`Trajectory::env_text`] entry kept: enough for a traceback's
/// last lines, small enough that a batch of them costs nothing beside its tokens.
pub const ENV_TEXT_MAX_CHARS: usize = 2000;

impl Trajectory {
    /// Number of tokens the model generated.
    pub fn response_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m == 1).count()
    }

    /// The oldest version any of its model tokens came from (its start version if none).
    pub fn min_version(&self) -> PolicyVersion {
        self.versions
            .iter()
            .zip(&self.loss_mask)
            .filter(|(_, &m)| m == 1)
            .map(|(v, _)| *v)
            .min()
            .unwrap_or(self.start_version)
    }

    /// Appends tokens with their mask, log-probs and versions.
    pub fn push(&mut self, token: u32, mask: u8, logprob: f32, version: PolicyVersion) {
        self.tokens.push(token);
        self.loss_mask.push(mask);
        self.logprobs.push(logprob);
        self.versions.push(version);
    }

    /// Checks that the per-token vectors line up (a bug elsewhere if not).
    pub fn is_consistent(&self) -> bool {
        let n = self.tokens.len();
        self.loss_mask.len() == n
            && self.logprobs.len() == n
            && self.versions.len() == n
            && self.prompt_len <= n
            && self.loss_mask[..self.prompt_len].iter().all(|&m| m == 0)
    }
}
