//! Built-in environments: math (RLVR), the user's dataset, FrozenLake, Sokoban, tool use, and the registry that builds one from its config.
//!
//! Every environment speaks plain ASCII text: the first observation states the task and the
//! action format, and actions are parsed leniently but deterministically (each environment
//! documents its rule). An action that cannot be parsed is an *invalid move*, never an error:
//! the state does not change, the step still counts towards the step limit (so a policy that
//! never produces a valid action still ends its episode), and the reward carries a
//! configurable penalty (default 0, Gymnasium's convention of not shaping rewards).
//!
//! [`EnvSpec`] is the serde form of "which environment, configured how", shared by config
//! files, the remote protocol ([`crate::remote`]) and `rollflash env-serve`; [`make_env`]
//! turns one into a boxed [`Env`].

pub mod dataset_task;
pub mod frozen_lake;
pub mod sokoban;
pub mod tool_use;

use serde::{Deserialize, Serialize};

pub(crate) use crate::env::out_of_order;
use crate::env::{Env, EnvError};
use crate::latency::{FailureConfig, Flaky, LatencyConfig};
use crate::math_task::{MathEnv, MathTaskConfig};

pub use dataset_task::{DataFile, DatasetEnv, DatasetTaskConfig};
pub use frozen_lake::{FrozenLake, FrozenLakeConfig};
pub use sokoban::{Sokoban, SokobanConfig};
pub use tool_use::{ToolUse, ToolUseConfig};

/// The names [`EnvConfig`] accepts in its `name` tag, for error messages and for servers that
/// restrict what they offer.
pub const ENV_NAMES: [&str; 5] = ["math", "dataset", "frozen_lake", "sokoban", "tool_use"];

/// Which built-in environment, with its own configuration. Serialised with the environment's
/// name in a `name` field next to the configuration's fields, e.g.
/// `{"name": "frozen_lake", "map": "8x8", "is_slippery": false}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum EnvConfig {
    /// Single-turn arithmetic with a verifiable answer ([`crate::math_task`]).
    Math(MathTaskConfig),
    /// Single-turn prompts from the user's JSONL/Parquet files, scored by the math verifier
    /// ([`dataset`]). Boxed: its settings are most of the enum's size.
    Dataset(Box<DatasetTaskConfig>),
    /// Gymnasium's `FrozenLake-v1` ([`frozen_lake`]).
    FrozenLake(FrozenLakeConfig),
    /// Procedurally generated, always solvable Sokoban rooms ([`sokoban`]).
    Sokoban(SokobanConfig),
    /// Multi-turn arithmetic that needs a calculator tool ([`tool_use`]).
    ToolUse(ToolUseConfig),
}

impl EnvConfig {
    /// The `name` tag of this configuration (one of [`ENV_NAMES`]).
    pub fn name(&self) -> &'static str {
        match self {
            EnvConfig::Math(_) => "math",
            EnvConfig::Dataset(_) => "dataset",
            EnvConfig::FrozenLake(_) => "frozen_lake",
            EnvConfig::Sokoban(_) => "sokoban",
            EnvConfig::ToolUse(_) => "tool_use",
        }
    }
}

/// A complete environment description: the environment plus the optional latency and failure
/// injection that [`make_env`] wraps around it (see [`crate::latency`]).
///
/// JSON: the environment's fields and the common fields side by side, e.g.
/// `{"name": "sokoban", "num_boxes": 1, "latency": {"kind": "fixed", "secs": 0.5}}`.
/// Unknown fields are rejected (they would otherwise silently fall back to defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvSpec {
    /// The environment and its configuration.
    #[serde(flatten)]
    pub env: EnvConfig,
    /// Simulated latency before every `reset`/`step`, for studying asynchrony without slow
    /// real environments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyConfig>,
    /// Injected failures, for testing that a failed environment costs one trajectory only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureConfig>,
    /// Seed of the latency/failure RNG. `None` draws one from the OS, so that environments
    /// built from one spec do not share a latency sequence; set it (or build
    /// [`Flaky`] yourself with per-instance seeds) for reproducible runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_seed: Option<u64>,
}

impl EnvSpec {
    /// A spec for `env` without latency or failure injection.
    pub fn new(env: EnvConfig) -> Self {
        EnvSpec {
            env,
            latency: None,
            failure: None,
            noise_seed: None,
        }
    }

    /// The environment's name (one of [`ENV_NAMES`]).
    pub fn name(&self) -> &'static str {
        self.env.name()
    }

    /// This spec for a run whose first task seed is `first`: a dataset task's epochs start
    /// there (see [`dataset`]), so consecutive groups see distinct rows. Other environments
    /// are unchanged.
    pub fn with_task_seed_origin(mut self, first: u64) -> EnvSpec {
        if let EnvConfig::Dataset(c) = &mut self.env {
            c.seed_origin = first;
        }
        self
    }

    /// Checks every value that serde cannot (ranges, consistency). The error names the field,
    /// prefixed by the environment's name, e.g. `frozen_lake.success_rate`.
    pub fn validate(&self) -> Result<(), EnvError> {
        let prefixed = |e: EnvError, prefix: &str| match e {
            EnvError::Config { field, reason } => EnvError::Config {
                field: format!("{prefix}.{field}"),
                reason,
            },
            other => other,
        };
        match &self.env {
            // Checked here too, not only in `MathTask::new`: a config must be refused when it is
            // loaded, before any warm-up runs (a NaN `product_prob` used to get through).
            EnvConfig::Math(c) => c.validate().map_err(|e| prefixed(e.into(), "math"))?,
            // Loads the files (once per config and its clones): bad rows are refused here,
            // at config load, before a model is loaded.
            EnvConfig::Dataset(c) => c.validate().map_err(|e| prefixed(e, "dataset"))?,
            EnvConfig::FrozenLake(c) => c.validate().map_err(|e| prefixed(e, "frozen_lake"))?,
            EnvConfig::Sokoban(c) => c.validate().map_err(|e| prefixed(e, "sokoban"))?,
            EnvConfig::ToolUse(c) => c.validate().map_err(|e| prefixed(e, "tool_use"))?,
        }
        if let Some(l) = &self.latency {
            l.validate().map_err(|e| prefixed(e, "latency"))?;
        }
        if let Some(f) = &self.failure {
            f.validate().map_err(|e| prefixed(e, "failure"))?;
        }
        Ok(())
    }
}

impl From<EnvConfig> for EnvSpec {
    fn from(env: EnvConfig) -> Self {
        EnvSpec::new(env)
    }
}

/// Builds the environment `spec` describes, wrapped in [`Flaky`] when it asks for latency or
/// failures. Validation errors name the offending field.
pub fn make_env(spec: &EnvSpec) -> Result<Box<dyn Env>, EnvError> {
    spec.validate()?;
    let env: Box<dyn Env> = match &spec.env {
        EnvConfig::Math(c) => Box::new(MathEnv::new(c.clone())?),
        EnvConfig::Dataset(c) => Box::new(DatasetEnv::new(c)?),
        EnvConfig::FrozenLake(c) => Box::new(FrozenLake::new(c.clone())?),
        EnvConfig::Sokoban(c) => Box::new(Sokoban::new(c.clone())?),
        EnvConfig::ToolUse(c) => Box::new(ToolUse::new(c.clone())?),
    };
    if spec.latency.is_none() && spec.failure.is_none() {
        return Ok(env);
    }
    let seed = spec.noise_seed.unwrap_or_else(rand::random);
    Ok(Box::new(Flaky::new(
        env,
        spec.latency.clone(),
        spec.failure.clone(),
        seed,
    )?))
}

/// A move on a grid, shared by the grid worlds. The discriminants are Gymnasium FrozenLake's
/// action numbers (0 Left, 1 Down, 2 Right, 3 Up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Left = 0,
    Down = 1,
    Right = 2,
    Up = 3,
}

impl Direction {
    /// All four, in action-number order.
    pub const ALL: [Direction; 4] = [
        Direction::Left,
        Direction::Down,
        Direction::Right,
        Direction::Up,
    ];

    /// The direction with Gymnasium action number `i` (0..=3).
    pub fn from_index(i: usize) -> Option<Direction> {
        Direction::ALL.get(i).copied()
    }

    /// The Gymnasium action number.
    pub fn index(self) -> usize {
        self as usize
    }

    /// (row, column) offset of one step.
    pub fn delta(self) -> (isize, isize) {
        match self {
            Direction::Left => (0, -1),
            Direction::Down => (1, 0),
            Direction::Right => (0, 1),
            Direction::Up => (-1, 0),
        }
    }

    /// The reverse direction.
    pub fn opposite(self) -> Direction {
        match self {
            Direction::Left => Direction::Right,
            Direction::Down => Direction::Up,
            Direction::Right => Direction::Left,
            Direction::Up => Direction::Down,
        }
    }

    /// The action word shown to the model.
    pub fn word(self) -> &'static str {
        match self {
            Direction::Left => "Left",
            Direction::Down => "Down",
            Direction::Right => "Right",
            Direction::Up => "Up",
        }
    }
}

/// The last direction named in `text`, or `None`.
///
/// The text is split into words at every character that is not an ASCII letter or digit; a
/// word equal to `left`, `down`, `right` or `up` (any case) names that direction, and with
/// `accept_digits` a word `0`..`3` names Gymnasium's action number. The *last* such word wins,
/// because a model that thinks aloud usually states its decision at the end
/// ("not Up... Right").
pub fn parse_direction(text: &str, accept_digits: bool) -> Option<Direction> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .rev()
        .find_map(|w| match w.to_ascii_lowercase().as_str() {
            "left" => Some(Direction::Left),
            "down" => Some(Direction::Down),
            "right" => Some(Direction::Right),
            "up" => Some(Direction::Up),
            "0" | "1" | "2" | "3" if accept_digits => {
                w.parse::<usize>().ok().and_then(Direction::from_index)
            }
            _ => None,
        })
}

/// A config error for `field`.
pub(crate) fn config_error(field: &str, reason: impl Into<String>) -> EnvError {
    EnvError::Config {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// Rejects NaN and infinities in a config value.
pub(crate) fn check_finite(field: &str, v: f64) -> Result<(), EnvError> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(config_error(field, format!("must be finite, got {v}")))
    }
}
