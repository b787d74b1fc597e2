//! `[learner]`: who runs the training step (the embedded learner or a Tinker server), and
//! what a Tinker learner requires of the rest of the config.

use serde::{Deserialize, Serialize};

use super::check::check_key;
use super::{field, ConfigError, ServerKind, ServerWeights, TrainConfig};

/// `[learner]`: who runs the training step. `[train]` says what the step computes either
/// way (loss, advantages, optimiser settings).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnerSection {
    pub kind: LearnerKind,
    /// The Tinker server (`http://host:port`), for `kind = "tinker"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Its API key inline (kept out of printed configs), or the variable holding it.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// The model to train on the server (absent: the server's first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_model: Option<String>,
    /// Rank of the LoRA adapter the server trains.
    pub lora_rank: u32,
    /// Bound on one call's result (a step on a busy cluster takes minutes).
    pub timeout_secs: f64,
    /// How long the learner waits for a server that died or restarted mid-run to come back
    /// and rejoins it (a fresh model loading the state saved after the last step, which it
    /// then saves every step); 0 (the default): the run stops with a checkpoint instead.
    pub rejoin_secs: f64,
}

impl std::fmt::Debug for LearnerSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearnerSection")
            .field("kind", &self.kind)
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("api_key_env", &self.api_key_env)
            .field("base_model", &self.base_model)
            .field("lora_rank", &self.lora_rank)
            .field("timeout_secs", &self.timeout_secs)
            .field("rejoin_secs", &self.rejoin_secs)
            .finish()
    }
}

impl Default for LearnerSection {
    fn default() -> Self {
        LearnerSection {
            kind: LearnerKind::Embedded,
            url: None,
            api_key: None,
            api_key_env: None,
            base_model: None,
            lora_rank: 8,
            timeout_secs: 1800.0,
            rejoin_secs: 0.0,
        }
    }
}

/// `learner.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LearnerKind {
    /// rollflash's own learner, in this process.
    #[default]
    Embedded,
    /// A server speaking the Tinker protocol (SkyRL, hosted Tinker, VeRL-Tinker).
    Tinker,
}

impl LearnerSection {
    /// Checks what serde cannot, with the rest of the config the kind constrains; errors
    /// name the field.
    pub(super) fn validate(&self, c: &TrainConfig) -> Result<(), ConfigError> {
        check_key("learner", &self.api_key, &self.api_key_env)?;
        if self.kind == LearnerKind::Embedded {
            if let Some(i) = c
                .rollout
                .servers
                .iter()
                .position(|s| s.kind == ServerKind::Tinker)
            {
                return Err(field(
                    &format!("rollout.servers[{i}].kind"),
                    "a Tinker sampler serves only what a Tinker server trains: set \
                     learner.kind = \"tinker\" (the embedded learner's weights cannot reach it)",
                ));
            }
            return Ok(());
        }
        if self.url.as_deref().is_none_or(str::is_empty) {
            return Err(field(
                "learner.url",
                "learner.kind = \"tinker\" needs the server's URL",
            ));
        }
        if self.lora_rank == 0 {
            return Err(field("learner.lora_rank", "must be at least 1"));
        }
        if !(self.timeout_secs > 0.0) || !self.timeout_secs.is_finite() {
            return Err(field(
                "learner.timeout_secs",
                "must be a positive number of seconds",
            ));
        }
        if !(self.rejoin_secs >= 0.0) || !self.rejoin_secs.is_finite() {
            return Err(field(
                "learner.rejoin_secs",
                "must be a number of seconds, 0 or more (0: stop instead of rejoining)",
            ));
        }
        // The server's log-probs are at temperature 1; the advantages and the loss compare
        // them with the rollout's.
        if c.rollout.temperature != 1.0 {
            return Err(field(
                "rollout.temperature",
                "must be 1 with learner.kind = \"tinker\" (the server scores tokens at temperature 1)",
            ));
        }
        // The weights live on the server: its samplers load them by path; any other backend
        // loads the LoRA adapter the server exports (there is no merged export).
        if let Some(i) = c
            .rollout
            .servers
            .iter()
            .position(|s| s.kind != ServerKind::Tinker && s.weights == ServerWeights::Merged)
        {
            return Err(field(
                &format!("rollout.servers[{i}].weights"),
                "\"merged\" cannot follow a Tinker learner: the server exports its LoRA adapter, \
                 which this server loads with weights = \"disk\"",
            ));
        }
        if c.warmup.steps > 0 {
            return Err(field(
                "warmup.steps",
                "must be 0 with learner.kind = \"tinker\" (the warm-up trains a local model)",
            ));
        }
        if c.train.lora.is_some() {
            return Err(field(
                "train.lora",
                "the Tinker server trains its own LoRA adapter (learner.lora_rank); remove [train.lora]",
            ));
        }
        rollflash_trainer::TinkerLossPath::of(&c.train.loss)
            .map(|_| ())
            .map_err(|reason| field("train.loss", &reason))
    }
}
