//! What a [`RunPlan`] builds: the starting policy (weights, tokenizer, and the renderer that
//! turns conversations into the very tokens the trainer scores), its cached warm-up, and
//! the rollout stack — backends (embedded engines and `[[rollout.servers]]`) behind one
//! `LlmProxy`, environment managers for training and for evaluation, the version channel —
//! and the servers' start-up checks ([`Stack::connect`]). `train`, `eval` and `bench` all
//! build here.

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
use rollflash_model::lora::Adapters;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::TrainableModel;
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    probe_server, Backend, BackendEntry, DiskWeights, EngineBackend, EngineBackendConfig,
    EnvFactory, EnvManager, EnvManagerConfig, HttpBackendConfig, LlmProxy, OpenAiBackend,
    OpenAiConfig, PauseMode, ProxyError, Renderer, ServerApi, SglangBackend, TinkerAdapters,
    TinkerBackend, TinkerBackendConfig, VllmBackend, WeightHook, WeightPublisher, WeightRoute,
    WeightUpdate,
};
use rollflash_tinker::TinkerClient;
use rollflash_trainer::StopFlag;
use tokio::sync::watch;

use crate::config::{RendererChoice, ServerKind, ServerWeights};
use crate::plan::{BackendPlan, EnvSource, ModelSource, RunPlan, TrainerPlan, WarmupPlan};
use crate::warmup::WarmupError;

/// Why a stack could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("model")]
    Model(#[from] rollflash_model::ModelError),
    #[error("rollout")]
    Backend(#[from] rollflash_rollout::BackendError),
    #[error("environment")]
    Env(#[from] rollflash_env::EnvError),
    #[error("the tokenizer has no end-of-sequence token")]
    NoEos,
    /// `rollout.renderer = "chat"` with a model that has no chat template.
    #[error("rollout.renderer = \"chat\" needs a model directory with a chat template")]
    NoChatTemplate,
    /// The directory weights are published to cannot be prepared. Boxed: keeps `StackError` (and every error that wraps it) small.
    #[error("rollout.weights_dir")]
    Publish(#[source] Box<rollflash_rollout::PublishError>),
    /// A rollout server failed a start-up check (down, or serving another model).
    #[error("rollout server {url} {problem}")]
    Server { url: String, problem: String },
    /// Servers that could not load the starting weights (or report serving them).
    #[error("rollout servers {failed:?} could not load the starting weights (version {version}); see the log for why")]
    FirstWeights {
        version: PolicyVersion,
        failed: Vec<String>,
    },
    /// Boxed: keeps `StackError` (and every error that wraps it) small.
    #[error("proxy")]
    Proxy(#[source] Box<ProxyError>),
    /// LoRA adapters and the config disagree (a LoRA checkpoint resumed without
    /// `[train.lora]`, or the other way round, or other settings).
    #[error("train.lora: {0}")]
    Lora(String),
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
        let (device, dtype) = (&plan.placement().device, plan.placement().dtype);
        match plan.model() {
            ModelSource::Dir(dir) => Ok(Policy {
                model_cfg: rollflash_model::hf::load_config(dir)?,
                weights: rollflash_model::hf::load_weights(dir, device)?,
                tokenizer: Arc::new(Tokenizer::from_dir(dir)?),
                renderer: renderer(plan.renderer(), Some(dir))?,
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
                    renderer: renderer(plan.renderer(), None)?,
                })
            }
        }
    }

    /// The plan's model (the plan's tokenizer and renderer) with the weights in `dir`: a
    /// checkpoint or any Hugging Face directory of the same family.
    pub fn from_checkpoint(plan: &RunPlan, dir: &Path) -> Result<Policy, StackError> {
        let (tokenizer, renderer) = match plan.model() {
            ModelSource::Dir(d) => (Tokenizer::from_dir(d)?, renderer(plan.renderer(), Some(d))?),
            ModelSource::Builtin { .. } => (Tokenizer::builtin(), renderer(plan.renderer(), None)?),
        };
        Ok(Policy {
            model_cfg: rollflash_model::hf::load_config(dir)?,
            weights: rollflash_model::hf::load_weights(dir, &plan.placement().device)?,
            tokenizer: Arc::new(tokenizer),
            renderer,
        })
    }

    /// The token ids its generation stops on (the one rule: [`ModelConfig::stop_tokens`]).
    pub fn stop_tokens(&self) -> Vec<u32> {
        self.model_cfg.stop_tokens(Some(&self.tokenizer))
    }

    /// A trainable copy of the weights on the plan's device, in its dtype.
    pub fn trainable(&self, plan: &RunPlan) -> Result<TrainableModel, StackError> {
        Ok(TrainableModel::new(
            &self.model_cfg,
            &self.weights,
            plan.placement().dtype,
            &plan.placement().device,
        )?)
    }
}

/// With `[train.lora]`, `model`'s weights become the frozen base of LoRA adapters: `adapters`
/// (a checkpoint's, whose settings must be the config's) or fresh ones seeded by the run's
/// seed. Without it, `model` is returned as it is, and adapters are refused. Called after
/// the warm-up, which trains the whole model.
pub fn adapt(
    plan: &RunPlan,
    policy: &Policy,
    model: TrainableModel,
    adapters: Option<&Adapters>,
) -> Result<TrainableModel, StackError> {
    let Some(lora) = plan.lora() else {
        return match adapters {
            Some(_) => Err(StackError::Lora(
                "the checkpoint holds LoRA adapters; resume it with its [train.lora] section"
                    .into(),
            )),
            None => Ok(model),
        };
    };
    if let Some(a) = adapters {
        if &a.config != lora {
            return Err(StackError::Lora(format!(
                "the checkpoint's adapters are {:?}, the config asks for {lora:?}",
                a.config
            )));
        }
    }
    Ok(TrainableModel::with_lora(
        &policy.model_cfg,
        &model.weights(),
        lora,
        adapters.map(|a| &a.weights),
        plan.seed(),
        plan.placement().dtype,
        &plan.placement().device,
    )?)
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
    /// It ran (and was cached when the plan says so). `stale` names a cached result of the
    /// same settings that this build did not reuse: another build's arithmetic made it.
    Ran { stale: Option<std::path::PathBuf> },
}

/// Runs the supervised warm-up the plan asks for on `model` (the math task's worked
/// solutions, or a grid world's noisy-expert moves), or loads its cached result.
pub async fn warm_up(
    plan: &RunPlan,
    policy: &Policy,
    model: &mut TrainableModel,
    stop: &StopFlag,
) -> Result<WarmedUp, WarmupError> {
    let (cache, reuse, settings) = match plan.warmup() {
        WarmupPlan::None => return Ok(WarmedUp::Skipped),
        WarmupPlan::Unsupported { env } => return Ok(WarmedUp::Unsupported { env }),
        WarmupPlan::Run {
            cache,
            reuse,
            settings,
        } => (cache, *reuse, settings),
    };
    let fingerprint = if reuse {
        let f = tokio::task::block_in_place(|| {
            crate::warmup::numerics_fingerprint(model, &policy.model_cfg)
        })?;
        Some(format!("{f:016x}"))
    } else {
        None
    };
    let mut stale = None;
    if let Some(f) = &fingerprint {
        if cache.join("model.safetensors").exists() {
            let made_by = std::fs::read_to_string(cache.join(FINGERPRINT_FILE)).unwrap_or_default();
            if made_by.trim() == f {
                let w = rollflash_model::hf::load_weights(cache, &plan.placement().device)?;
                *model = TrainableModel::new(
                    &policy.model_cfg,
                    &w,
                    plan.placement().dtype,
                    &plan.placement().device,
                )?;
                return Ok(WarmedUp::Reused(cache.clone()));
            }
            stale = Some(cache.clone());
        }
    }
    match plan.env().train_spec().map(|s| &s.env) {
        Some(EnvConfig::Math(task_cfg)) => {
            let task = MathTask::new(task_cfg.clone())?;
            crate::warmup::run(model, &policy.tokenizer, &task, settings, stop).await?;
        }
        Some(EnvConfig::FrozenLake(lake)) => {
            crate::agentic_warmup::run(model, &policy.tokenizer, lake, settings, stop).await?;
        }
        _ => {
            return Ok(WarmedUp::Unsupported {
                env: plan.env().name(),
            })
        }
    }
    if let Some(f) = &fingerprint {
        save_warmup(cache, f, policy, model)?;
    }
    Ok(WarmedUp::Ran { stale })
}

/// The file of a cached warm-up that holds the fingerprint of the build that made it.
const FINGERPRINT_FILE: &str = "numerics-fingerprint.txt";

/// Writes a warm-up result to `cache` whole or not at all: into a temporary sibling first,
/// then renamed over whatever was there, so a run killed mid-write, or two runs warming up
/// the same settings at once, never leave a half-written result that a later run reuses.
fn save_warmup(
    cache: &Path,
    fingerprint: &str,
    policy: &Policy,
    model: &TrainableModel,
) -> Result<(), WarmupError> {
    let io = |what, path: &Path, source| {
        WarmupError::Model(rollflash_core::IoError::new(what, path, source).into())
    };
    let name = cache
        .file_name()
        .map_or_else(|| "warmup".into(), |n| n.to_string_lossy().into_owned());
    let parent = cache.parent().unwrap_or(Path::new("."));
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    rollflash_model::hf::save_dir(
        &tmp,
        &policy.model_cfg,
        &model.weights(),
        Some(&policy.tokenizer),
    )?;
    let fp = tmp.join(FINGERPRINT_FILE);
    std::fs::write(&fp, format!("{fingerprint}\n")).map_err(|e| io("cannot write", &fp, e))?;
    if cache.exists() {
        std::fs::rename(cache, &old).map_err(|e| io("cannot move aside", cache, e))?;
    }
    std::fs::rename(&tmp, cache).map_err(|e| io("cannot rename into", cache, e))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// How a caller changes the stack (benchmarks measure one mechanism at a time): each
/// backend and each environment can be wrapped.
#[derive(Default)]
pub struct StackHooks {
    pub wrap_backend: Option<WrapBackend>,
    pub wrap_env: Option<WrapEnv>,
    /// Where the proxy reports its backends' busy intervals, pauses and weight loads (the
    /// dashboard's `timeline.jsonl`).
    pub timeline: Option<rollflash_rollout::Timeline>,
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
            .field("timeline", &self.timeline.is_some())
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
    /// The servers among the backends ([`Stack::connect`] checks them).
    fleet: Fleet,
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
        let publisher = weight_publisher(plan, policy)?;
        let tinker_adapters = tinker_adapters(plan, policy)?;
        let (backends, remotes) = backend_entries(
            plan,
            policy,
            &snapshot,
            version,
            hooks,
            publisher.as_ref(),
            tinker_adapters.as_ref(),
        )?;
        let proxy_cfg = rollflash_rollout::ProxyConfig {
            timeline: hooks.timeline.clone(),
            ..plan.proxy().clone()
        };
        let proxy = LlmProxy::start(backends, plan.routing().policy(), proxy_cfg);
        let (vtx, vrx) = watch::channel(version);
        let env_cfg = env_manager_config(plan, policy);
        let envs = EnvManager::new(
            proxy.handle(),
            Arc::clone(&policy.tokenizer),
            policy.renderer.clone(),
            env_cfg.clone(),
            vrx.clone(),
        )
        .with_replication(plan.replication());
        let (train, eval_make) = env_factories(plan.env())?;
        let make: EnvFactory = match hooks.wrap_env.clone() {
            Some(wrap) => Arc::new(move || train().map(|e| wrap(e))),
            None => train,
        };
        let eval_envs = greedy_env_manager(&proxy, policy, env_cfg, vrx);
        Ok(Stack {
            proxy,
            version: vtx,
            envs,
            make,
            eval_envs,
            eval_make,
            fleet: Fleet {
                remotes,
                snapshot,
                version,
                check_timeout: plan.server_check_timeout(),
                max_total_tokens: plan.env_manager().max_total_tokens,
                remote_learner: matches!(plan.trainer(), TrainerPlan::Tinker(_)),
            },
        })
    }

    /// A rollout plane of its own for evaluating `model` as `version` (`train.eval_every`):
    /// one in-process engine, greedy, the run's evaluation environments. The run's engines
    /// are left alone: they may still serve the version before, and a weight sync there
    /// would abort the evaluation's requests.
    pub fn probe(
        plan: &RunPlan,
        policy: &Policy,
        model: Arc<rollflash_model::model::Transformer>,
        version: PolicyVersion,
        tasks: usize,
    ) -> Result<Probe, StackError> {
        let threads = plan
            .backends()
            .iter()
            .find_map(|b| match b {
                BackendPlan::Engine { threads, .. } => Some(*threads),
                BackendPlan::Remote { .. } => None,
            })
            .unwrap_or(1);
        let running = tasks.max(1);
        let backend = engine(model, version, "eval-probe", threads, running)?;
        let proxy = LlmProxy::start(
            vec![BackendEntry {
                backend: Arc::new(backend),
                route: WeightRoute::Direct,
                max_running_requests: running,
                update_timeout: None,
            }],
            plan.routing().policy(),
            plan.proxy().clone(),
        );
        let (_, eval_make) = env_factories(plan.env())?;
        let (version_tx, vrx) = watch::channel(version);
        let eval_envs = greedy_env_manager(&proxy, policy, env_manager_config(plan, policy), vrx);
        Ok(Probe {
            proxy,
            _version: version_tx,
            eval_envs,
            eval_make,
        })
    }

    /// The start-up checks of every server, then the first weight load: each server must be
    /// up, serve a model whose vocabulary and end-of-sequence tokens agree with the trainer's,
    /// and (with `weights = "disk"`) load the starting weights and report serving them. Each
    /// check is bounded by `rollout.server_check_timeout_secs`, each load by
    /// `rollout.weight_sync_timeout_secs`; the error names the server and what disagrees.
    /// Nothing to do without servers.
    pub async fn connect(&self, policy: &Policy) -> Result<(), StackError> {
        if self.fleet.remotes.is_empty() {
            return Ok(());
        }
        let checks = self
            .fleet
            .remotes
            .iter()
            .map(|r| self.fleet.check(r, policy));
        for r in futures::future::join_all(checks).await {
            r?;
        }
        // Tinker samplers start on the server's base model (version 0) and load only the
        // learner's `tinker://` paths; with a Tinker learner other servers start on the base
        // model too and load only its adapters: there are no starting weights of ours.
        if self.fleet.remote_learner
            || self
                .fleet
                .remotes
                .iter()
                .all(|r| r.kind == ServerKind::Tinker)
        {
            return Ok(());
        }
        let update = WeightUpdate::InProcess {
            model: Arc::clone(&self.fleet.snapshot),
            version: self.fleet.version,
        };
        match self
            .proxy
            .handle()
            .sync_weights(&update, PauseMode::Abort)
            .await
        {
            Ok(t) => {
                for b in t.backends.iter().filter(|b| self.fleet.is_remote(&b.name)) {
                    tracing::info!(
                        backend = %b.name,
                        version = %self.fleet.version,
                        ms = b.took.as_secs_f64() * 1e3,
                        "server loaded the starting weights"
                    );
                }
                Ok(())
            }
            Err(ProxyError::Sync { failed, .. }) => Err(StackError::FirstWeights {
                version: self.fleet.version,
                failed,
            }),
            Err(e) => Err(StackError::Proxy(Box::new(e))),
        }
    }
}

/// The publisher of each version's directory, when some backend loads from disk.
fn weight_publisher(
    plan: &RunPlan,
    policy: &Policy,
) -> Result<Option<Arc<WeightPublisher>>, StackError> {
    Ok(match plan.weights_dir() {
        Some(dir) => Some(Arc::new(
            WeightPublisher::new(
                dir.clone(),
                PUBLISHED_KEPT,
                policy.model_cfg.clone(),
                Some(Arc::clone(&policy.tokenizer)),
            )
            .map_err(|e| StackError::Publish(Box::new(e)))?,
        )),
        None => None,
    })
}

/// The adapters a Tinker learner exports, when some backend loads them from disk.
fn tinker_adapters(
    plan: &RunPlan,
    policy: &Policy,
) -> Result<Option<Arc<TinkerAdapters>>, StackError> {
    // A Tinker learner's versions reach every backend but the server's own samplers as
    // the adapter the server exports, fetched once per version for all of them.
    Ok(match (plan.trainer(), plan.weights_dir()) {
        (TrainerPlan::Tinker(t), Some(dir)) => Some(Arc::new(TinkerAdapters::new(
            TinkerClient::new(t.client.clone()).map_err(|e| StackError::Server {
                url: t.client.base_url.clone(),
                problem: format!("cannot make a Tinker client: {e}"),
            })?,
            dir.clone(),
            PUBLISHED_KEPT,
            policy.model_cfg.vocab_size,
        ))),
        _ => None,
    })
}

/// The proxy's backends, in the plan's order, each wrapped by `hooks` and given the route
/// its new weights take (through `publisher` or `tinker_adapters`); and the servers among
/// them, for the start-up checks.
fn backend_entries(
    plan: &RunPlan,
    policy: &Policy,
    snapshot: &Arc<rollflash_model::model::Transformer>,
    version: PolicyVersion,
    hooks: &StackHooks,
    publisher: Option<&Arc<WeightPublisher>>,
    tinker_adapters: Option<&Arc<TinkerAdapters>>,
) -> Result<(Vec<BackendEntry>, Vec<Remote>), StackError> {
    let tinker_route = || -> WeightRoute {
        match tinker_adapters {
            Some(a) => WeightRoute::Disk(DiskWeights::tinker(Arc::clone(a))),
            None => WeightRoute::Direct,
        }
    };
    let mut backends = Vec::with_capacity(plan.backends().len());
    let mut remotes = Vec::new();
    for b in plan.backends() {
        let (backend, route, max_running, update_timeout): (
            Arc<dyn Backend>,
            WeightRoute,
            usize,
            Option<std::time::Duration>,
        ) = match b {
            BackendPlan::Engine {
                name,
                threads,
                max_running_requests,
            } => (
                Arc::new(engine(
                    Arc::clone(snapshot),
                    version,
                    name,
                    *threads,
                    *max_running_requests,
                )?),
                tinker_route(),
                *max_running_requests,
                None,
            ),
            BackendPlan::Remote {
                kind: ServerKind::Tinker,
                http,
                max_running_requests,
                model,
                weight_sync_timeout,
                ..
            } => {
                // It loads the learner's `tinker://` paths itself: no weight route around it.
                let client = tinker_backend(
                    http,
                    model.as_deref(),
                    version,
                    policy,
                    plan.server_check_timeout(),
                )?;
                remotes.push(Remote {
                    kind: ServerKind::Tinker,
                    http: http.clone(),
                });
                (
                    client,
                    WeightRoute::Direct,
                    *max_running_requests,
                    Some(*weight_sync_timeout),
                )
            }
            BackendPlan::Remote {
                kind,
                http,
                max_running_requests,
                weights,
                model,
                weight_sync_timeout,
            } => {
                let mut http = http.clone();
                http.initial_version = version;
                let client = remote_backend(*kind, &http, model.as_deref(), *weights)?;
                remotes.push(Remote { kind: *kind, http });
                let route = match (weights, publisher) {
                    (ServerWeights::Disk, _) if tinker_adapters.is_some() => tinker_route(),
                    (w, Some(p)) if w.sends_adapter(*kind, plan.lora().is_some()) => {
                        WeightRoute::Disk(DiskWeights::adapter(
                            Arc::clone(p),
                            rollflash_rollout::AdapterProbe::default(),
                        ))
                    }
                    (ServerWeights::Disk | ServerWeights::Merged, Some(p)) => {
                        WeightRoute::Disk(DiskWeights::new(Arc::clone(p)))
                    }
                    _ => WeightRoute::Fixed { serves: version },
                };
                (
                    client,
                    route,
                    *max_running_requests,
                    Some(*weight_sync_timeout),
                )
            }
        };
        let backend = match &hooks.wrap_backend {
            Some(wrap) => wrap(backend),
            None => backend,
        };
        backends.push(BackendEntry {
            backend,
            route,
            max_running_requests: max_running,
            update_timeout,
        });
    }
    Ok((backends, remotes))
}

/// How many published versions stay on disk: the newest, and the one before it (servers
/// still loading or catching up read it).
const PUBLISHED_KEPT: usize = 2;

/// The client for one `[[rollout.servers]]` entry: the one place a server kind becomes a
/// backend.
fn remote_backend(
    kind: ServerKind,
    http: &HttpBackendConfig,
    model: Option<&str>,
    weights: ServerWeights,
) -> Result<Arc<dyn Backend>, StackError> {
    Ok(match kind {
        ServerKind::Sglang | ServerKind::Rollflash => Arc::new(SglangBackend::new(http.clone())?),
        ServerKind::Openai => Arc::new(OpenAiBackend::new(OpenAiConfig {
            http: http.clone(),
            model: model.map(str::to_string),
            weight_hook: match weights {
                ServerWeights::Disk | ServerWeights::Merged => {
                    WeightHook::update_weights_from_disk()
                }
                ServerWeights::None => WeightHook::None,
            },
            use_extension: true,
        })?),
        ServerKind::Vllm => {
            let b = VllmBackend::new(http.clone())?;
            Arc::new(match model {
                Some(m) => b.with_model(m),
                None => b,
            })
        }
        // Connected by `tinker_backend`, which the stack calls for this kind.
        ServerKind::Tinker => {
            return Err(StackError::Server {
                url: http.base_url.clone(),
                problem: "a Tinker sampler is built by the stack, not as an HTTP client".into(),
            })
        }
    })
}

/// A Tinker server's sampler on `model` (the server's first when `None`), at `version` until
/// the learner's first update. Opening its session is a call to the server: made here, on
/// this runtime thread (`block_in_place`: a multi-threaded runtime, as every command's), within
/// `check_timeout` (`rollout.server_check_timeout_secs`), so a server that is down or hung is
/// named when the stack is built.
fn tinker_backend(
    http: &HttpBackendConfig,
    model: Option<&str>,
    version: PolicyVersion,
    policy: &Policy,
    check_timeout: std::time::Duration,
) -> Result<Arc<dyn Backend>, StackError> {
    let mut cfg = TinkerBackendConfig::new(http.base_url.clone());
    cfg.api_key = http.api_key.clone();
    cfg.base_model = model.map(str::to_string);
    cfg.sample_deadline = http.timeout;
    cfg.vocab_size = Some(policy.model_cfg.vocab_size);
    cfg.initial_version = version;
    let refuse = |problem: String| StackError::Server {
        url: http.base_url.clone(),
        problem,
    };
    let rt = tokio::runtime::Handle::current();
    let connect = tokio::time::timeout(check_timeout, TinkerBackend::connect(cfg));
    let b = tokio::task::block_in_place(|| rt.block_on(connect))
        .map_err(|_| {
            refuse(format!(
                "did not open a sampling session within {:.0} s \
                 (rollout.server_check_timeout_secs)",
                check_timeout.as_secs_f64()
            ))
        })?
        .map_err(|e| {
            refuse(format!(
                "the Tinker sampler could not connect: {}",
                rollflash_core::error_chain(&e)
            ))
        })?;
    Ok(Arc::new(b))
}

/// The servers of a stack, for the start-up checks and the first weight load.
struct Fleet {
    remotes: Vec<Remote>,
    /// The weights the stack started with, loaded into the servers by `connect`.
    snapshot: Arc<rollflash_model::model::Transformer>,
    version: PolicyVersion,
    check_timeout: std::time::Duration,
    /// The longest sequence a trajectory may reach: a server accepting less is refused.
    max_total_tokens: usize,
    /// The learner is a Tinker server: every server starts on the base model it was given
    /// and loads only the learner's versions (the server's adapters), none of ours.
    remote_learner: bool,
}

struct Remote {
    kind: ServerKind,
    http: HttpBackendConfig,
}

impl Fleet {
    fn is_remote(&self, name: &str) -> bool {
        self.remotes
            .iter()
            .any(|r| r.http.base_url.trim_end_matches('/') == name)
    }

    /// For a server that does not report its vocabulary: its tokenizer must give
    /// [`TOKENIZER_PROBE`] the trainer's ids, where it can tokenize (vLLM); where it cannot,
    /// a warning says the check was not made.
    async fn check_tokenizer(
        &self,
        r: &Remote,
        http: &HttpBackendConfig,
        model: Option<&str>,
        policy: &Policy,
    ) -> Result<(), StackError> {
        let url = &r.http.base_url;
        let refuse = |problem: String| StackError::Server {
            url: url.clone(),
            problem,
        };
        let theirs = tokio::time::timeout(
            self.check_timeout,
            rollflash_rollout::server_tokenize(http, model, TOKENIZER_PROBE),
        )
        .await
        .map_err(|_| refuse("did not answer POST /tokenize within the check deadline".into()))?
        .map_err(|e| {
            refuse(format!(
                "refused POST /tokenize: {}",
                rollflash_core::error_chain(&e)
            ))
        })?;
        let Some(theirs) = theirs else {
            tracing::warn!(
                server = %url,
                "the server reports neither its vocabulary size nor tokenizes; \
                 cannot check that its tokenizer agrees with the trainer's"
            );
            return Ok(());
        };
        let ours = policy
            .tokenizer
            .encode(TOKENIZER_PROBE, false)
            .map_err(|e| {
                refuse(format!(
                    "the trainer cannot tokenize the probe text: {}",
                    rollflash_core::error_chain(&e)
                ))
            })?;
        if theirs != ours {
            let at = theirs
                .iter()
                .zip(&ours)
                .position(|(a, b)| a != b)
                .unwrap_or(theirs.len().min(ours.len()));
            return Err(refuse(format!(
                "tokenizes {TOKENIZER_PROBE:?} differently from the trainer's tokenizer \
                 ({} ids against {}, first difference at position {at}): token ids would not \
                 mean the same on both sides",
                theirs.len(),
                ours.len()
            )));
        }
        tracing::info!(server = %url, ids = ours.len(), "the server's tokenizer agrees with the trainer's");
        Ok(())
    }

    /// Health, model, vocabulary and end-of-sequence agreement of one server, within the
    /// check deadline.
    async fn check(&self, r: &Remote, policy: &Policy) -> Result<(), StackError> {
        let url = r.http.base_url.clone();
        let refuse = |problem: String| StackError::Server {
            url: url.clone(),
            problem,
        };
        let api = match r.kind {
            ServerKind::Sglang | ServerKind::Rollflash => ServerApi::Sglang,
            ServerKind::Openai | ServerKind::Vllm => ServerApi::OpenAi,
            // Checked by its own client when it connects.
            ServerKind::Tinker => return Ok(()),
        };
        let mut http = r.http.clone();
        http.timeout = http.timeout.min(self.check_timeout);
        let info = tokio::time::timeout(self.check_timeout, probe_server(&http, api))
            .await
            .map_err(|_| {
                refuse(format!(
                    "did not answer its start-up checks within {:.0} s \
                     (rollout.server_check_timeout_secs)",
                    self.check_timeout.as_secs_f64()
                ))
            })?
            .map_err(|e| {
                refuse(format!(
                    "is down or refused the start-up checks: {}",
                    rollflash_core::error_chain(&e)
                ))
            })?;
        let ours = policy.model_cfg.vocab_size;
        match info.vocab_size {
            Some(v) if v != ours => {
                return Err(refuse(format!(
                    "serves a model with vocab_size {v}, the trainer's model has {ours}: \
                     token ids would not mean the same on both sides"
                )))
            }
            Some(_) => {}
            None => {
                self.check_tokenizer(r, &http, info.model.as_deref(), policy)
                    .await?
            }
        }
        if let (Some(theirs), Some(eos)) = (&info.eos_token_ids, policy.tokenizer.eos_token_id()) {
            if !theirs.contains(&eos) {
                return Err(refuse(format!(
                    "ends sequences at token ids {theirs:?}, the trainer's tokenizer at {eos}"
                )));
            }
        }
        if let Some(len) = info.max_model_len {
            if len < self.max_total_tokens {
                return Err(refuse(format!(
                    "accepts sequences of at most {len} tokens (max_model_len), \
                     rollout.max_total_tokens is {}",
                    self.max_total_tokens
                )));
            }
        }
        tracing::info!(
            server = %url,
            model = info.model.as_deref().unwrap_or("?"),
            weight_version = ?info.weight_version.map(|v| v.0),
            "server passed its start-up checks"
        );
        Ok(())
    }
}

/// A text of the kinds a run's prompts and answers hold (digits, arithmetic, a `####` answer
/// line, whitespace runs, accents, CJK, an emoji, JSON), for [`Fleet::check_tokenizer`].
const TOKENIZER_PROBE: &str = "Q: 12+7=19, 19 - 3 = 16.\n#### 16\n\n  The café's naïve \
    coöperation: 東京 🙂\t{\"a\": [1, 2.5]}";

/// The training and evaluation factories of `source`. Remote ones share one client (one
/// connection pool) per run: each trajectory gets a new environment, not a new client.
/// What [`Stack::probe`] builds: evaluation environments over one engine of their own.
pub struct Probe {
    proxy: LlmProxy,
    /// Keeps the environment manager's version channel open.
    _version: watch::Sender<PolicyVersion>,
    pub eval_envs: EnvManager,
    pub eval_make: EnvFactory,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe").field("proxy", &self.proxy).finish()
    }
}

impl Probe {
    /// Stops its engine and proxy.
    pub async fn shutdown(self) -> Result<(), ProxyError> {
        self.proxy.shutdown().await.map(|_| ())
    }
}

/// An in-process engine serving `model` as `version`.
fn engine(
    model: Arc<rollflash_model::model::Transformer>,
    version: PolicyVersion,
    name: &str,
    threads: usize,
    max_running_requests: usize,
) -> Result<EngineBackend, StackError> {
    Ok(EngineBackend::start(
        model,
        version,
        EngineBackendConfig {
            name: name.to_string(),
            engine: EngineConfig {
                max_running_requests,
                threads,
                ..Default::default()
            },
        },
    )?)
}

/// The plan's environment-manager settings with the policy's stop tokens.
fn env_manager_config(plan: &RunPlan, policy: &Policy) -> EnvManagerConfig {
    let mut cfg = plan.env_manager().clone();
    cfg.sampling.stop_token_ids = policy.stop_tokens();
    cfg
}

/// An environment manager that decodes greedily: what every evaluation runs.
fn greedy_env_manager(
    proxy: &LlmProxy,
    policy: &Policy,
    cfg: EnvManagerConfig,
    version: watch::Receiver<PolicyVersion>,
) -> EnvManager {
    EnvManager::new(
        proxy.handle(),
        Arc::clone(&policy.tokenizer),
        policy.renderer.clone(),
        EnvManagerConfig {
            sampling: rollflash_core::SamplingParams {
                temperature: 0.0,
                ..cfg.sampling.clone()
            },
            ..cfg
        },
        version,
    )
}

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
    match plan.env() {
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
