//! The `rollflash train` configuration: one TOML document with a complete built-in default
//! (the built-in tiny model on the long-tailed arithmetic task, asynchronous with α = 1),
//! `--set key=value` overrides applied before parsing, and validation in one place whose
//! errors name the field.

use std::path::PathBuf;

use rollflash_core::buffer::BufferConfig;
use rollflash_core::proxy::Routing;
use rollflash_core::PauseMode;
use rollflash_env::envs::{EnvConfig, EnvSpec};
use rollflash_env::math_task::MathTaskConfig;
use rollflash_train::advantage::AdvantageEstimator;
use rollflash_train::loss::{LossConfig, PgVariant};
use rollflash_train::shaping::ShapingConfig;

use crate::preset::Preset;
use serde::{Deserialize, Serialize};

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

/// `[reward]`: settings of rewards computed outside the Rust process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardSection {
    /// The Python worker pool (`rollflash_env::verify::python`): interpreter, workers,
    /// deadlines. Started only by a dataset task with `reward = { python = … }`.
    pub python: rollflash_env::verify::python::PythonPoolConfig,
}

/// Which policy to start from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// A Hugging Face directory; empty means the built-in tiny model.
    pub path: Option<PathBuf>,
    /// Where the trainer and the embedded engines keep their tensors: `cpu`, or `cuda:N`
    /// (a build with the `cuda` feature).
    pub device: DeviceSpec,
    /// Precision of the weights and activations: `f32` (`bf16` and `f16` on CUDA only: the
    /// CPU kernels are f32).
    pub dtype: DTypeSpec,
}

/// How conversations become tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RendererChoice {
    /// The model directory's chat template when it has one (and is not a directory rollflash
    /// saved from its built-in model, which was trained on plain text); plain text otherwise.
    #[default]
    Auto,
    /// Plain text, turns joined by newlines.
    Plain,
    /// The model directory's chat template; refused when it has none.
    Chat,
}

/// A device as configs write it: `cpu` or `cuda:N`. Parsed once, by serde.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceSpec {
    #[default]
    Cpu,
    Cuda(usize),
}

impl TryFrom<String> for DeviceSpec {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| format!("unknown device `{other}` (cpu, cuda:N)")),
        }
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DeviceSpec::try_from(s.to_string())
    }
}

impl std::str::FromStr for DTypeSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(DTypeSpec::F32),
            "bf16" => Ok(DTypeSpec::Bf16),
            "f16" => Ok(DTypeSpec::F16),
            other => Err(format!("unknown dtype `{other}` (f32, bf16, f16)")),
        }
    }
}

impl From<DeviceSpec> for String {
    fn from(d: DeviceSpec) -> String {
        match d {
            DeviceSpec::Cpu => "cpu".into(),
            DeviceSpec::Cuda(n) => format!("cuda:{n}"),
        }
    }
}

/// A tensor precision as configs write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DTypeSpec {
    #[default]
    F32,
    Bf16,
    F16,
}

/// Supervised warm-up before RL (the built-in model starts from random weights).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WarmupSection {
    /// 0 skips the warm-up.
    pub steps: usize,
    pub batch_size: usize,
    /// AdamW learning rate. 2e-3 converges on every seed measured; 5e-3 stalled on some
    /// (`BENCHMARKS.md`, "The default over seeds").
    pub lr: f64,
    /// Fraction of warm-up solutions that stop after the worked steps, without the
    /// `#### answer` line the strict verifier reads. Real supervised data mixes answer
    /// formats; this leaves the warmed-up policy unsure of the format, which RL with a
    /// verifiable reward then settles (the run reports format-free accuracy beside it).
    pub unmarked_fraction: f64,
    /// Agentic warm-up: probability that a demonstration takes a uniformly random move
    /// instead of the optimal one at a turn (and plays on from where it lands, into a hole
    /// included). The warm-up then imitates a noisy expert, as real demonstrations are:
    /// the policy keeps probability on other moves, so RL's samples differ within a group
    /// and have something to learn from. 0: optimal play only.
    pub random_move_prob: f64,
    /// Reuse a warm-up checkpoint from an earlier run with the same settings.
    pub cache: bool,
    /// Where warm-up results are cached, shared by every run (each result under a key of
    /// its settings). Default: `$ROLLFLASH_CACHE_DIR/warmup`, else
    /// `$XDG_CACHE_HOME/rollflash/warmup`, else `~/.cache/rollflash/warmup`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<PathBuf>,
}

/// Generation and environment loop settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutSection {
    /// Embedded engine workers.
    pub engines: usize,
    /// CPU threads per engine worker.
    pub engine_threads: usize,
    /// Admission limit per engine.
    pub max_running_requests: usize,
    /// `round_robin`, `least_loaded` or `sticky`.
    pub routing: Routing,
    pub temperature: f64,
    pub top_p: f64,
    /// Tokens per model turn.
    pub max_new_tokens: usize,
    pub max_turns: usize,
    /// Budget of one trajectory's whole token sequence.
    pub max_total_tokens: usize,
    /// Bound on one environment `reset`/`step`.
    pub step_timeout_secs: f64,
    /// Bound on one generation attempt on a backend: past it the attempt is cancelled and
    /// retried on another backend, then failed (and counted) once the retries are spent.
    pub request_timeout_secs: f64,
    /// Extra trajectories per group; the first `group_size` to finish are kept.
    pub group_size_redundancy: usize,
    /// How conversations become tokens: `auto` (the model directory's chat template when it
    /// has one, else plain text), `plain`, or `chat`.
    pub renderer: RendererChoice,
    /// Rollout servers in other processes (`[[rollout.servers]]`), beside the `engines`
    /// embedded ones (which may then be 0); all go behind one proxy.
    pub servers: Vec<ServerSection>,
    /// Where the learner publishes each version for servers with `weights = "disk"` (one
    /// Hugging Face directory per version, the newest two kept). Default:
    /// `<output_dir>/published`. Servers must be able to read it (same machine, or a shared
    /// file system mounted at the same path).
    pub weights_dir: Option<PathBuf>,
    /// Bound on one backend's weight update in a sync: past it the backend leaves rotation
    /// and the sync goes on with the others.
    pub weight_sync_timeout_secs: f64,
    /// Bound on each start-up check of a server (health, model, vocabulary) and on its first
    /// weight load.
    pub server_check_timeout_secs: f64,
}

/// One rollout server (`[[rollout.servers]]`).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Which API it speaks: `sglang`, `vllm`, `openai` or `rollflash` (`rollflash serve`).
    pub kind: ServerKind,
    /// Its root, e.g. `http://10.0.0.5:30000` (`http://` only).
    pub url: String,
    /// The API key, sent as `Authorization: Bearer`. Never printed (`--dry-run` leaves it
    /// out); prefer `api_key_env`.
    #[serde(default, skip_serializing)]
    pub api_key: Option<String>,
    /// The environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// At most this many requests run on it at once; the rest wait in the proxy's queue.
    #[serde(default = "default_server_running")]
    pub max_running_requests: usize,
    /// How it receives new weights: `disk` (loads each published directory) or `none` (keeps
    /// its own: a frozen judge or a fixed-policy evaluation; in a training run it leaves
    /// rotation at the first weight sync).
    #[serde(default)]
    pub weights: ServerWeights,
    /// The `model` sent to an OpenAI-compatible server; default: the first of `/v1/models`.
    #[serde(default)]
    pub model: Option<String>,
    /// Bound on one HTTP call to it, a whole generation included (default 600).
    #[serde(default)]
    pub timeout_secs: Option<f64>,
    /// Bound on opening a connection to it (default 5).
    #[serde(default)]
    pub connect_timeout_secs: Option<f64>,
    /// Bound on one weight update of this server, its pause and resume included (default
    /// `rollout.weight_sync_timeout_secs`): a server whose reload is slow gets more time
    /// without the others' hung updates being waited on as long. Each HTTP call of the
    /// update is also bounded by `timeout_secs`.
    #[serde(default)]
    pub weight_sync_timeout_secs: Option<f64>,
}

impl std::fmt::Debug for ServerSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSection")
            .field("kind", &self.kind)
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("api_key_env", &self.api_key_env)
            .field("max_running_requests", &self.max_running_requests)
            .field("weights", &self.weights)
            .field("model", &self.model)
            .field("timeout_secs", &self.timeout_secs)
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .field("weight_sync_timeout_secs", &self.weight_sync_timeout_secs)
            .finish()
    }
}

fn default_server_running() -> usize {
    64
}

/// The API a rollout server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// SGLang's native API (`/generate` with token ids, `/update_weights_from_disk`).
    Sglang,
    /// vLLM's OpenAI server with its RL routes.
    Vllm,
    /// Any OpenAI-compatible server (`/v1/completions` with token ids); `weights = "disk"`
    /// posts SGLang's `/update_weights_from_disk`, which `rollflash serve` has.
    Openai,
    /// `rollflash serve` (its SGLang-native API, with per-token versions).
    Rollflash,
    /// A Tinker server's sampler (`asample`): the rollout side of `learner.kind = "tinker"`.
    Tinker,
}

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
    fn validate(&self, c: &TrainConfig) -> Result<(), ConfigError> {
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

/// How a rollout server receives new weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerWeights {
    /// It loads each version the learner publishes under `rollout.weights_dir`: with
    /// `[train.lora]` and a server with runtime LoRA routes (`vllm`, `sglang`, `rollflash`),
    /// the adapter only (a PEFT directory, checked by a probe after each load); otherwise the
    /// merged model.
    #[default]
    Disk,
    /// As `disk`, but always the whole merged model (adapter-only sync off).
    Merged,
    /// It keeps the weights it was started with.
    None,
}

impl ServerWeights {
    /// Whether a server of `kind` with these settings is sent adapters only: the one place
    /// the adapter route is decided.
    pub fn sends_adapter(self, kind: ServerKind, lora: bool) -> bool {
        lora && self == ServerWeights::Disk
            && matches!(
                kind,
                ServerKind::Vllm | ServerKind::Sglang | ServerKind::Rollflash
            )
    }
}

impl ServerSection {
    fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let section = format!("rollout.servers[{i}]");
        let name = |f: &str| format!("{section}.{f}");
        check_url(&name("url"), &self.url)?;
        if self.max_running_requests == 0 {
            return Err(field(&name("max_running_requests"), "must be at least 1"));
        }
        check_key(&section, &self.api_key, &self.api_key_env)?;
        // A server's key is needed at start-up: an unset variable is named at load.
        resolve_api_key(&section, &self.api_key, &self.api_key_env)?;
        for (f, v) in [
            ("timeout_secs", self.timeout_secs),
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("weight_sync_timeout_secs", self.weight_sync_timeout_secs),
        ] {
            if let Some(v) = v {
                check_timeout(&name(f), v)?;
            }
        }
        Ok(())
    }
}

/// The optimiser side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSection {
    /// Training steps (policy versions published).
    pub steps: usize,
    pub lr: f64,
    /// CPU threads of the trainer.
    pub threads: usize,
    /// Sequences per forward/backward pass within a step (0 = the whole batch); gradients
    /// are accumulated and one optimiser step is taken per batch.
    pub micro_batch_size: usize,
    pub max_grad_norm: f64,
    pub weight_decay: f64,
    /// AdamW's β₁, β₂ and ε (the Hugging Face `adam_beta1`, `adam_beta2`, `adam_epsilon`).
    pub adam_beta1: f64,
    pub adam_beta2: f64,
    pub adam_eps: f64,
    /// Linear learning-rate warm-up steps.
    pub lr_warmup_steps: usize,
    /// A named algorithm (`grpo`, `dapo`, `dr_grpo`, `reinforce_pp`, `gspo`, `lite_ppo`):
    /// expands to `advantage`, `loss`, `shaping` (and, for DAPO, `buffer.filter`) settings
    /// under what is written explicitly (`crate::preset`).
    pub preset: Option<Preset>,
    /// Advantage estimator (`grpo`, `rloo`, `reinforce_plus_plus`, or `gigpo` — GiGPO's
    /// step-level advantages for multi-turn environments: `gamma` 0.95, `step_advantage_w` 1,
    /// `mode` `mean_norm` | `mean_std_norm`, `eps` 1e-6).
    pub advantage: AdvantageEstimator,
    /// The policy loss, its aggregation, KL and entropy terms.
    pub loss: LossConfig,
    /// Reward and advantage shaping around the estimator: ROLL's `norm_mean_type` /
    /// `norm_std_type` (`none`, `group`, `batch`, `running` — running statistics are kept in
    /// checkpoints), `reward_clip`, `whiten_advantages`, `advantage_clip`, and DAPO's
    /// soft overlong punishment (`[train.shaping.overlong]`).
    pub shaping: ShapingConfig,
    /// Greedy evaluation problems before and after training (0 = none).
    pub eval_problems: usize,
    /// Samples per held-out task for pass@1 at the rollout temperature (0 = greedy only).
    pub eval_samples: usize,
    /// `[train.lora]`: train LoRA adapters (PEFT's definition) on a frozen base instead of
    /// every weight. Absent = full fine-tuning. Fields: `rank` (8), `alpha` (8), `dropout`
    /// (0), `target_modules` (the attention and MLP projections: `q_proj`, `k_proj`,
    /// `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<rollflash_model::lora::LoraConfig>,
}

/// The controller loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerSection {
    /// What a weight sync does to in-flight requests: `abort` or `keep`.
    pub pause_mode: PauseMode,
    /// Run the synchronous baseline instead: α = 0 and no generation while training.
    pub sync: bool,
    /// After a weight sync that no backend could load, how long the run goes on waiting for
    /// one to be caught up before it stops (with a checkpoint) as stalled.
    pub serve_timeout_secs: f64,
    /// Between steps, how long the run goes on with no group adding a sample to the buffer
    /// (an environment or every server failing each trajectory, or a filter nothing passes)
    /// before it stops with a checkpoint, saying what it waited on.
    pub progress_timeout_secs: f64,
    /// With no step published for this long, log what the run waits on (the trainer, the
    /// buffer, the proxy's queue and each backend) and again every such interval; 0 = never.
    pub stall_report_secs: f64,
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

impl Default for WarmupSection {
    fn default() -> Self {
        WarmupSection {
            steps: 600,
            batch_size: 64,
            lr: 2e-3,
            // Half the warm-up solutions lack the `####` line: the warmed-up policy is unsure
            // of the format, greedy picks the wrong one, and RL has to settle it (BENCHMARKS).
            unmarked_fraction: 0.5,
            random_move_prob: 0.0,
            cache: true,
            cache_dir: None,
        }
    }
}

impl Default for RolloutSection {
    fn default() -> Self {
        RolloutSection {
            engines: 1,
            engine_threads: 1,
            max_running_requests: 64,
            routing: Routing::LeastLoaded,
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 64,
            max_turns: 1,
            max_total_tokens: 128,
            step_timeout_secs: 30.0,
            request_timeout_secs: rollflash_rollout::DEFAULT_REQUEST_TIMEOUT.as_secs_f64(),
            group_size_redundancy: 0,
            renderer: RendererChoice::Auto,
            servers: Vec::new(),
            weights_dir: None,
            weight_sync_timeout_secs: rollflash_rollout::DEFAULT_UPDATE_TIMEOUT.as_secs_f64(),
            server_check_timeout_secs: 30.0,
        }
    }
}

impl Default for TrainSection {
    fn default() -> Self {
        TrainSection {
            steps: 50,
            // Small, with a warm-up: AdamW's first steps move every parameter by about the
            // learning rate whatever the gradient; 1e-3 wrecked the warmed-up policy.
            lr: 1e-4,
            threads: 1,
            micro_batch_size: 0,
            max_grad_norm: 1.0,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_eps: 1e-8,
            lr_warmup_steps: 10,
            advantage: AdvantageEstimator::Grpo {
                norm_by_std: true,
                eps: 1e-6,
            },
            // Decoupled PPO: the behaviour log-probs recorded at generation weight each
            // token against the proximal policy, which is what makes α > 0 safe.
            loss: LossConfig {
                pg_variant: PgVariant::DecoupledPpo,
                ..LossConfig::default()
            },
            preset: None,
            shaping: ShapingConfig::default(),
            eval_problems: 200,
            eval_samples: 4,
            lora: None,
        }
    }
}

impl TrainSection {
    /// `shaping` with the overlong punishment's `max_len` defaulted to `max_new_tokens`.
    pub fn shaping_resolved(&self, max_new_tokens: usize) -> ShapingConfig {
        let mut s = self.shaping;
        if let Some(o) = &mut s.overlong {
            o.max_len.get_or_insert(max_new_tokens);
        }
        s
    }
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

impl Default for ControllerSection {
    fn default() -> Self {
        ControllerSection {
            pause_mode: PauseMode::Abort,
            sync: false,
            serve_timeout_secs: rollflash_trainer::DEFAULT_SERVE_TIMEOUT.as_secs_f64(),
            progress_timeout_secs: rollflash_trainer::DEFAULT_PROGRESS_TIMEOUT.as_secs_f64(),
            stall_report_secs: rollflash_trainer::DEFAULT_STALL_REPORT.as_secs_f64(),
        }
    }
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
            threads: t.threads,
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
        check_key(
            "dashboard",
            &self.dashboard.api_key,
            &self.dashboard.api_key_env,
        )?;
        let mb = self.dashboard.trajectories_max_mb;
        if !(mb >= 0.0) || !mb.is_finite() {
            return Err(field(
                "dashboard.trajectories_max_mb",
                "must be a number of MB ≥ 0 (0: no cap)",
            ));
        }
        self.env.validate()?;
        let r = &self.rollout;
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
        if r.engine_threads == 0 {
            return Err(field("rollout.engine_threads", "must be at least 1"));
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
        let c = &self.controller;
        check_timeout("controller.serve_timeout_secs", c.serve_timeout_secs)?;
        check_timeout("controller.progress_timeout_secs", c.progress_timeout_secs)?;
        if !(c.stall_report_secs >= 0.0) || !(c.stall_report_secs <= MAX_TIMEOUT_SECS) {
            return Err(field(
                "controller.stall_report_secs",
                "must be >= 0 (0 = never) and at most a year (3.2e7)",
            ));
        }
        let t = &self.train;
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
        if t.threads == 0 {
            return Err(field("train.threads", "must be at least 1"));
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
        self.shaping_resolved()
            .validate()
            .map_err(|source| ConfigError::Train {
                section: "train",
                source,
            })?;
        if self.warmup.steps > 0 && self.warmup.batch_size == 0 {
            return Err(field("warmup.batch_size", "must be at least 1"));
        }
        if self.warmup.steps > 0 && !(self.warmup.lr > 0.0) {
            return Err(field("warmup.lr", "must be > 0"));
        }
        if !(0.0..=1.0).contains(&self.warmup.unmarked_fraction) {
            return Err(field("warmup.unmarked_fraction", "must be in [0, 1]"));
        }
        if !(0.0..=1.0).contains(&self.warmup.random_move_prob) {
            return Err(field("warmup.random_move_prob", "must be in [0, 1]"));
        }
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

/// When to write checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointSection {
    /// Write one every this many steps (0 = never; the final weights are saved unless
    /// `final = false`).
    pub every: usize,
    /// How many of the newest checkpoints to keep.
    pub keep: usize,
    /// What a checkpoint that cannot be written (a full disk) does to the run: `stop` (the
    /// default: the run stops with the error; what was written before is intact) or
    /// `continue` (the run goes on without that checkpoint and says so).
    pub on_error: OnCheckpointError,
    /// `final`: write the trained model to `output_dir/final/` when the run completes (the
    /// default). `false` skips that full copy of the model (500 MB and more for a real one)
    /// for runs that need only their metrics, such as benchmarks. A run that stops early
    /// still writes its resumable checkpoint.
    #[serde(rename = "final")]
    pub save_final: bool,
}

/// `checkpoint.on_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCheckpointError {
    #[default]
    Stop,
    Continue,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            every: 0,
            keep: 3,
            on_error: OnCheckpointError::Stop,
            save_final: true,
        }
    }
}

impl CheckpointSection {
    /// Checks ranges; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.every > 0 && self.keep == 0 {
            return Err(ConfigError::Field {
                field: "checkpoint.keep".into(),
                reason: "must be at least 1 when checkpoint.every > 0".into(),
            });
        }
        Ok(())
    }
}

/// Observability of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Serve Prometheus metrics at this address during the run (e.g. `127.0.0.1:9400`);
    /// absent means no endpoint. Loopback unless you mean to expose it.
    pub prometheus: Option<std::net::SocketAddr>,
    /// Show a progress bar (only ever when stdout is a terminal).
    pub progress: bool,
    /// Write `report/` (plots and `report.md`) at the end of the run.
    pub report: bool,
    /// Write TensorBoard event files under `output_dir/tensorboard/` (every numeric metric
    /// of each step, and the held-out evaluations), flushed per step.
    pub tensorboard: bool,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            prometheus: None,
            progress: true,
            report: true,
            tensorboard: false,
        }
    }
}

/// `[dashboard]`: the page that shows the run while it runs (`rollflash-dashboard`), and
/// the trajectories it shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DashboardSection {
    /// Serve the dashboard here during the run (`--dashboard` sets it); absent means none.
    /// An address beyond loopback needs an API key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<std::net::SocketAddr>,
    /// The dashboard's API key (prefer `api_key_env`; without either, `ROLLFLASH_API_KEY`
    /// when set, as for `rollflash serve`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The environment variable holding the API key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Trajectories of each trained batch saved to `trajectories.jsonl` (spread over the
    /// batch's rewards); 0 saves none.
    pub trajectories_per_step: usize,
    /// The size (MB, 10^6 bytes) at which `trajectories.jsonl` stops growing: later steps'
    /// trajectories are not saved (the log says from which step). 0: no cap.
    pub trajectories_max_mb: f64,
}

impl Default for DashboardSection {
    fn default() -> Self {
        DashboardSection {
            addr: None,
            api_key: None,
            api_key_env: None,
            trajectories_per_step: 4,
            trajectories_max_mb: 100.0,
        }
    }
}

/// The keys that make `env` another source than a built-in environment.
const ENV_SOURCE_KEYS: [&str; 2] = ["remote", "openenv"];

/// `env`: where trajectories' environments come from. In TOML, a built-in environment's
/// spec (`[env]` with `name = "math"` and its fields), or one key naming another source:
/// `[env.remote]` (a `rollflash env-serve` server) or `[env.openenv]` (an OpenEnv server).
#[derive(Debug, Clone, PartialEq)]
pub enum EnvSection {
    /// A built-in environment in this process.
    Builtin(EnvSpec),
    /// The spec built by a `rollflash env-serve` server.
    Remote(RemoteEnvSection),
    /// An environment on an OpenEnv server.
    OpenEnv(OpenEnvSection),
}

/// `[env.remote]`: an environment on a `rollflash env-serve` server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteEnvSection {
    /// The server, e.g. `http://127.0.0.1:8123`.
    pub url: String,
    /// The server's API key (prefer `api_key_env`: a key in a config file gets copied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The environment variable that holds the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Deadline of each request (create, reset, step, delete, the start-up check).
    #[serde(default = "default_env_timeout")]
    pub timeout_secs: f64,
    /// The environment the server builds, as a built-in `[env]` would be written.
    pub spec: EnvSpec,
}

/// `[env.openenv]`: an environment on an OpenEnv server (see `rollflash_env::openenv` for
/// how its actions and observations map to text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenEnvSection {
    /// The server, `http://host:port`.
    pub url: String,
    /// Sent as a bearer token (OpenEnv has no auth itself; a gateway in front may).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The environment variable that holds the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Deadline of each request and session message.
    #[serde(default = "default_env_timeout")]
    pub timeout_secs: f64,
    /// The action's string field the model's text goes into (default: the only one in the
    /// server's action schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_field: Option<String>,
    /// Fixed fields sent with every action.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub action_extra: serde_json::Map<String, serde_json::Value>,
    /// The observation field shown to the model (default: the only string field, else the
    /// whole observation as JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation_field: Option<String>,
    /// Extra fields of every reset besides `seed`.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub reset_extra: serde_json::Map<String, serde_json::Value>,
    /// The episode reward at or above which a sample counts as a success (accuracy).
    #[serde(default = "default_success_reward")]
    pub success_reward: f64,
}

fn default_success_reward() -> f64 {
    1.0
}

fn default_env_timeout() -> f64 {
    30.0
}

impl EnvSection {
    /// The environment's name: the built-in's (or the one the remote server builds), or
    /// `openenv`.
    pub fn name(&self) -> &'static str {
        match self {
            EnvSection::Builtin(s) => s.name(),
            EnvSection::Remote(r) => r.spec.name(),
            EnvSection::OpenEnv(_) => "openenv",
        }
    }

    /// The spec of the tasks, when rollflash knows it (a built-in, or what a remote
    /// `env-serve` builds); `None` for OpenEnv.
    pub fn spec(&self) -> Option<&EnvSpec> {
        match self {
            EnvSection::Builtin(s) => Some(s),
            EnvSection::Remote(r) => Some(&r.spec),
            EnvSection::OpenEnv(_) => None,
        }
    }

    /// Checks ranges and consistency; errors name the field (`env.remote.url`, …).
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            EnvSection::Builtin(s) => s.validate().map_err(ConfigError::Env),
            EnvSection::Remote(r) => {
                check_url("env.remote.url", &r.url)?;
                check_key("env.remote", &r.api_key, &r.api_key_env)?;
                check_timeout("env.remote.timeout_secs", r.timeout_secs)?;
                r.spec.validate().map_err(|e| match e {
                    rollflash_env::EnvError::Config { field, reason } => {
                        self::field(&format!("env.remote.spec.{field}"), reason)
                    }
                    other => ConfigError::Env(other),
                })
            }
            EnvSection::OpenEnv(o) => {
                check_key("env.openenv", &o.api_key, &o.api_key_env)?;
                if !o.success_reward.is_finite() {
                    return Err(field("env.openenv.success_reward", "must be finite"));
                }
                // The client's own checks, with its field names under `env.openenv`.
                o.client_config(None).validate().map_err(|e| match e {
                    rollflash_env::EnvError::Config { field, reason } => {
                        self::field(&format!("env.openenv.{field}"), reason)
                    }
                    other => ConfigError::Env(other),
                })
            }
        }
    }
}

impl OpenEnvSection {
    /// The client's configuration, with the resolved API key.
    pub fn client_config(&self, api_key: Option<String>) -> rollflash_env::openenv::OpenEnvConfig {
        rollflash_env::openenv::OpenEnvConfig {
            url: self.url.clone(),
            api_key,
            timeout_secs: self.timeout_secs,
            action_field: self.action_field.clone(),
            action_extra: self.action_extra.clone(),
            observation_field: self.observation_field.clone(),
            reset_extra: self.reset_extra.clone(),
        }
    }
}

fn check_url(name: &str, url: &str) -> Result<(), ConfigError> {
    match url.strip_prefix("http://") {
        Some(rest) if !rest.trim_end_matches('/').is_empty() => Ok(()),
        _ => Err(field(
            name,
            format!("`{url}` is not an http:// URL (TLS is not built in)"),
        )),
    }
}

fn check_key(
    section: &str,
    key: &Option<String>,
    key_env: &Option<String>,
) -> Result<(), ConfigError> {
    match (key, key_env) {
        (Some(_), Some(_)) => Err(field(
            &format!("{section}.api_key_env"),
            "set api_key or api_key_env, not both",
        )),
        (_, Some(v)) if v.is_empty() => Err(field(
            &format!("{section}.api_key_env"),
            "must not be empty",
        )),
        _ => Ok(()),
    }
}

fn check_timeout(name: &str, secs: f64) -> Result<(), ConfigError> {
    if !(secs > 0.0) || !secs.is_finite() {
        return Err(field(name, "must be > 0"));
    }
    // A deadline is an `Instant` offset: one past a year is no bound a run needs, and a
    // huge one would overflow `Duration`/`Instant` arithmetic instead of failing here.
    if secs > MAX_TIMEOUT_SECS {
        return Err(field(name, "must be at most 3.2e7 (about a year)"));
    }
    Ok(())
}

/// The largest timeout accepted anywhere (about a year, in seconds).
const MAX_TIMEOUT_SECS: f64 = 3.2e7;

/// Reads the API key a section names: inline, or from its environment variable (an unset
/// or empty variable is an error naming the field).
pub fn resolve_api_key(
    section: &str,
    key: &Option<String>,
    key_env: &Option<String>,
) -> Result<Option<String>, ConfigError> {
    match (key, key_env) {
        (Some(k), _) => Ok(Some(k.clone())),
        (None, Some(var)) => match std::env::var(var) {
            Ok(k) if !k.is_empty() => Ok(Some(k)),
            _ => Err(field(
                &format!("{section}.api_key_env"),
                format!("the environment variable `{var}` is not set"),
            )),
        },
        (None, None) => Ok(None),
    }
}

impl Serialize for EnvSection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(untagged)]
        enum Wire<'a> {
            Builtin(&'a EnvSpec),
            Remote { remote: &'a RemoteEnvSection },
            OpenEnv { openenv: &'a OpenEnvSection },
        }
        match self {
            EnvSection::Builtin(spec) => Wire::Builtin(spec),
            EnvSection::Remote(remote) => Wire::Remote { remote },
            EnvSection::OpenEnv(openenv) => Wire::OpenEnv { openenv },
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for EnvSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = toml::Value::deserialize(d)?;
        let source = value.as_table().and_then(|t| {
            ENV_SOURCE_KEYS
                .iter()
                .find(|k| t.contains_key(**k))
                .map(|k| (*k, t))
        });
        let Some((key, table)) = source else {
            return EnvSpec::deserialize(value)
                .map(EnvSection::Builtin)
                .map_err(D::Error::custom);
        };
        if table.len() > 1 {
            let others: Vec<&str> = table
                .keys()
                .map(String::as_str)
                .filter(|k| *k != key)
                .collect();
            return Err(D::Error::custom(format!(
                "`{key}` is the whole environment; `{}` belongs in `{key}.spec` or nowhere",
                others.join("`, `")
            )));
        }
        let inner = table
            .get(key)
            .cloned()
            .unwrap_or(toml::Value::Table(Default::default()));
        // Nested paths in the message: serde_path_to_error stops at `env` here.
        fn sub<T: serde::de::DeserializeOwned>(key: &str, v: toml::Value) -> Result<T, String> {
            serde_path_to_error::deserialize(v).map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                if path == "." {
                    format!("{key}: {inner}")
                } else {
                    format!("{key}.{path}: {inner}")
                }
            })
        }
        match key {
            "remote" => sub(key, inner).map(EnvSection::Remote),
            _ => sub(key, inner).map(EnvSection::OpenEnv),
        }
        .map_err(D::Error::custom)
    }
}
