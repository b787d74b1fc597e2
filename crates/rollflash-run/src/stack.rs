//! What a [`RunPlan`] builds: the starting policy (weights, tokenizer, and the renderer that
//! turns conversations into the very tokens the trainer scores), its cached warm-up, and
//! the rollout stack — backends behind one `LlmProxy`, environment managers for training
//! and for evaluation, the version channel. `train`, `eval` and `bench` all build here.

use std::path::Path;
use std::sync::Arc;

use rollflash_core::PolicyVersion;
use rollflash_env::envs::{make_env, EnvConfig, EnvSpec};
use rollflash_env::math_task::MathTask;
use rollflash_env::openenv::OpenEnvClient;
use rollflash_env::remote::{RemoteEnvClient, RemoteEnvConfig};
use rollflash_env::Env;
use rollflash_model::chat::ChatTemplate;
use rollflash_model::config::ModelConfig;
use rollflash_model::engine::EngineConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::TrainableModel;
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    Backend, BackendEntry, EngineBackend, EngineBackendConfig, EnvFactory, EnvManager,
    EnvManagerConfig, LlmProxy, Renderer,
};
use rollflash_trainer::StopFlag;
use tokio::sync::watch;

use crate::config::RendererChoice;
use crate::plan::{BackendPlan, EnvSource, ModelSource, RunPlan, WarmupPlan};
use crate::warmup::WarmupError;

/// Why a stack could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("model: {0}")]
    Model(#[from] rollflash_model::ModelError),
    #[error("rollout: {0}")]
    Backend(#[from] rollflash_rollout::BackendError),
    #[error("environment: {0}")]
    Env(#[from] rollflash_env::EnvError),
    #[error("the tokenizer has no end-of-sequence token")]
    NoEos,
    /// `rollout.renderer = "chat"` with a model that has no chat template.
    #[error("rollout.renderer = \"chat\" needs a model directory with a chat template")]
    NoChatTemplate,
}

/// The policy a run starts from, and how its conversations become tokens.
#[derive(Debug, Clone)]
pub struct Policy {
    pub model_cfg: ModelConfig,
    pub weights: Weights,
    pub tokenizer: Arc<Tokenizer>,
    pub renderer: Renderer,
}

impl Policy {
    /// The plan's starting policy: its Hugging Face directory, or the built-in model with
    /// random weights from the seed.
    pub fn load(plan: &RunPlan) -> Result<Policy, StackError> {
        let (device, dtype) = (&plan.placement.device, plan.placement.dtype);
        match &plan.model {
            ModelSource::Dir(dir) => Ok(Policy {
                model_cfg: rollflash_model::hf::load_config(dir)?,
                weights: rollflash_model::hf::load_weights(dir, device)?,
                tokenizer: Arc::new(Tokenizer::from_dir(dir)?),
                renderer: renderer(plan.renderer, Some(dir))?,
            }),
            ModelSource::Builtin { seed } => {
                let tokenizer = Tokenizer::builtin();
                let eos = tokenizer.eos_token_id().ok_or(StackError::NoEos)?;
                let model_cfg = ModelConfig::builtin_default(tokenizer.vocab_size(), eos);
                let weights = Weights::random(&model_cfg, *seed, dtype, device)?;
                Ok(Policy {
                    model_cfg,
                    weights,
                    tokenizer: Arc::new(tokenizer),
                    renderer: renderer(plan.renderer, None)?,
                })
            }
        }
    }

    /// The plan's model (the plan's tokenizer and renderer) with the weights in `dir`: a
    /// checkpoint or any Hugging Face directory of the same family.
    pub fn from_checkpoint(plan: &RunPlan, dir: &Path) -> Result<Policy, StackError> {
        let (tokenizer, renderer) = match &plan.model {
            ModelSource::Dir(d) => (Tokenizer::from_dir(d)?, renderer(plan.renderer, Some(d))?),
            ModelSource::Builtin { .. } => (Tokenizer::builtin(), renderer(plan.renderer, None)?),
        };
        Ok(Policy {
            model_cfg: rollflash_model::hf::load_config(dir)?,
            weights: rollflash_model::hf::load_weights(dir, &plan.placement.device)?,
            tokenizer: Arc::new(tokenizer),
            renderer,
        })
    }

    /// A trainable copy of the weights on the plan's device, in its dtype.
    pub fn trainable(&self, plan: &RunPlan) -> Result<TrainableModel, StackError> {
        Ok(TrainableModel::new(
            &self.model_cfg,
            &self.weights,
            plan.placement.dtype,
            &plan.placement.device,
        )?)
    }
}

fn plain() -> Renderer {
    Renderer::Plain {
        separator: "\n".into(),
    }
}

/// The renderer `choice` asks for, given the model directory (if any). `auto` renders plain
/// text for the built-in model, and for a directory it saved (a warm-up cache, a
/// checkpoint): those carry the built-in tokenizer's chat template, but the model was
/// trained on plain renderings, which is what it must be given.
pub fn renderer(choice: RendererChoice, dir: Option<&Path>) -> Result<Renderer, StackError> {
    let template = match dir {
        Some(d) if choice == RendererChoice::Auto && has_builtin_template(d) => None,
        Some(d) => ChatTemplate::from_tokenizer_config(&d.join("tokenizer_config.json"))?,
        None => None,
    };
    match (choice, template) {
        (RendererChoice::Plain, _) | (RendererChoice::Auto, None) => Ok(plain()),
        (_, Some(t)) => Ok(Renderer::Chat {
            template: Arc::new(t),
            system: None,
        }),
        (RendererChoice::Chat, None) => Err(StackError::NoChatTemplate),
    }
}

/// Whether `dir`'s tokenizer config holds the built-in tokenizer's chat template (a
/// directory rollflash saved from a built-in model). Unreadable configs say no; loading the
/// template reports them.
fn has_builtin_template(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| {
            v.get("chat_template")
                .and_then(|t| t.as_str())
                .map(|t| t == rollflash_model::chat::BUILTIN_CHAT_TEMPLATE)
        })
        .unwrap_or(false)
}

/// What the warm-up did.
#[derive(Debug, Clone, PartialEq)]
pub enum WarmedUp {
    /// Nothing to do.
    Skipped,
    /// The task has no warm-up data.
    Unsupported { env: &'static str },
    /// The cached result was loaded.
    Reused(std::path::PathBuf),
    /// It ran (and was cached when the plan says so).
    Ran,
}

/// Runs the supervised warm-up the plan asks for on `model` (the math task's worked
/// solutions, or a grid world's noisy-expert moves), or loads its cached result.
pub async fn warm_up(
    plan: &RunPlan,
    policy: &Policy,
    model: &mut TrainableModel,
    stop: &StopFlag,
) -> Result<WarmedUp, WarmupError> {
    let (cache, reuse) = match &plan.warmup {
        WarmupPlan::None => return Ok(WarmedUp::Skipped),
        WarmupPlan::Unsupported { env } => return Ok(WarmedUp::Unsupported { env }),
        WarmupPlan::Run { cache, reuse } => (cache, *reuse),
    };
    let cfg = &plan.config;
    if reuse && cache.join("model.safetensors").exists() {
        let w = rollflash_model::hf::load_weights(cache, &plan.placement.device)?;
        *model = TrainableModel::new(
            &policy.model_cfg,
            &w,
            plan.placement.dtype,
            &plan.placement.device,
        )?;
        return Ok(WarmedUp::Reused(cache.clone()));
    }
    match plan.env.train_spec().map(|s| &s.env) {
        Some(EnvConfig::Math(task_cfg)) => {
            let task = MathTask::new(task_cfg.clone())?;
            tokio::task::block_in_place(|| {
                crate::warmup::run(model, &policy.tokenizer, &task, cfg, stop)
            })?;
        }
        Some(EnvConfig::FrozenLake(lake)) => {
            crate::agentic_warmup::run(model, &policy.tokenizer, lake, cfg, stop).await?;
        }
        _ => {
            return Ok(WarmedUp::Unsupported {
                env: cfg.env.name(),
            })
        }
    }
    if reuse {
        rollflash_model::hf::save_dir(
            cache,
            &policy.model_cfg,
            &model.weights(),
            Some(&policy.tokenizer),
        )?;
    }
    Ok(WarmedUp::Ran)
}

/// How a caller changes the stack (benchmarks measure one mechanism at a time): each
/// backend and each environment can be wrapped.
#[derive(Default)]
pub struct StackHooks {
    pub wrap_backend: Option<WrapBackend>,
    pub wrap_env: Option<WrapEnv>,
}

/// Wraps each backend the stack starts.
pub type WrapBackend = Box<dyn Fn(Arc<dyn Backend>) -> Arc<dyn Backend> + Send + Sync>;
/// Wraps each environment the training factory makes.
pub type WrapEnv = Arc<dyn Fn(Box<dyn Env>) -> Box<dyn Env> + Send + Sync>;

impl std::fmt::Debug for StackHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackHooks")
            .field("wrap_backend", &self.wrap_backend.is_some())
            .field("wrap_env", &self.wrap_env.is_some())
            .finish()
    }
}

/// The rollout stack: backends behind the proxy, the environment managers for training
/// (sampling) and evaluation (greedy, no injected latency or failures), and the version
/// channel the managers read.
pub struct Stack {
    pub proxy: LlmProxy,
    pub version: watch::Sender<PolicyVersion>,
    pub envs: EnvManager,
    pub make: EnvFactory,
    pub eval_envs: EnvManager,
    pub eval_make: EnvFactory,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack").field("proxy", &self.proxy).finish()
    }
}

impl Stack {
    /// Builds the plan's rollout stack serving `model`'s weights as `version`. Must be
    /// called inside a tokio runtime.
    pub fn build(
        plan: &RunPlan,
        policy: &Policy,
        model: &TrainableModel,
        version: PolicyVersion,
    ) -> Result<Stack, StackError> {
        Stack::build_with(plan, policy, model, version, &StackHooks::default())
    }

    /// As [`Stack::build`], with backends and environments wrapped by `hooks`.
    pub fn build_with(
        plan: &RunPlan,
        policy: &Policy,
        model: &TrainableModel,
        version: PolicyVersion,
        hooks: &StackHooks,
    ) -> Result<Stack, StackError> {
        let snapshot = Arc::new(model.snapshot()?);
        let mut backends = Vec::with_capacity(plan.backends.len());
        for b in &plan.backends {
            let BackendPlan::Engine {
                name,
                threads,
                max_running_requests,
            } = b;
            let engine: Arc<dyn Backend> = Arc::new(EngineBackend::start(
                Arc::clone(&snapshot),
                version,
                EngineBackendConfig {
                    name: name.clone(),
                    engine: EngineConfig {
                        max_running_requests: *max_running_requests,
                        threads: *threads,
                        ..Default::default()
                    },
                },
            )?);
            let backend = match &hooks.wrap_backend {
                Some(wrap) => wrap(engine),
                None => engine,
            };
            backends.push(BackendEntry {
                backend,
                max_running_requests: *max_running_requests,
            });
        }
        let proxy = LlmProxy::start(backends, plan.routing.policy(), plan.proxy.clone());
        let (vtx, vrx) = watch::channel(version);
        let mut env_cfg = plan.env_manager.clone();
        env_cfg.sampling.stop_token_ids = policy.tokenizer.eos_token_id().into_iter().collect();
        let envs = EnvManager::new(
            proxy.handle(),
            Arc::clone(&policy.tokenizer),
            policy.renderer.clone(),
            env_cfg.clone(),
            vrx.clone(),
        )
        .with_replication(plan.replication);
        let (train, eval_make) = env_factories(&plan.env)?;
        let make: EnvFactory = match hooks.wrap_env.clone() {
            Some(wrap) => Arc::new(move || train().map(|e| wrap(e))),
            None => train,
        };
        let eval_envs = EnvManager::new(
            proxy.handle(),
            Arc::clone(&policy.tokenizer),
            policy.renderer.clone(),
            EnvManagerConfig {
                sampling: rollflash_core::SamplingParams {
                    temperature: 0.0,
                    ..env_cfg.sampling.clone()
                },
                ..env_cfg
            },
            vrx,
        );
        Ok(Stack {
            proxy,
            version: vtx,
            envs,
            make,
            eval_envs,
            eval_make,
        })
    }
}

/// The training and evaluation factories of `source`. Remote ones share one client (one
/// connection pool) per run: each trajectory gets a new environment, not a new client.
fn env_factories(source: &EnvSource) -> Result<(EnvFactory, EnvFactory), StackError> {
    fn local(spec: EnvSpec) -> EnvFactory {
        Arc::new(move || make_env(&spec))
    }
    fn remote(client: &RemoteEnvClient, spec: EnvSpec) -> Result<EnvFactory, StackError> {
        let client = RemoteEnvClient::new(RemoteEnvConfig {
            spec,
            ..client.config().clone()
        })?;
        Ok(Arc::new(move || Ok(Box::new(client.env()) as Box<dyn Env>)))
    }
    match source {
        EnvSource::Builtin(spec) => {
            spec.validate()?;
            let eval = source.eval_spec().unwrap_or_else(|| spec.clone());
            Ok((local(spec.clone()), local(eval)))
        }
        EnvSource::Remote(cfg) => {
            cfg.spec.validate()?;
            let train = RemoteEnvClient::new(cfg.clone())?;
            let eval = source.eval_spec().unwrap_or_else(|| cfg.spec.clone());
            let eval = remote(&train, eval)?;
            let train: EnvFactory = Arc::new(move || Ok(Box::new(train.env()) as Box<dyn Env>));
            Ok((train, eval))
        }
        EnvSource::OpenEnv(cfg) => {
            let client = OpenEnvClient::new(cfg.clone())?;
            let make: EnvFactory = Arc::new(move || Ok(Box::new(client.env()) as Box<dyn Env>));
            Ok((Arc::clone(&make), make))
        }
    }
}

/// Checks the plan's environment server, if any, before anything else runs: `env-serve`'s
/// `/health` and a probe environment of the spec (which checks the key and the spec), or
/// OpenEnv's `/health`, `/schema` and a session. Every request has the configured deadline;
/// the error names the server. Returns a line for people (`None` for a built-in).
pub async fn check_env(plan: &RunPlan) -> Result<Option<String>, StackError> {
    match &plan.env {
        EnvSource::Builtin(_) => Ok(None),
        EnvSource::Remote(cfg) => {
            let h = RemoteEnvClient::new(cfg.clone())?.check().await?;
            Ok(Some(format!(
                "env: env-serve {} is {} ({} live environments), builds `{}`",
                cfg.url,
                h.status,
                h.envs,
                cfg.spec.name()
            )))
        }
        EnvSource::OpenEnv(cfg) => {
            let info = OpenEnvClient::new(cfg.clone())?.check().await?;
            Ok(Some(format!(
                "env: OpenEnv {} is {}; the model's text goes into action field `{}`",
                cfg.url, info.status, info.action_field
            )))
        }
    }
}
