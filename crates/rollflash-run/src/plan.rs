//! The run plan: the second stage of the config. [`TrainConfig`] is what the user wrote
//! (serde, defaults, `--set`); [`RunPlan::new`] validates it once and derives, in one place,
//! everything the run is built from — device and dtype, the backends, the environment
//! source, the seed rules, the warm-up cache, the controller's, proxy's, environment
//! manager's and learner's settings. `train`, `eval`, `bench` and `sim validate` build from a
//! plan ([`crate::stack`]), so a rule derived from the config exists once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use candle_core::{DType, Device};
use rollflash_core::buffer::Schedule;
use rollflash_core::proxy::Routing;
use rollflash_core::{PauseMode, SamplingParams};
use rollflash_env::envs::{DatasetTaskConfig, EnvConfig, EnvSpec};
use rollflash_env::openenv::OpenEnvConfig;
use rollflash_env::remote::RemoteEnvConfig;
use rollflash_rollout::{EnvManagerConfig, HttpBackendConfig, ProxyConfig, Replication};
use rollflash_trainer::learner::LearnerConfig;
use rollflash_trainer::{ControllerConfig, CoreConfig, TinkerLearnerConfig};

use crate::config::{
    resolve_api_key, ConfigError, DTypeSpec, DeviceSpec, EnvSection, LearnerKind,
    OnCheckpointError, RendererChoice, RolloutSection, ServerKind, ServerWeights, TrainConfig,
    WarmupSection,
};
use crate::cores::CoreSplit;
use crate::eval::success_threshold;

/// A plan could not be made from a (valid) config.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `model.device = "cuda:N"` in a build without the `cuda` feature.
    #[error("model.device = \"cuda:{0}\" needs a build with the `cuda` feature (cargo build --features cuda)")]
    NoCuda(usize),
    /// `dashboard.addr` beyond loopback without an API key: anyone on the network could
    /// read the run.
    #[error(
        "dashboard.addr = {0} is not a loopback address: set dashboard.api_key_env (or \
         ROLLFLASH_API_KEY), or bind 127.0.0.1"
    )]
    DashboardNeedsKey(SocketAddr),
    /// The device could not be opened.
    #[error("model.device = \"{device}\"")]
    Device {
        device: String,
        #[source]
        source: Box<candle_core::Error>,
    },
}

/// Where tensors live and in what precision: the one place the run's device and dtype come
/// from.
#[derive(Debug, Clone)]
pub struct Placement {
    pub device: Device,
    pub dtype: DType,
}

impl Default for Placement {
    /// The CPU in f32: what every kernel of the engine and the trainer supports.
    fn default() -> Self {
        Placement {
            device: Device::Cpu,
            dtype: DType::F32,
        }
    }
}

impl Placement {
    /// Opens `device` for tensors of `dtype`.
    pub fn new(device: DeviceSpec, dtype: DTypeSpec) -> Result<Self, PlanError> {
        let dtype = match dtype {
            DTypeSpec::F32 => DType::F32,
            DTypeSpec::Bf16 => DType::BF16,
            DTypeSpec::F16 => DType::F16,
        };
        let device = match device {
            DeviceSpec::Cpu => Device::Cpu,
            DeviceSpec::Cuda(n) => cuda(n)?,
        };
        Ok(Placement { device, dtype })
    }
}

#[cfg(feature = "cuda")]
fn cuda(n: usize) -> Result<Device, PlanError> {
    Device::new_cuda(n).map_err(|source| PlanError::Device {
        device: String::from(DeviceSpec::Cuda(n)),
        source: Box::new(source),
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda(n: usize) -> Result<Device, PlanError> {
    Err(PlanError::NoCuda(n))
}

/// The policy the run starts from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// The built-in tiny model, randomly initialised from the seed.
    Builtin { seed: u64 },
    /// A Hugging Face directory.
    Dir(PathBuf),
}

/// One rollout backend.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendPlan {
    /// An engine in this process, on its own threads.
    Engine {
        name: String,
        threads: usize,
        max_running_requests: usize,
    },
    /// A server in another process (`[[rollout.servers]]`), reached over HTTP.
    Remote {
        kind: ServerKind,
        /// URL, API key (resolved from `api_key_env`), per-call timeouts.
        http: HttpBackendConfig,
        max_running_requests: usize,
        weights: ServerWeights,
        /// The `model` of OpenAI requests (`None`: the server's first).
        model: Option<String>,
        /// Bound on one weight update of it (its own `weight_sync_timeout_secs`, else
        /// `rollout.weight_sync_timeout_secs`).
        weight_sync_timeout: Duration,
    },
}

impl BackendPlan {
    /// Whether it loads each published version from `RunPlan::weights_dir`.
    pub fn takes_disk_weights(&self) -> bool {
        match self {
            // A Tinker sampler loads the learner's `tinker://` paths, never a directory.
            BackendPlan::Remote {
                kind: ServerKind::Tinker,
                ..
            } => false,
            BackendPlan::Remote { weights, .. } => {
                matches!(weights, ServerWeights::Disk | ServerWeights::Merged)
            }
            BackendPlan::Engine { .. } => false,
        }
    }
}

/// Where tasks come from.
#[derive(Debug, Clone, PartialEq)]
pub enum EnvSource {
    /// A built-in environment (generated tasks), with the training spec's latency and
    /// failure injection; evaluation uses it without them.
    Builtin(EnvSpec),
    /// A spec built by a `rollflash env-serve` server (one HTTP client per run);
    /// evaluation runs the same spec there without injected latency or failures.
    Remote(RemoteEnvConfig),
    /// An environment on an OpenEnv server, for training and evaluation alike.
    OpenEnv(OpenEnvConfig),
}

impl EnvSource {
    /// The spec training rolls out in, when rollflash knows it (not for OpenEnv).
    pub fn train_spec(&self) -> Option<&EnvSpec> {
        match self {
            EnvSource::Builtin(s) => Some(s),
            EnvSource::Remote(r) => Some(&r.spec),
            EnvSource::OpenEnv(_) => None,
        }
    }

    /// The spec evaluation runs: the same tasks without injected latency or failures.
    pub fn eval_spec(&self) -> Option<EnvSpec> {
        let mut spec = self.train_spec()?.clone();
        spec.latency = None;
        spec.failure = None;
        Some(spec)
    }

    /// The environment's name (`openenv` for an OpenEnv server's).
    pub fn name(&self) -> &'static str {
        self.train_spec().map_or("openenv", EnvSpec::name)
    }

    /// Where it runs, for people: `in process`, or the server's URL.
    pub fn location(&self) -> String {
        match self {
            EnvSource::Builtin(_) => "in process".into(),
            EnvSource::Remote(r) => format!(
                "on env-serve {} (auth {}, {:.0} s per request)",
                r.url,
                if r.api_key.is_some() { "on" } else { "off" },
                r.timeout.as_secs_f64()
            ),
            EnvSource::OpenEnv(o) => format!(
                "on OpenEnv {} (action field {}, observation field {}, {:.0} s per message)",
                o.url,
                o.action_field.as_deref().unwrap_or("from the schema"),
                o.observation_field.as_deref().unwrap_or("auto"),
                o.timeout_secs
            ),
        }
    }
}

/// The supervised warm-up the task needs, if any.
#[derive(Debug, Clone, PartialEq)]
pub enum WarmupPlan {
    /// No warm-up: `warmup.steps = 0`, or a resumed run (past it).
    None,
    /// The environment has no warm-up data (only math and frozen_lake do).
    Unsupported { env: &'static str },
    /// Warm up with `settings`, reusing (or writing) the cache at `cache`.
    Run {
        cache: PathBuf,
        reuse: bool,
        settings: WarmupSettings,
    },
}

/// Held-out evaluation before and after RL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalPlan {
    /// Tasks (greedy, one each); 0 = no evaluation.
    pub problems: usize,
    /// Samples per task for pass@1 at `temperature` (0 = greedy only).
    pub samples: usize,
    pub temperature: f64,
    /// `train.eval_every`: a greedy evaluation of every this many steps' policy (0 = never).
    pub every: usize,
}

/// Where a run writes: its folder, checkpoints and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputPlan {
    /// `output_dir`: metrics, checkpoints, `final/`, the report.
    pub dir: PathBuf,
    pub checkpoint: CheckpointPlan,
    pub metrics: MetricsPlan,
}

/// When checkpoints are written and what a failed one does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckpointPlan {
    /// One every this many steps (0 = none but the final weights).
    pub every: usize,
    /// The newest this many are kept.
    pub keep: usize,
    pub on_error: OnCheckpointError,
    /// A completed run writes `final/` (`checkpoint.final`).
    pub save_final: bool,
}

/// What a run reports besides `metrics.jsonl`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricsPlan {
    /// Progress bars (only ever on a terminal).
    pub progress: bool,
    /// TensorBoard event files.
    pub tensorboard: bool,
    /// `report/` at the end.
    pub report: bool,
    /// The Prometheus endpoint's address.
    pub prometheus: Option<SocketAddr>,
}

/// What a supervised warm-up runs with: its section, the run's seed, and the threads and
/// limits of the run it precedes.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmupSettings {
    pub section: WarmupSection,
    pub seed: u64,
    /// All the run's CPU threads, up to the cores ([`CoreSplit::warmup_threads`]): nothing
    /// else runs yet.
    pub threads: usize,
    /// The rollout's turn and token limits (the agentic warm-up's demonstrations keep to
    /// them).
    pub max_turns: usize,
    pub max_total_tokens: usize,
}

/// Who runs the training step.
#[derive(Debug, Clone)]
pub enum TrainerPlan {
    /// rollflash's `PolicyLearner`, in this process.
    Embedded,
    /// A Tinker server (`[learner] kind = "tinker"`); rollout samples from its samplers.
    Tinker(Box<TinkerLearnerConfig>),
}

/// Everything a run is built from, validated and typed. Made once from a [`TrainConfig`]
/// ([`RunPlan::new`]), read through its getters; the variants the bench runs are derived with
/// `with_*` methods that re-validate, so no rule derived here is computed anywhere else.
#[derive(Debug, Clone)]
pub struct RunPlan {
    seed: u64,
    /// The threads of the engines and the trainer ([`CoreSplit`]).
    cores: CoreSplit,
    output: OutputPlan,
    placement: Placement,
    model: ModelSource,
    renderer: RendererChoice,
    routing: Routing,
    backends: Vec<BackendPlan>,
    /// Where versions are published for backends that load from disk (`None`: none does).
    weights_dir: Option<PathBuf>,
    /// Bound on each start-up check of a server and on its first weight load.
    server_check_timeout: Duration,
    env: EnvSource,
    /// How a group's samples are requested.
    replication: Replication,
    /// Limits and sampling of training trajectories. Its stop tokens are the policy's
    /// ([`crate::stack::Policy::stop_tokens`]), added by the stack once the model is loaded.
    env_manager: EnvManagerConfig,
    proxy: ProxyConfig,
    controller: ControllerConfig,
    learner: LearnerConfig,
    /// Who runs the step the learner settings describe.
    trainer: TrainerPlan,
    /// `[train.lora]`: the learner trains these adapters over a frozen base (after the
    /// warm-up, which trains the base); `None` trains every weight.
    lora: Option<rollflash_model::lora::LoraConfig>,
    /// The reward at or above which a sample counts as a success.
    success_threshold: f64,
    warmup: WarmupPlan,
    eval: EvalPlan,
    dashboard: DashboardPlan,
    /// The dataset task's config (with the run's first task seed as its origin), when the
    /// task is one: checkpoints save its data cursor and `--resume` checks it.
    data: Option<DatasetTaskConfig>,
    /// `[sandbox]`, when the run scores code (a dataset task with `reward = "code"` in this
    /// process): the pipeline starts it before anything else and refuses to run without it.
    sandbox: Option<rollflash_sandbox::SandboxConfig>,
    /// `[reward.python]`, when the dataset task in this process has a Python reward: the
    /// pipeline starts the worker pool before anything else, like the sandbox.
    python_reward: Option<rollflash_env::verify::python::PythonPoolConfig>,
}

/// The dashboard of a run: where it is served (if anywhere), with which key, and how many
/// trajectories of each batch are saved for it.
#[derive(Debug, Clone, Default)]
pub struct DashboardPlan {
    pub addr: Option<SocketAddr>,
    /// Resolved like the servers' keys (`api_key`, `api_key_env`, then `ROLLFLASH_API_KEY`
    /// as `rollflash serve` reads it); required beyond loopback.
    pub api_key: Option<String>,
    pub trajectories_per_step: usize,
    /// `dashboard.trajectories_max_mb` in bytes; `None` (0 MB): no cap.
    pub trajectories_max_bytes: Option<u64>,
}

impl DashboardPlan {
    fn new(d: &crate::config::DashboardSection) -> Result<Self, PlanError> {
        let api_key = match resolve_api_key("dashboard", &d.api_key, &d.api_key_env)? {
            Some(k) => Some(k),
            None => std::env::var("ROLLFLASH_API_KEY")
                .ok()
                .filter(|k| !k.is_empty()),
        };
        if let Some(addr) = d.addr {
            if !addr.ip().is_loopback() && api_key.is_none() {
                return Err(PlanError::DashboardNeedsKey(addr));
            }
        }
        Ok(DashboardPlan {
            addr: d.addr,
            api_key,
            trajectories_per_step: d.trajectories_per_step,
            // Validated finite and ≥ 0; the cast saturates.
            trajectories_max_bytes: (d.trajectories_max_mb > 0.0)
                .then(|| (d.trajectories_max_mb * 1e6).ceil() as u64),
        })
    }
}

impl RunPlan {
    /// The plan of `config`: validates it, opens its device, derives every setting.
    pub fn new(config: TrainConfig) -> Result<Self, PlanError> {
        config.validate()?;
        let c = &config;
        let placement = Placement::new(c.model.device, c.model.dtype)?;
        let r = &c.rollout;
        let model = match &c.model.path {
            Some(dir) => ModelSource::Dir(dir.clone()),
            None => ModelSource::Builtin { seed: c.seed },
        };
        let cores = CoreSplit::detect(r.engines, r.engine_threads, c.train.threads);
        let backends = backends_plan(r, &cores)?;
        let weights_dir = weights_dir_plan(c, &backends);
        let proxy = proxy_config(r);
        let env_manager = env_manager_plan(c);
        let controller = controller_config(c);
        let warmup = warmup_plan(c, &cores);
        let learner = c.learner_config(&placement.device, cores.train_threads);
        let env = env_source(c)?;
        let data = dataset_in_process(&env);
        let sandbox = sandbox_plan(c, data.as_ref())?;
        check_attempts_fit_turns(r, data.as_ref())?;
        let python_reward = data
            .as_ref()
            .filter(|d| {
                matches!(
                    d.reward,
                    rollflash_env::envs::dataset_task::DatasetReward::Python(_)
                )
            })
            .map(|_| c.reward.python.clone());
        let trainer = trainer_plan(c, &learner)?;
        let eval = eval_plan(c, &trainer);
        Ok(RunPlan {
            cores,
            trainer,
            sandbox,
            python_reward,
            placement: placement.clone(),
            model,
            renderer: r.renderer,
            routing: r.routing,
            backends,
            weights_dir,
            server_check_timeout: Duration::from_secs_f64(r.server_check_timeout_secs),
            env,
            replication: Replication::Expand,
            env_manager,
            proxy,
            controller,
            learner,
            lora: c.train.lora.clone(),
            success_threshold: match (&c.env, c.env.spec()) {
                (_, Some(spec)) => success_threshold(&spec.env),
                (EnvSection::OpenEnv(o), None) => o.success_reward,
                _ => 1.0,
            },
            warmup,
            eval,
            dashboard: DashboardPlan::new(&c.dashboard)?,
            data,
            seed: c.seed,
            output: output_plan(c),
        })
    }

    /// How the cores are divided between the engines and the trainer.
    pub fn cores(&self) -> &CoreSplit {
        &self.cores
    }

    /// The α in force: 0 for the synchronous baseline.
    pub fn alpha(&self) -> f64 {
        self.controller.core.buffer.alpha
    }

    /// Whether this is the synchronous baseline.
    pub fn sync(&self) -> bool {
        self.controller.core.buffer.schedule() == Schedule::Synchronous
    }

    /// The pause mode of weight syncs.
    pub fn pause_mode(&self) -> PauseMode {
        self.controller.pause_mode
    }

    /// The run's seed (model init, sampling; task seeds derive from it: [`task_seed`]).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Where the run writes.
    pub fn output(&self) -> &OutputPlan {
        &self.output
    }

    /// The run's device and dtype.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The policy it starts from.
    pub fn model(&self) -> &ModelSource {
        &self.model
    }

    /// How conversations become tokens (resolved against the model directory by the stack).
    pub fn renderer(&self) -> RendererChoice {
        self.renderer
    }

    pub fn routing(&self) -> Routing {
        self.routing
    }

    pub fn backends(&self) -> &[BackendPlan] {
        &self.backends
    }

    /// Where versions are published for backends that load from disk.
    pub fn weights_dir(&self) -> Option<&PathBuf> {
        self.weights_dir.as_ref()
    }

    pub fn server_check_timeout(&self) -> Duration {
        self.server_check_timeout
    }

    pub fn env(&self) -> &EnvSource {
        &self.env
    }

    pub fn replication(&self) -> Replication {
        self.replication
    }

    pub fn env_manager(&self) -> &EnvManagerConfig {
        &self.env_manager
    }

    pub fn proxy(&self) -> &ProxyConfig {
        &self.proxy
    }

    pub fn controller(&self) -> &ControllerConfig {
        &self.controller
    }

    pub fn learner(&self) -> &LearnerConfig {
        &self.learner
    }

    /// Who runs the training step.
    pub fn trainer(&self) -> &TrainerPlan {
        &self.trainer
    }

    pub fn lora(&self) -> Option<&rollflash_model::lora::LoraConfig> {
        self.lora.as_ref()
    }

    pub fn success_threshold(&self) -> f64 {
        self.success_threshold
    }

    pub fn warmup(&self) -> &WarmupPlan {
        &self.warmup
    }

    pub fn eval(&self) -> EvalPlan {
        self.eval
    }

    pub fn dashboard(&self) -> &DashboardPlan {
        &self.dashboard
    }

    /// The dataset task, when the run's task is one in this process.
    pub fn data(&self) -> Option<&DatasetTaskConfig> {
        self.data.as_ref()
    }

    /// The Python reward pool's settings, when the run's reward is a Python function.
    pub fn python_reward(&self) -> Option<&rollflash_env::verify::python::PythonPoolConfig> {
        self.python_reward.as_ref()
    }

    /// The code sandbox's settings, when the run scores code.
    pub fn sandbox(&self) -> Option<&rollflash_sandbox::SandboxConfig> {
        self.sandbox.as_ref()
    }

    /// The embedded engines' request slots in all (each engine's `max_running_requests`).
    pub fn engine_slots(&self) -> usize {
        self.backends
            .iter()
            .map(|b| match b {
                BackendPlan::Engine {
                    max_running_requests,
                    ..
                } => *max_running_requests,
                BackendPlan::Remote { .. } => 0,
            })
            .sum()
    }

    /// The same run under `schedule` (the bench's modes), re-validated.
    pub fn with_schedule(mut self, schedule: Schedule) -> Result<Self, PlanError> {
        self.controller.core.buffer = self.controller.core.buffer.with_schedule(schedule);
        self.controller.core.buffer.validate().map_err(|e| {
            PlanError::Config(ConfigError::Field {
                field: "buffer".into(),
                reason: e.to_string(),
            })
        })?;
        Ok(self)
    }

    /// The same run with `redundancy` extra trajectories per group.
    pub fn with_redundancy(mut self, redundancy: usize) -> Self {
        self.controller.core.redundancy = redundancy;
        self
    }

    /// The same run requesting a group's samples as `replication` says.
    pub fn with_replication(mut self, replication: Replication) -> Self {
        self.replication = replication;
        self
    }

    /// Repeat `repeat` of the run (the bench's): its own sampling seed and task stream, the
    /// same in every mode of that repeat; repeat 0 samples with the run's seed.
    pub fn with_repeat(mut self, repeat: usize) -> Self {
        self.env_manager.sampling.seed = Some(self.seed.wrapping_add(repeat as u64));
        self.controller.core.seed = task_seed(self.seed).wrapping_add(repeat as u64 * 1_000_000);
        self
    }

    /// The plan in a few lines, for people (`rollflash train --dry-run`).
    pub fn describe(&self) -> Vec<String> {
        let mut out = vec![self.describe_placement()];
        out.push(crate::preset::describe(&self.learner));
        out.push(self.cores.describe(self.sync()));
        if let TrainerPlan::Tinker(t) = &self.trainer {
            describe_tinker(t, &mut out);
        }
        out.push(self.describe_training());
        for b in &self.backends {
            out.push(self.describe_backend(b));
        }
        if self
            .backends
            .iter()
            .any(|b| matches!(b, BackendPlan::Remote { .. }))
        {
            out.push(format!(
                "fleet: {} backend(s) behind one proxy; start-up checks and first weight load \
                 within {:.0} s each",
                self.backends.len(),
                self.server_check_timeout.as_secs_f64(),
            ));
        }
        out.push(format!("env `{}` {}", self.env.name(), self.env.location()));
        out.push(format!(
            "routing {:?}, env `{}`, first task seed {}, α {}{}",
            self.routing,
            self.env.name(),
            self.controller.core.seed,
            self.alpha(),
            if self.sync() {
                " (synchronous baseline)"
            } else {
                ""
            }
        ));
        out.push(self.describe_checkpoints());
        if let Some(c) = self.warmup_cache() {
            out.push(format!("warm-up cache {}", c.display()));
        }
        out
    }

    /// `describe`'s first line: device, dtype, what this build supports, the model.
    fn describe_placement(&self) -> String {
        format!(
            "plan: device {:?}, dtype {:?} (this build: {}), model {}",
            self.placement.device,
            self.placement.dtype,
            if cfg!(feature = "cuda") {
                "cpu and cuda"
            } else {
                "cpu only, built without the `cuda` feature"
            },
            match &self.model {
                ModelSource::Builtin { seed } => format!("built-in (seed {seed})"),
                ModelSource::Dir(d) => d.display().to_string(),
            }
        )
    }

    /// `describe`'s line on what is trained: a Tinker adapter, LoRA adapters, or every
    /// weight.
    fn describe_training(&self) -> String {
        match (&self.trainer, &self.lora) {
            (TrainerPlan::Tinker(t), _) => format!(
                "training: a LoRA adapter of rank {} on the Tinker server (its base frozen there)",
                t.lora_rank
            ),
            (TrainerPlan::Embedded, lora) => match lora {
                Some(l) => format!(
                "training: LoRA adapters (PEFT), rank {}, alpha {} (scale {}), dropout {}, on {}; \
                 base frozen (no gradients, no optimizer state); engines apply them unmerged, \
                 servers load them merged; checkpoints add adapter_config.json and \
                 adapter_model.safetensors",
                l.rank,
                l.alpha,
                l.scale(),
                l.dropout,
                l.target_modules.join(", ")
            ),
                None => "training: every weight (full fine-tuning)".into(),
            },
        }
    }

    /// `describe`'s line on one backend.
    fn describe_backend(&self, b: &BackendPlan) -> String {
        match b {
            BackendPlan::Engine {
                name,
                threads,
                max_running_requests,
            } => format!(
                "backend {name}: embedded engine, {threads} thread(s), {max_running_requests} running requests{}",
                match (&self.trainer, &self.weights_dir) {
                    (TrainerPlan::Tinker(_), Some(d)) => format!(
                        "; loads each version's LoRA adapter as the Tinker server exports it \
                         (downloaded to {}, probed against the server)",
                        d.display()
                    ),
                    _ => String::new(),
                }
            ),
            BackendPlan::Remote {
                kind,
                http,
                max_running_requests,
                weights,
                weight_sync_timeout,
                ..
            } => format!(
                "backend {}: {} server, {max_running_requests} running requests, {}{}, \
                 {:.0} s per call{}",
                http.base_url,
                match kind {
                    ServerKind::Sglang => "SGLang (native API)",
                    ServerKind::Vllm => "vLLM",
                    ServerKind::Openai => "OpenAI-compatible",
                    ServerKind::Rollflash => "rollflash serve (SGLang-native API)",
                    ServerKind::Tinker => "Tinker sampler",
                },
                self.describe_server_weights(kind, weights),
                if http.api_key.is_some() { ", API key set" } else { "" },
                http.timeout.as_secs_f64(),
                match weights {
                    ServerWeights::Disk | ServerWeights::Merged => format!(
                        ", a weight update within {:.0} s",
                        weight_sync_timeout.as_secs_f64()
                    ),
                    ServerWeights::None => String::new(),
                },
            ),
        }
    }

    /// How a server of `kind` with `weights` receives each version, for people.
    fn describe_server_weights(&self, kind: &ServerKind, weights: &ServerWeights) -> String {
        match (kind, weights, &self.weights_dir) {
            (ServerKind::Tinker, ..) => {
                "loads each version by the tinker:// path the learner saved".into()
            }
            (_, ServerWeights::Disk, Some(d)) if matches!(self.trainer, TrainerPlan::Tinker(_)) => {
                format!(
                    "loads each version's LoRA adapter as the Tinker server exports \
                     it (downloaded to {}, probed against the server)",
                    d.display()
                )
            }
            (k, ServerWeights::Disk, Some(d))
                if ServerWeights::Disk.sends_adapter(*k, self.lora.is_some()) =>
            {
                format!(
                    "loads each version's LoRA adapter only from {}",
                    d.display()
                )
            }
            (_, ServerWeights::Disk | ServerWeights::Merged, Some(d)) => {
                format!("loads each version from {}", d.display())
            }
            _ => "keeps its own weights".into(),
        }
    }

    /// `describe`'s line on checkpoints and the final weights.
    fn describe_checkpoints(&self) -> String {
        let ck = &self.output.checkpoint;
        format!(
            "checkpoints: {}; {}",
            match ck.every {
                0 => "none during the run".to_string(),
                n => format!("every {n} steps, the newest {} kept", ck.keep),
            },
            if ck.save_final {
                format!(
                    "the trained model to {} at the end",
                    self.output.dir.join("final").display()
                )
            } else {
                "no final/ at the end (checkpoint.final = false)".to_string()
            }
        )
    }

    /// Where the warm-up's result is cached, when the task has one.
    pub fn warmup_cache(&self) -> Option<&PathBuf> {
        match &self.warmup {
            WarmupPlan::Run { cache, .. } => Some(cache),
            _ => None,
        }
    }
}

/// `describe`'s lines on a Tinker trainer: its server and loss, and what a dead server does.
fn describe_tinker(t: &TinkerLearnerConfig, out: &mut Vec<String>) {
    out.push(format!(
        "trainer: Tinker server {} ({}), LoRA rank {}; loss: {}",
        t.client.base_url,
        t.base_model.as_deref().unwrap_or("its first model"),
        t.lora_rank,
        rollflash_trainer::TinkerLossPath::of(&t.loss)
            .map_or_else(|_| "not trainable there".into(), |p| p.describe()),
    ));
    out.push(match t.rejoin {
        Some(d) => format!(
            "if the server dies: wait up to {:.0} s for it, then rejoin (a fresh model \
             loads the state saved after every step) and redo the step",
            d.as_secs_f64()
        ),
        None => "if the server dies: stop, naming the newest checkpoint \
                 (learner.rejoin_secs > 0 rejoins instead)"
            .into(),
    });
}

/// The trainer `[learner]` names, with the step's settings `learner` (loss, advantages,
/// optimiser) for a remote one.
fn trainer_plan(c: &TrainConfig, learner: &LearnerConfig) -> Result<TrainerPlan, PlanError> {
    let l = &c.learner;
    match l.kind {
        LearnerKind::Embedded => Ok(TrainerPlan::Embedded),
        LearnerKind::Tinker => {
            let mut client = rollflash_tinker::ClientConfig::new(l.url.clone().unwrap_or_default());
            client.api_key = resolve_api_key("learner", &l.api_key, &l.api_key_env)?;
            client.future_deadline = Duration::from_secs_f64(l.timeout_secs);
            Ok(TrainerPlan::Tinker(Box::new(TinkerLearnerConfig {
                client,
                base_model: l.base_model.clone(),
                lora_rank: l.lora_rank,
                seed: c.seed,
                optimizer: learner.optimizer.clone(),
                loss: learner.loss.clone(),
                advantage: learner.advantage,
                shaping: learner.shaping,
                heartbeat: Duration::from_secs(10),
                force_custom: false,
                rejoin: (l.rejoin_secs > 0.0).then(|| Duration::from_secs_f64(l.rejoin_secs)),
            })))
        }
    }
}

/// The backends of `[rollout]`: its embedded engines (on the threads `cores` gives each),
/// then its `[[rollout.servers]]` in order, their API keys resolved.
fn backends_plan(r: &RolloutSection, cores: &CoreSplit) -> Result<Vec<BackendPlan>, PlanError> {
    let mut backends: Vec<BackendPlan> = (0..r.engines)
        .map(|i| BackendPlan::Engine {
            name: format!("engine-{i}"),
            threads: cores.engine_threads,
            max_running_requests: r.max_running_requests,
        })
        .collect();
    for (i, srv) in r.servers.iter().enumerate() {
        let mut http = HttpBackendConfig::new(srv.url.clone());
        http.api_key = resolve_api_key(
            &format!("rollout.servers[{i}]"),
            &srv.api_key,
            &srv.api_key_env,
        )?;
        if let Some(t) = srv.timeout_secs {
            http.timeout = Duration::from_secs_f64(t);
        }
        if let Some(t) = srv.connect_timeout_secs {
            http.connect_timeout = Duration::from_secs_f64(t);
        }
        backends.push(BackendPlan::Remote {
            kind: srv.kind,
            http,
            max_running_requests: srv.max_running_requests,
            weights: srv.weights,
            model: srv.model.clone(),
            weight_sync_timeout: Duration::from_secs_f64(
                srv.weight_sync_timeout_secs
                    .unwrap_or(r.weight_sync_timeout_secs),
            ),
        });
    }
    Ok(backends)
}

/// Where versions are published, when some backend loads them from disk.
fn weights_dir_plan(c: &TrainConfig, backends: &[BackendPlan]) -> Option<PathBuf> {
    // A Tinker learner's adapters reach embedded engines through the directory too.
    let tinker = c.learner.kind == LearnerKind::Tinker;
    backends
        .iter()
        .any(|b| b.takes_disk_weights() || (tinker && matches!(b, BackendPlan::Engine { .. })))
        .then(|| {
            c.rollout
                .weights_dir
                .clone()
                .unwrap_or_else(|| c.output_dir.join("published"))
        })
}

/// The proxy's bounds on one generation and on one backend's weight update.
fn proxy_config(r: &RolloutSection) -> ProxyConfig {
    let mut proxy =
        ProxyConfig::with_request_timeout(Duration::from_secs_f64(r.request_timeout_secs));
    proxy.update_timeout = Duration::from_secs_f64(r.weight_sync_timeout_secs);
    proxy
}

/// The limits and sampling of training trajectories (sampling seeded with the run's seed).
fn env_manager_plan(c: &TrainConfig) -> EnvManagerConfig {
    let r = &c.rollout;
    let sampling = SamplingParams {
        temperature: r.temperature,
        top_p: r.top_p,
        max_new_tokens: r.max_new_tokens,
        seed: Some(c.seed),
        ..Default::default()
    };
    EnvManagerConfig {
        max_turns: r.max_turns,
        max_total_tokens: r.max_total_tokens,
        sampling,
        step_timeout: Duration::from_secs_f64(r.step_timeout_secs),
    }
}

/// The controller's settings: the buffer (synchronous under `controller.sync`), the task
/// seeds, the timeouts.
fn controller_config(c: &TrainConfig) -> ControllerConfig {
    let buffer = if c.controller.sync {
        c.buffer.clone().with_schedule(Schedule::Synchronous)
    } else {
        c.buffer.clone()
    };
    ControllerConfig {
        core: CoreConfig {
            buffer,
            redundancy: c.rollout.group_size_redundancy,
            steps: c.train.steps,
            seed: task_seed(c.seed),
            serve_timeout: Duration::from_secs_f64(c.controller.serve_timeout_secs),
            progress_timeout: Duration::from_secs_f64(c.controller.progress_timeout_secs),
        },
        pause_mode: c.controller.pause_mode,
        stall_report: (c.controller.stall_report_secs > 0.0)
            .then(|| Duration::from_secs_f64(c.controller.stall_report_secs)),
    }
}

/// Where tasks come from, their seeds starting at the run's first task seed; API keys
/// resolved.
fn env_source(c: &TrainConfig) -> Result<EnvSource, PlanError> {
    let first_task = task_seed(c.seed);
    Ok(match &c.env {
        EnvSection::Builtin(spec) => {
            EnvSource::Builtin(spec.clone().with_task_seed_origin(first_task))
        }
        EnvSection::Remote(r) => EnvSource::Remote(RemoteEnvConfig {
            url: r.url.clone(),
            spec: r.spec.clone().with_task_seed_origin(first_task),
            api_key: resolve_api_key("env.remote", &r.api_key, &r.api_key_env)?,
            timeout: Duration::from_secs_f64(r.timeout_secs),
        }),
        EnvSection::OpenEnv(o) => EnvSource::OpenEnv(o.client_config(resolve_api_key(
            "env.openenv",
            &o.api_key,
            &o.api_key_env,
        )?)),
    })
}

/// The dataset task's config, when `env` is one in this process.
fn dataset_in_process(env: &EnvSource) -> Option<DatasetTaskConfig> {
    // The data cursor is ours only when the dataset runs in this process.
    match env {
        EnvSource::Builtin(EnvSpec {
            env: EnvConfig::Dataset(d),
            ..
        }) => Some(DatasetTaskConfig::clone(d)),
        _ => None,
    }
}

/// `[sandbox]` when the dataset task `data` scores code, checked against the step deadline.
fn sandbox_plan(
    c: &TrainConfig,
    data: Option<&DatasetTaskConfig>,
) -> Result<Option<rollflash_sandbox::SandboxConfig>, PlanError> {
    let sandbox = data
        .filter(|d| d.reward == rollflash_env::envs::dataset_task::DatasetReward::Code)
        .map(|_| c.sandbox.clone());
    if let Some(sb) = &sandbox {
        // An environment step that scores code waits for its execution; a step deadline
        // shorter than one execution's would fail every slow program as a step timeout.
        let need = sb.execution_deadline().as_secs_f64();
        let r = &c.rollout;
        if r.step_timeout_secs <= need {
            return Err(ConfigError::Field {
                field: "rollout.step_timeout_secs".into(),
                reason: format!(
                    "{} s would end a step before its code execution's own deadline, \
                     {need} s (sandbox.wall_secs, plus remote_margin_secs for a remote \
                     sandbox); raise it or lower those",
                    r.step_timeout_secs
                ),
            }
            .into());
        }
    }
    Ok(sandbox)
}

/// Refuses a dataset task `data` with more attempts than `rollout.max_turns`.
fn check_attempts_fit_turns(
    r: &RolloutSection,
    data: Option<&DatasetTaskConfig>,
) -> Result<(), PlanError> {
    if let Some(d) = data.filter(|d| d.attempts > r.max_turns) {
        // Each attempt is a model turn: fewer turns would cut every episode that needs
        // its later attempts, and train on it as if the task had ended.
        return Err(ConfigError::Field {
            field: "rollout.max_turns".into(),
            reason: format!(
                "{} is fewer than env.attempts = {} (each attempt is a turn)",
                r.max_turns, d.attempts
            ),
        }
        .into());
    }
    Ok(())
}

/// Held-out evaluation: `[train]`'s, with mid-run evaluation only where the weights are
/// local.
fn eval_plan(c: &TrainConfig, trainer: &TrainerPlan) -> EvalPlan {
    // A Tinker learner's weights live on its server: no local copy to evaluate mid-run.
    let eval_every = match trainer {
        TrainerPlan::Tinker(_) => 0,
        _ if c.train.eval_problems == 0 => 0,
        _ => c.train.eval_every,
    };
    EvalPlan {
        problems: c.train.eval_problems,
        samples: c.train.eval_samples,
        temperature: c.rollout.temperature,
        every: eval_every,
    }
}

/// Where the run writes: `output_dir`, `[checkpoint]`, `[metrics]`.
fn output_plan(c: &TrainConfig) -> OutputPlan {
    OutputPlan {
        dir: c.output_dir.clone(),
        checkpoint: CheckpointPlan {
            every: c.checkpoint.every,
            keep: c.checkpoint.keep,
            on_error: c.checkpoint.on_error,
            save_final: c.checkpoint.save_final,
        },
        metrics: MetricsPlan {
            progress: c.metrics.progress,
            tensorboard: c.metrics.tensorboard,
            report: c.metrics.report,
            prometheus: c.metrics.prometheus,
        },
    }
}

/// The first task seed of a run with seed `seed`; group `k` uses `task_seed(seed) + k`. Far
/// from the model's seed so model init and tasks do not share a stream.
pub fn task_seed(seed: u64) -> u64 {
    seed.wrapping_mul(1_000_003)
}

fn warmup_plan(c: &TrainConfig, cores: &CoreSplit) -> WarmupPlan {
    if c.warmup.steps == 0 {
        return WarmupPlan::None;
    }
    match c.env.spec().map(|s| &s.env) {
        Some(env @ (EnvConfig::Math(_) | EnvConfig::FrozenLake(_))) => {
            let settings = WarmupSettings {
                section: c.warmup.clone(),
                seed: c.seed,
                threads: cores.warmup_threads(),
                max_turns: c.rollout.max_turns,
                max_total_tokens: c.rollout.max_total_tokens,
            };
            let key = crate::warmup::cache_key(&settings, Some(env), c.model.path.as_ref());
            WarmupPlan::Run {
                cache: warmup_cache_root(c).join(format!("warmup-{key:016x}")),
                reuse: c.warmup.cache,
                settings,
            }
        }
        _ => WarmupPlan::Unsupported { env: c.env.name() },
    }
}

/// The folder warm-up results are cached in: `warmup.cache_dir`, else the user's cache
/// folder (`$ROLLFLASH_CACHE_DIR/warmup`, `$XDG_CACHE_HOME/rollflash/warmup`,
/// `~/.cache/rollflash/warmup`), so every run with the same settings shares one result
/// whatever its `output_dir`; with none of those set, the run's own `output_dir`.
fn warmup_cache_root(c: &TrainConfig) -> PathBuf {
    if let Some(dir) = &c.warmup.cache_dir {
        return dir.clone();
    }
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("ROLLFLASH_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("rollflash")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("rollflash")))
        .map_or_else(|| c.output_dir.clone(), |d| d.join("warmup"))
}
