//! The `rollflash train` configuration: one TOML document with a complete built-in default
//! (the built-in tiny model on the long-tailed arithmetic task, asynchronous with α = 1),
//! `--set key=value` overrides applied before parsing, and validation in one place whose
//! errors name the field. Each section's types live in a module of their own and are
//! re-exported here, so `crate::config::X` names every one of them.

mod check;
mod env;
mod learner;
mod model;
mod output;
mod rollout;
mod threads;
mod train;
mod warmup;

use std::path::PathBuf;

use rollflash_core::buffer::BufferConfig;
use rollflash_env::envs::{EnvConfig, EnvSpec};
use rollflash_env::math_task::MathTaskConfig;
use rollflash_train::shaping::ShapingConfig;

use crate::preset::Preset;
use serde::{Deserialize, Serialize};

use check::{check_key, check_timeout, MAX_TIMEOUT_SECS};
use env::ENV_SOURCE_KEYS;

pub use check::resolve_api_key;
pub use env::{EnvSection, OpenEnvSection, RemoteEnvSection};
pub use learner::{LearnerKind, LearnerSection};
pub use model::{DTypeSpec, DeviceSpec, ModelSection, RendererChoice};
pub use output::{CheckpointSection, DashboardSection, MetricsSection, OnCheckpointError};
pub use rollout::{RolloutSection, ServerKind, ServerSection, ServerWeights};
pub use threads::Threads;
pub use train::{ControllerSection, TrainSection};
pub use warmup::WarmupSection;

/// A configuration problem; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("config {path} is not valid TOML")]
    Toml {
        path: PathBuf,
        /// Boxed: keeps `ConfigError` (and every error that wraps it) small.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A key has a value of the wrong type or an unknown name.
    #[error("invalid config: `{key}`")]
    Type {
        key: String,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("invalid --set `{arg}`: {reason}")]
    Set { arg: String, reason: String },
    #[error("invalid config field `{field}`: {reason}")]
    Field { field: String, reason: String },
    #[error("invalid config")]
    Buffer(#[from] rollflash_core::buffer::BufferConfigError),
    #[error("invalid config: env")]
    Env(#[source] rollflash_env::EnvError),
    /// A loss or estimator setting is out of range (the message names the field).
    #[error("invalid config: {section}")]
    Train {
        section: &'static str,
        #[source]
        source: rollflash_train::TrainError,
    },
    /// The resolved config could not be written back as TOML.
    #[error("cannot print the config as TOML")]
    Print(#[source] toml::ser::Error),
}

fn field(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// Everything `rollflash train` needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Seeds the model initialisation, task order and sampling.
    pub seed: u64,
    /// Where checkpoints, metrics and the warm-up cache go.
    pub output_dir: PathBuf,
    pub model: ModelSection,
    pub warmup: WarmupSection,
    /// The environment (task) trajectories run in: a built-in one (its spec, with `name`),
    /// `{ remote = { url, spec, … } }` on a `rollflash env-serve` server, or
    /// `{ openenv = { url, … } }` on an OpenEnv server.
    pub env: EnvSection,
    pub rollout: RolloutSection,
    /// Batching, α, filtering (see `rollflash_core::buffer`).
    pub buffer: BufferConfig,
    pub train: TrainSection,
    /// Who trains: rollflash's embedded learner (default), or a Tinker server.
    pub learner: LearnerSection,
    pub controller: ControllerSection,
    /// Checkpoints every K steps (written by `crate::checkpoint`).
    pub checkpoint: CheckpointSection,
    /// Progress bar, Prometheus endpoint, final report (`crate::metrics`, `crate::prometheus`, `crate::report`).
    pub metrics: MetricsSection,
    /// The live dashboard and the files it reads (`timeline.jsonl`, `trajectories.jsonl`).
    pub dashboard: DashboardSection,
    /// The code sandbox (`rollflash_sandbox`): pool size and limits of each execution of the
    /// model's code. Started only by a dataset task with `reward = "code"`.
    pub sandbox: rollflash_sandbox::SandboxConfig,
    /// Rewards computed outside the Rust process: `[reward.python]`, the worker pool of a
    /// dataset task's Python reward function.
    pub reward: RewardSection,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            seed: 0,
            output_dir: PathBuf::from("runs/default"),
            model: ModelSection::default(),
            warmup: WarmupSection::default(),
            // Two- and three-term problems: the warm-up takes the built-in model to about
            // two thirds right in a few minutes, leaving RL room; the task's long-tailed
            // default (up to 24 terms) is what the benchmarks use.
            env: EnvSection::Builtin(EnvSpec::new(EnvConfig::Math(MathTaskConfig {
                max_terms: 3,
                ..MathTaskConfig::default()
            }))),
            rollout: RolloutSection::default(),
            buffer: BufferConfig {
                groups_per_batch: 8,
                group_size: 8,
                alpha: 1.0,
                extra_groups: 0,
                filter: rollflash_core::buffer::GroupFilter::None,
                barrier: false,
            },
            train: TrainSection::default(),
            learner: LearnerSection::default(),
            controller: ControllerSection::default(),
            checkpoint: Default::default(),
            metrics: Default::default(),
            dashboard: Default::default(),
            sandbox: Default::default(),
            reward: Default::default(),
        }
    }
}

/// `[reward]`: settings of rewards computed outside the Rust process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardSection {
    /// The Python worker pool (`rollflash_env::verify::python`): interpreter, workers,
    /// deadlines. Started only by a dataset task with `reward = { python = … }`.
    pub python: rollflash_env::verify::python::PythonPoolConfig,
}

/// `train.preset` of the table as written, if any (a bad name is a type error naming it).
fn preset_of(table: &toml::Table) -> Result<Option<Preset>, ConfigError> {
    let Some(v) = table.get("train").and_then(|t| t.get("preset")) else {
        return Ok(None);
    };
    Preset::deserialize(v.clone())
        .map(Some)
        .map_err(|source| ConfigError::Type {
            key: "train.preset".into(),
            source: Box::new(source),
        })
}

impl TrainConfig {
    /// Reads `path` (or starts from the defaults), applies `--set key=value` overrides,
    /// parses and validates.
    pub fn load(path: Option<&std::path::Path>, sets: &[String]) -> Result<Self, ConfigError> {
        let mut table: toml::Table = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                text.parse::<toml::Table>()
                    .map_err(|source| ConfigError::Toml {
                        path: p.to_path_buf(),
                        source: Box::new(source),
                    })?
            }
            None => toml::Table::new(),
        };
        for s in sets {
            apply_set(&mut table, s)?;
        }
        // Lay what was given over the full default, so a partial section keeps the
        // defaults of the fields it does not mention.
        let mut merged = match toml::Value::try_from(TrainConfig::default()) {
            Ok(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        };
        // A preset lies between the defaults and what was written, so explicit fields win.
        if let Some(preset) = preset_of(&table)? {
            let max_new_tokens = table
                .get("rollout")
                .and_then(|r| r.get("max_new_tokens"))
                .and_then(toml::Value::as_integer)
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(RolloutSection::default().max_new_tokens);
            let fragment = preset
                .table(max_new_tokens)
                .map_err(|reason| field("train.preset", reason))?;
            merge(&mut merged, fragment);
        }
        merge(&mut merged, table);
        let table = merged;
        // Deserialise through serde_path_to_error so a type error names its key path.
        let cfg: TrainConfig = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| ConfigError::Type {
                key: e.path().to_string(),
                source: Box::new(e.into_inner()),
            })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The shaping with its defaults that depend on the rollout filled in (the overlong
    /// punishment's `max_len` = `rollout.max_new_tokens`).
    pub fn shaping_resolved(&self) -> ShapingConfig {
        self.train.shaping_resolved(self.rollout.max_new_tokens)
    }

    /// The resolved configuration as TOML (what `--dry-run` prints).
    /// An inline environment API key is printed as `<redacted>`.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        let mut shown = self.clone();
        let redact = |k: &mut Option<String>| {
            if k.is_some() {
                *k = Some("<redacted>".into());
            }
        };
        match &mut shown.env {
            EnvSection::Remote(r) => redact(&mut r.api_key),
            EnvSection::OpenEnv(o) => redact(&mut o.api_key),
            EnvSection::Builtin(_) => {}
        }
        toml::to_string_pretty(&shown).map_err(ConfigError::Print)
    }

    /// The learner's settings: `[train]` with the rollout temperature the log-probs are
    /// re-computed under. One place, so train, bench and sim train alike.
    pub fn learner_config(
        &self,
        device: &candle_core::Device,
        threads: usize,
    ) -> rollflash_trainer::learner::LearnerConfig {
        let t = &self.train;
        rollflash_trainer::learner::LearnerConfig {
            optimizer: rollflash_model::train::OptimizerConfig {
                lr: t.lr,
                beta1: t.adam_beta1,
                beta2: t.adam_beta2,
                eps: t.adam_eps,
                weight_decay: t.weight_decay,
                max_grad_norm: Some(t.max_grad_norm),
                warmup_steps: t.lr_warmup_steps,
                total_steps: 0,
                ..Default::default()
            },
            loss: t.loss.clone(),
            advantage: t.advantage,
            shaping: t.shaping_resolved(self.rollout.max_new_tokens),
            temperature: self.rollout.temperature,
            threads,
            micro_batch_size: t.micro_batch_size,
            device: device.clone(),
        }
    }

    /// Every check serde cannot make. Errors name the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.buffer.validate()?;
        self.sandbox
            .validate()
            .map_err(|e| field(&format!("sandbox.{}", e.field), e.reason))?;
        self.reward
            .python
            .validate()
            .map_err(|e| field(&format!("reward.python.{}", e.field), e.reason))?;
        self.learner.validate(self)?;
        validate_dashboard(&self.dashboard)?;
        self.env.validate()?;
        validate_rollout(&self.rollout)?;
        validate_controller(&self.controller)?;
        validate_train(&self.train)?;
        self.shaping_resolved()
            .validate()
            .map_err(|source| ConfigError::Train {
                section: "train",
                source,
            })?;
        validate_warmup(&self.warmup)?;
        self.checkpoint.validate()?;
        if self.model.device == DeviceSpec::Cpu && self.model.dtype != DTypeSpec::F32 {
            return Err(field(
                "model.dtype",
                "the CPU kernels are f32 only (bf16 and f16 need model.device = \"cuda:N\")",
            ));
        }
        if self.controller.sync && self.buffer.alpha != 0.0 {
            return Err(field(
                "buffer.alpha",
                "controller.sync = true is the synchronous baseline and needs alpha = 0",
            ));
        }
        Ok(())
    }
}

/// `[dashboard]`'s checks serde cannot make.
fn validate_dashboard(d: &DashboardSection) -> Result<(), ConfigError> {
    check_key("dashboard", &d.api_key, &d.api_key_env)?;
    let mb = d.trajectories_max_mb;
    if !(mb >= 0.0) || !mb.is_finite() {
        return Err(field(
            "dashboard.trajectories_max_mb",
            "must be a number of MB ≥ 0 (0: no cap)",
        ));
    }
    Ok(())
}

/// `[rollout]`'s checks serde cannot make, its servers' included.
fn validate_rollout(r: &RolloutSection) -> Result<(), ConfigError> {
    if r.engines == 0 && r.servers.is_empty() {
        return Err(field(
            "rollout.engines",
            "must be at least 1 when there are no [[rollout.servers]]",
        ));
    }
    for (i, srv) in r.servers.iter().enumerate() {
        srv.validate(i)?;
        if let Some(j) = r.servers[..i].iter().position(|o| o.url == srv.url) {
            return Err(field(
                &format!("rollout.servers[{i}].url"),
                format!("{} is also rollout.servers[{j}]", srv.url),
            ));
        }
    }
    for (name, v) in [
        (
            "rollout.weight_sync_timeout_secs",
            r.weight_sync_timeout_secs,
        ),
        (
            "rollout.server_check_timeout_secs",
            r.server_check_timeout_secs,
        ),
    ] {
        check_timeout(name, v)?;
    }
    if r.engine_threads == Threads::Fixed(0) {
        return Err(field(
            "rollout.engine_threads",
            "must be at least 1 (or \"auto\")",
        ));
    }
    if r.max_running_requests == 0 {
        return Err(field("rollout.max_running_requests", "must be at least 1"));
    }
    if !(r.temperature > 0.0) || !r.temperature.is_finite() {
        return Err(field(
            "rollout.temperature",
            "must be > 0 for RL (sampling, not greedy)",
        ));
    }
    if !(r.top_p > 0.0 && r.top_p <= 1.0) {
        return Err(field("rollout.top_p", "must be in (0, 1]"));
    }
    if r.max_new_tokens == 0 {
        return Err(field("rollout.max_new_tokens", "must be at least 1"));
    }
    if r.max_turns == 0 {
        return Err(field("rollout.max_turns", "must be at least 1"));
    }
    if r.max_total_tokens <= r.max_new_tokens.min(8) {
        return Err(field(
            "rollout.max_total_tokens",
            "leaves no room to generate",
        ));
    }
    check_timeout("rollout.step_timeout_secs", r.step_timeout_secs)?;
    check_timeout("rollout.request_timeout_secs", r.request_timeout_secs)?;
    Ok(())
}

/// `[controller]`'s checks serde cannot make.
fn validate_controller(c: &ControllerSection) -> Result<(), ConfigError> {
    check_timeout("controller.serve_timeout_secs", c.serve_timeout_secs)?;
    check_timeout("controller.progress_timeout_secs", c.progress_timeout_secs)?;
    if !(c.stall_report_secs >= 0.0) || !(c.stall_report_secs <= MAX_TIMEOUT_SECS) {
        return Err(field(
            "controller.stall_report_secs",
            "must be >= 0 (0 = never) and at most a year (3.2e7)",
        ));
    }
    Ok(())
}

/// `[train]`'s checks serde cannot make, but the shaping's (whose defaults depend on
/// `[rollout]`: `TrainConfig::validate` checks it after this).
fn validate_train(t: &TrainSection) -> Result<(), ConfigError> {
    if t.steps == 0 {
        return Err(field("train.steps", "must be at least 1"));
    }
    if let Some(l) = &t.lora {
        l.validate("train.lora").map_err(|e| match e {
            rollflash_model::ModelError::Config { field: f, reason } => field(&f, reason),
            other => field("train.lora", other.to_string()),
        })?;
    }
    if !(t.lr > 0.0) || !t.lr.is_finite() {
        return Err(field("train.lr", "must be > 0"));
    }
    if t.threads == Threads::Fixed(0) {
        return Err(field("train.threads", "must be at least 1 (or \"auto\")"));
    }
    for (name, b) in [
        ("train.adam_beta1", t.adam_beta1),
        ("train.adam_beta2", t.adam_beta2),
    ] {
        if !(0.0..1.0).contains(&b) {
            return Err(field(name, "must be in [0, 1)"));
        }
    }
    if !(t.adam_eps > 0.0) || !t.adam_eps.is_finite() {
        return Err(field("train.adam_eps", "must be > 0"));
    }
    if !(t.max_grad_norm > 0.0) {
        return Err(field("train.max_grad_norm", "must be > 0"));
    }
    t.loss.validate().map_err(|source| ConfigError::Train {
        section: "train.loss",
        source,
    })?;
    t.advantage
        .validate()
        .map_err(|source| ConfigError::Train {
            section: "train.advantage",
            source,
        })?;
    Ok(())
}

/// `[warmup]`'s checks serde cannot make.
fn validate_warmup(w: &WarmupSection) -> Result<(), ConfigError> {
    if w.steps > 0 && w.batch_size == 0 {
        return Err(field("warmup.batch_size", "must be at least 1"));
    }
    if w.steps > 0 && !(w.lr > 0.0) {
        return Err(field("warmup.lr", "must be > 0"));
    }
    if !(0.0..=1.0).contains(&w.unmarked_fraction) {
        return Err(field("warmup.unmarked_fraction", "must be in [0, 1]"));
    }
    if !(0.0..=1.0).contains(&w.random_move_prob) {
        return Err(field("warmup.random_move_prob", "must be in [0, 1]"));
    }
    Ok(())
}

/// Deep-merges `over` into `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            // A section tagged by `name` (the environment, the advantage estimator) that
            // names another variant has other fields: it replaces the default's section.
            (Some(toml::Value::Table(b)), toml::Value::Table(o))
                if o.get("name").is_some_and(|n| Some(n) != b.get("name")) =>
            {
                base.insert(k, toml::Value::Table(o));
            }
            // The environment's other sources (`remote`, `openenv`) replace a built-in's
            // section (and each other's) whole.
            (Some(toml::Value::Table(b)), toml::Value::Table(o))
                if ENV_SOURCE_KEYS
                    .iter()
                    .any(|key| o.contains_key(*key) && !b.contains_key(*key)) =>
            {
                base.insert(k, toml::Value::Table(o));
            }
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Applies one `key.path=value` override. The value is read as a TOML value when it parses
/// as one (`3`, `0.5`, `true`, `"x"`, `[1, 2]`), else taken as a string.
fn apply_set(table: &mut toml::Table, arg: &str) -> Result<(), ConfigError> {
    let err = |reason: &str| ConfigError::Set {
        arg: arg.to_string(),
        reason: reason.to_string(),
    };
    let (key, raw) = arg
        .split_once('=')
        .ok_or_else(|| err("expected key=value"))?;
    let key = key.trim();
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(err("empty key"));
    }
    let value = format!("v = {}", raw.trim())
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.trim().to_string()));
    let parts: Vec<&str> = key.split('.').collect();
    let mut cur = table;
    for p in &parts[..parts.len() - 1] {
        let entry = cur
            .entry((*p).to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry
            .as_table_mut()
            .ok_or_else(|| err(&format!("`{p}` is not a table")))?;
    }
    if let Some(last) = parts.last() {
        cur.insert((*last).to_string(), value);
    }
    Ok(())
}
