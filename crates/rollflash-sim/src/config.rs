//! What one simulation models: the cluster, the cost of each resource, the workload and the
//! scheduler settings. Plain serde structs with defaults; [`SimConfig::validate`] is the one
//! place ranges are checked, and its errors name the field.
//!
//! The defaults describe a small CPU run shaped like `rollflash train`'s default (one engine,
//! one trainer, the math task); `crate::gpu` builds GPU clusters from a documented cost model.

use rollflash_core::buffer::{BufferConfig, Schedule};
use rollflash_core::PauseMode;
use serde::{Deserialize, Serialize};

use crate::dist::{LatencyDist, LengthDist};
use crate::SimError;

/// Everything one simulation needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Seed of every random draw. Draws are keyed by (seed, group, member), so two
    /// configurations with the same seed see the same tasks (common random numbers).
    pub seed: u64,
    /// Training steps to simulate.
    pub steps: usize,
    pub cluster: ClusterConfig,
    pub inference: InferenceCost,
    pub training: TrainCost,
    pub sync: SyncCost,
    pub workload: Workload,
    pub sched: SchedConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 0,
            steps: 20,
            cluster: ClusterConfig::default(),
            inference: InferenceCost::default(),
            training: TrainCost::default(),
            sync: SyncCost::default(),
            workload: Workload::default(),
            sched: SchedConfig::default(),
        }
    }
}

/// How inference workers batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Batching {
    /// Sequences join at every step and leave as soon as they finish (vLLM, SGLang, our
    /// engine).
    #[default]
    Continuous,
    /// A worker starts a new batch only when its current one has drained: the slowest
    /// sequence holds every slot of its batch (batch-synchronous generation).
    Static,
}

/// The resources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Inference workers (one engine or one server replica each; on GPUs one data-parallel
    /// replica, possibly tensor-parallel over several GPUs).
    pub inference_workers: usize,
    /// Requests one worker runs at once: the proxy's admission limit per backend
    /// (`rollout.max_running_requests`).
    pub max_running: usize,
    pub batching: Batching,
    /// The proxy's routing policy by config name (`least_loaded`, `round_robin`, `sticky`).
    pub routing: rollflash_core::proxy::Routing,
    /// Data-parallel training workers; a step's token work is split over them.
    pub train_workers: usize,
    /// Slow-downs while generation and training run at the same time on shared hardware.
    pub contention: Contention,
}

/// How much generation and training slow each other down when they share hardware (one
/// machine's CPU cores, memory bandwidth and caches): while both run, engine steps take
/// `gen` times and training `train` times as long. 1 and 1 for separate GPUs;
/// `rollflash sim validate` measures both on this machine by running the two together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Contention {
    pub gen: f64,
    pub train: f64,
}

impl Default for Contention {
    fn default() -> Self {
        Contention {
            gen: 1.0,
            train: 1.0,
        }
    }
}

impl Contention {
    /// Whether the two slow each other down at all.
    pub fn is_active(&self) -> bool {
        self.gen != 1.0 || self.train != 1.0
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            inference_workers: 1,
            max_running: 64,
            batching: Batching::Continuous,
            routing: rollflash_core::proxy::Routing::LeastLoaded,
            train_workers: 1,
            contention: Contention::default(),
        }
    }
}

/// The time of one decode step of a worker running `batch` sequences whose contexts sum to
/// `context` tokens, `prefill` of which are new prompt tokens processed in that step:
/// `step_s + seq_s·batch + context_token_s·context + prefill_token_s·prefill`.
///
/// The three decode terms are the memory-bound structure of decoding: every step reads the
/// weights once (`step_s`), does per-sequence work (`seq_s`), and reads every sequence's KV
/// cache (`context_token_s`). Defaults: the built-in model on one core of the development
/// machine, as fitted by `rollflash sim validate` (2026-11-30).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InferenceCost {
    pub step_s: f64,
    pub seq_s: f64,
    pub context_token_s: f64,
    pub prefill_token_s: f64,
}

impl Default for InferenceCost {
    fn default() -> Self {
        InferenceCost {
            step_s: 2.0e-3,
            seq_s: 2.5e-4,
            context_token_s: 1.0e-6,
            prefill_token_s: 1.0e-4,
        }
    }
}

impl InferenceCost {
    /// Seconds of one step (see the type's docs).
    pub fn step_time(&self, batch: u64, context: u64, prefill: u64) -> f64 {
        self.step_s
            + self.seq_s * batch as f64
            + self.context_token_s * context as f64
            + self.prefill_token_s * prefill as f64
    }
}

/// The time of one training step on a batch of `tokens` tokens (prompt and response, the
/// way the learner re-scores and back-propagates whole sequences):
/// `step_s + token_s·tokens / (workers·efficiency)`, with `efficiency` 1 for one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainCost {
    /// Fixed cost per step (optimizer, gradient all-reduce, publishing the weights).
    pub step_s: f64,
    /// Seconds per token on one worker.
    pub token_s: f64,
    /// Data-parallel efficiency with more than one worker (communication, stragglers).
    pub parallel_efficiency: f64,
    /// Extra seconds of a run's first step, paid once: the first pass allocates every
    /// activation, gradient and optimizer buffer (page faults on fresh memory) and starts
    /// the threads; later steps reuse them. On the CPU it is several steady steps' worth,
    /// which a short run measures.
    pub first_step_s: f64,
}

impl Default for TrainCost {
    fn default() -> Self {
        TrainCost {
            step_s: 0.02,
            token_s: 4.0e-4,
            parallel_efficiency: 1.0,
            first_step_s: 0.0,
        }
    }
}

impl TrainCost {
    /// Seconds of one step over `tokens` tokens on `workers` workers.
    pub fn step_time(&self, tokens: u64, workers: usize) -> f64 {
        let eff = if workers > 1 {
            self.parallel_efficiency
        } else {
            1.0
        };
        self.step_s + self.token_s * tokens as f64 / (workers.max(1) as f64 * eff)
    }
}

/// The weight update between pause and resume: `fixed_s + worker_s·inference_workers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyncCost {
    pub fixed_s: f64,
    pub worker_s: f64,
}

impl Default for SyncCost {
    fn default() -> Self {
        // In process the weights are handed over as a pointer: near free.
        SyncCost {
            fixed_s: 1.0e-3,
            worker_s: 0.0,
        }
    }
}

/// The tasks: prompts, responses, turns, environments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Workload {
    /// Prompt tokens of a task (all members of a group share the prompt).
    pub prompt_tokens: LengthDist,
    /// Tokens the model generates in one turn, before `max_new_tokens`.
    pub response_tokens: LengthDist,
    /// Bound on one turn's response.
    pub max_new_tokens: u64,
    /// Bound on a whole trajectory's tokens (prompt, responses, observations).
    pub max_total_tokens: u64,
    /// Model turns of an episode at most (1 = single-turn RLVR).
    pub max_turns: u32,
    /// Probability that the episode ends after a turn before `max_turns`.
    pub end_prob: f64,
    /// Tokens of an observation appended after a turn.
    pub observation_tokens: LengthDist,
    /// Environment reset.
    pub reset_latency: LatencyDist,
    /// One environment step (for RLVR: the verifier computing the reward).
    pub step_latency: LatencyDist,
    /// Probability that one environment step fails.
    pub failure_rate: f64,
    /// Of the failures, the fraction that hang until `step_timeout_s` (a stuck sandbox)
    /// rather than fail at once.
    pub hang_fraction: f64,
    /// Bound on one environment step.
    pub step_timeout_s: f64,
    /// Measured groups of episodes to replay instead of drawing prompts, responses,
    /// observations, turn counts and rewards from the distributions above: group `k`
    /// replays `measured_groups[k mod len]`, its member `m` that group's episode
    /// `m mod size`. Replaying whole groups keeps what independent draws lose: how many turns
    /// an episode of this task takes, how long its turns and observations are together, and
    /// whether its members' rewards differ (what a zero-variance filter looks at).
    /// `rollflash sim validate` rolls them out with the run's starting policy on the run's
    /// own first tasks. Environment latency and failures are still drawn
    /// (`reset_latency`, `step_latency`, `failure_rate`); `max_turns`, `max_new_tokens` and
    /// `max_total_tokens` still bound them. Empty (the default): draw.
    pub measured_groups: Vec<Vec<Episode>>,
}

/// One measured episode (see [`Workload::measured_groups`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Episode {
    /// Tokens of the first prompt.
    pub prompt_tokens: u64,
    /// The model's turns, in order.
    pub turns: Vec<EpisodeTurn>,
    /// The episode's reward (summed over its steps).
    pub reward: f64,
}

/// One model turn of a measured episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpisodeTurn {
    /// Tokens the model generated.
    pub response_tokens: u64,
    /// Tokens of the observation appended after it (0 after the last turn).
    pub observation_tokens: u64,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            prompt_tokens: LengthDist::Fixed { tokens: 12 },
            response_tokens: LengthDist::TermLaw {
                min_terms: 2,
                max_terms: 3,
                exponent: 1.5,
                tokens_per_term: 6,
                base_tokens: 6,
            },
            max_new_tokens: 64,
            max_total_tokens: 128,
            max_turns: 1,
            end_prob: 0.0,
            observation_tokens: LengthDist::Fixed { tokens: 0 },
            reset_latency: LatencyDist::Fixed { secs: 0.0 },
            step_latency: LatencyDist::Fixed { secs: 0.0 },
            failure_rate: 0.0,
            hang_fraction: 0.0,
            step_timeout_s: 30.0,
            measured_groups: Vec::new(),
        }
    }
}

/// The scheduler's settings: the same knobs `rollflash train` has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedConfig {
    /// Admission, α, filtering, barrier (the core `SampleBuffer`).
    pub buffer: BufferConfig,
    /// Synchronous baseline: α = 0 with the barrier, whatever `buffer` says.
    pub sync: bool,
    /// Extra trajectories per group (redundant environment rollout).
    pub redundancy: usize,
    /// In-flight requests during a weight sync: aborted and resumed, or kept.
    pub pause_mode: PauseMode,
    /// Prompt replication: the samples of a group are independent requests that may run
    /// on different workers. Off: they are one `n`-per-request call, pinned to one worker.
    pub replication: bool,
    /// Batch-synchronous rollout: the trajectories started under one policy version move
    /// in lock step — all generate, then all step their environments, then all generate
    /// again — the way a batched generate-then-score loop runs. Off: every trajectory
    /// moves on its own (queue scheduling and environment-level asynchrony).
    pub lockstep: bool,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            buffer: BufferConfig::default(),
            sync: false,
            redundancy: 0,
            pause_mode: PauseMode::Abort,
            replication: true,
            lockstep: false,
        }
    }
}

impl SchedConfig {
    /// The buffer settings in force (`sync` applied).
    pub fn effective_buffer(&self) -> BufferConfig {
        if self.sync {
            self.buffer.clone().with_schedule(Schedule::Synchronous)
        } else {
            self.buffer.clone()
        }
    }
}

pub(crate) fn invalid(field: &str, message: impl Into<String>) -> SimError {
    SimError::Config {
        field: field.to_string(),
        message: message.into(),
    }
}

fn non_negative(field: &str, v: f64) -> Result<(), SimError> {
    if !(v >= 0.0) || !v.is_finite() {
        return Err(invalid(field, format!("must be finite and >= 0, got {v}")));
    }
    Ok(())
}

fn probability(field: &str, v: f64) -> Result<(), SimError> {
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid(field, format!("must be in [0, 1], got {v}")));
    }
    Ok(())
}

impl SimConfig {
    /// Checks every range; the error names the field.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.steps == 0 {
            return Err(invalid("steps", "must be positive"));
        }
        let c = &self.cluster;
        if c.inference_workers == 0 {
            return Err(invalid("cluster.inference_workers", "must be positive"));
        }
        if c.max_running == 0 {
            return Err(invalid("cluster.max_running", "must be positive"));
        }
        if c.train_workers == 0 {
            return Err(invalid("cluster.train_workers", "must be positive"));
        }
        for (field, v) in [
            ("cluster.contention.gen", c.contention.gen),
            ("cluster.contention.train", c.contention.train),
        ] {
            if !(v > 0.0) || !v.is_finite() {
                return Err(invalid(field, format!("must be finite and > 0, got {v}")));
            }
        }
        let i = &self.inference;
        non_negative("inference.step_s", i.step_s)?;
        non_negative("inference.seq_s", i.seq_s)?;
        non_negative("inference.context_token_s", i.context_token_s)?;
        non_negative("inference.prefill_token_s", i.prefill_token_s)?;
        if i.step_s + i.seq_s + i.context_token_s <= 0.0 {
            return Err(invalid(
                "inference",
                "a decode step must cost something (step_s, seq_s or context_token_s > 0)",
            ));
        }
        let t = &self.training;
        non_negative("training.step_s", t.step_s)?;
        non_negative("training.token_s", t.token_s)?;
        non_negative("training.first_step_s", t.first_step_s)?;
        if !(t.parallel_efficiency > 0.0 && t.parallel_efficiency <= 1.0) {
            return Err(invalid(
                "training.parallel_efficiency",
                format!("must be in (0, 1], got {}", t.parallel_efficiency),
            ));
        }
        non_negative("sync.fixed_s", self.sync.fixed_s)?;
        non_negative("sync.worker_s", self.sync.worker_s)?;
        let w = &self.workload;
        w.prompt_tokens.validate("workload.prompt_tokens")?;
        w.response_tokens.validate("workload.response_tokens")?;
        w.observation_tokens
            .validate("workload.observation_tokens")?;
        w.reset_latency.validate("workload.reset_latency")?;
        w.step_latency.validate("workload.step_latency")?;
        if w.max_new_tokens == 0 {
            return Err(invalid("workload.max_new_tokens", "must be positive"));
        }
        if w.max_turns == 0 {
            return Err(invalid("workload.max_turns", "must be positive"));
        }
        probability("workload.end_prob", w.end_prob)?;
        probability("workload.failure_rate", w.failure_rate)?;
        probability("workload.hang_fraction", w.hang_fraction)?;
        non_negative("workload.step_timeout_s", w.step_timeout_s)?;
        for (g, group) in w.measured_groups.iter().enumerate() {
            let field = format!("workload.measured_groups[{g}]");
            if group.is_empty() {
                return Err(invalid(&field, "needs at least one episode"));
            }
            for (e, ep) in group.iter().enumerate() {
                if ep.turns.is_empty() {
                    return Err(invalid(&format!("{field}[{e}].turns"), "needs a turn"));
                }
                if !ep.reward.is_finite() {
                    return Err(invalid(
                        &format!("{field}[{e}].reward"),
                        format!("must be finite, got {}", ep.reward),
                    ));
                }
            }
        }
        self.sched
            .effective_buffer()
            .validate()
            .map_err(|m| invalid("sched.buffer", m.to_string()))?;
        Ok(())
    }
}
