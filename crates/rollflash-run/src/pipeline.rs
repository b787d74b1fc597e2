//! The whole `rollflash train` run from a [`TrainConfig`]: policy (built-in or a Hugging
//! Face directory), a cached supervised warm-up where the task needs one, engine workers
//! behind the proxy, environments through the `EnvManager`, the asynchronous controller with
//! the policy learner, greedy evaluation before and after, per-step metrics (file, progress
//! bar, Prometheus), checkpoints and `--resume`, the final checkpoint and report. Also
//! `rollflash eval`'s evaluation of a checkpoint, which shares the rollout setup.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device};
use rollflash_core::proxy::routing_policy;
use rollflash_core::{PolicyVersion, SamplingParams};
use rollflash_env::envs::{make_env, EnvConfig};
use rollflash_env::math_task::MathTask;
use rollflash_model::chat::ChatTemplate;
use rollflash_model::config::ModelConfig;
use rollflash_model::engine::EngineConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::TrainableModel;
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    Backend, BackendEntry, EngineBackend, EngineBackendConfig, EnvFactory, EnvManager,
    EnvManagerConfig, LlmProxy, ProxyConfig, Renderer,
};
use tokio::sync::watch;

use crate::checkpoint::{self, Checkpointer};
use crate::config::TrainConfig;
use crate::eval::{describe_eval, evaluate, evaluate_sampled, success_threshold, EvalResult};
use crate::metrics::MetricsLog;
use crate::progress::Progress;
use crate::prometheus::{PromServer, SharedGauges};
use crate::report::RunSummary;
use crate::{agentic_warmup, warmup};
use rollflash_trainer::learner::PolicyLearner;
use rollflash_trainer::RunEnd;
use rollflash_trainer::{
    AsyncController, ControllerConfig, Cursor, ResumeFrom, RunReport, SinkError, StepRecord,
    StepSink,
};

/// Why a run failed; the message says at which stage.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("model: {0}")]
    Model(#[from] rollflash_model::ModelError),
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("environment: {0}")]
    Env(#[from] rollflash_env::EnvError),
    #[error("rollout: {0}")]
    Backend(#[from] rollflash_rollout::BackendError),
    #[error("proxy: {0}")]
    Proxy(#[from] rollflash_rollout::ProxyError),
    #[error(transparent)]
    Controller(#[from] rollflash_trainer::ControllerError),
    #[error("learner: {0}")]
    Learner(#[from] rollflash_trainer::LearnerError),
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error("report: {0}")]
    Report(#[from] crate::report::ReportError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("prometheus endpoint {addr}: {source}")]
    Prometheus {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Warmup(crate::warmup::WarmupError),
    /// After a weight sync no backend served the new weights within
    /// `controller.serve_timeout_secs`; the run stopped with a checkpoint of where it was.
    #[error(
        "no rollout backend serves policy {version} {waited_s:.0} s after its weight sync \
         (controller.serve_timeout_secs); stopped with a checkpoint at {}",
        checkpoint.display()
    )]
    Stalled {
        version: PolicyVersion,
        waited_s: f64,
        checkpoint: PathBuf,
    },
    /// A stop was asked for (Ctrl-C, SIGTERM) before RL training started; nothing was
    /// trained, so nothing was saved.
    #[error("interrupted during {phase}; nothing to save yet")]
    Interrupted { phase: &'static str },
}

impl From<crate::warmup::WarmupError> for PipelineError {
    /// A stop during the warm-up is the run's interruption, like one during the first
    /// evaluation.
    fn from(e: crate::warmup::WarmupError) -> Self {
        match e {
            crate::warmup::WarmupError::Interrupted => PipelineError::Interrupted {
                phase: "the warm-up",
            },
            e => PipelineError::Warmup(e),
        }
    }
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// Held-out evaluation before RL (after the warm-up); for a resumed run, the one its
    /// first process measured.
    pub eval_before: Option<EvalResult>,
    /// The same after RL.
    pub eval_after: Option<EvalResult>,
    pub report: RunReport,
    /// Where the final checkpoint was written (for an interrupted run, the resumable
    /// checkpoint of where it stopped).
    pub checkpoint: PathBuf,
    /// The run was stopped early ([`RunOptions::stop`]); there is no evaluation after RL.
    pub interrupted: bool,
    /// The checkpoint this run resumed from.
    pub resumed_from: Option<PathBuf>,
    /// `report/report.md`, when the report was written.
    pub report_path: Option<PathBuf>,
}

/// Which checkpoint `--resume` continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// The newest under `output_dir/checkpoints`.
    Latest,
    /// This checkpoint directory.
    Dir(PathBuf),
}

/// What the command line adds to a config.
#[derive(Debug, Default)]
pub struct RunOptions {
    pub resume: Option<Resume>,
    /// Overrides `[metrics] prometheus`.
    pub metrics_addr: Option<SocketAddr>,
    /// Told the Prometheus endpoint's bound address once it listens (tests bind port 0).
    pub metrics_bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
    /// Stop early when set (the command line sets it on Ctrl-C / SIGTERM). During the
    /// warm-up or the first evaluation the run ends with [`PipelineError::Interrupted`];
    /// during RL the controller aborts rollout, finishes the running step, and the run
    /// writes a checkpoint of where it stopped (resumable with `--resume`), its metrics and
    /// report, and returns with [`TrainSummary::interrupted`] set.
    pub stop: rollflash_trainer::StopFlag,
}

/// The policy a run starts from, and how its conversations become tokens.
struct Policy {
    model_cfg: ModelConfig,
    weights: Weights,
    tokenizer: Arc<Tokenizer>,
    renderer: Renderer,
}

fn plain() -> Renderer {
    Renderer::Plain {
        separator: "\n".into(),
    }
}

/// The renderer `rollout.renderer` asks for, given the model directory (if any). `auto`
/// renders plain text for the built-in model, and for a directory it saved (a warm-up
/// cache, a checkpoint): those carry the built-in tokenizer's chat template, but the model
/// was trained on plain renderings, which is what it must be given.
pub fn renderer_for(cfg: &TrainConfig, dir: Option<&Path>) -> Result<Renderer, PipelineError> {
    let template = match dir {
        Some(d) if cfg.rollout.renderer == "auto" && has_builtin_template(d) => None,
        Some(d) => ChatTemplate::from_tokenizer_config(&d.join("tokenizer_config.json"))?,
        None => None,
    };
    match (cfg.rollout.renderer.as_str(), template) {
        ("plain", _) | ("auto", None) => Ok(plain()),
        (_, Some(t)) => Ok(Renderer::Chat {
            template: Arc::new(t),
            system: None,
        }),
        (_, None) => Err(PipelineError::Invalid(
            "rollout.renderer = \"chat\" needs a model directory with a chat template".into(),
        )),
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

/// The tokenizer and renderer of the configured model (the built-in one when
/// `model.path` is empty).
fn tokenizer_and_renderer(cfg: &TrainConfig) -> Result<(Tokenizer, Renderer), PipelineError> {
    match &cfg.model.path {
        Some(dir) => Ok((Tokenizer::from_dir(dir)?, renderer_for(cfg, Some(dir))?)),
        None => Ok((Tokenizer::builtin(), renderer_for(cfg, None)?)),
    }
}

/// The configured starting policy: a Hugging Face directory, or the built-in model with
/// random weights from the seed.
fn initial_policy(cfg: &TrainConfig, device: &Device) -> Result<Policy, PipelineError> {
    let (tokenizer, renderer) = tokenizer_and_renderer(cfg)?;
    let (model_cfg, weights) = match &cfg.model.path {
        Some(dir) => (
            rollflash_model::hf::load_config(dir)?,
            rollflash_model::hf::load_weights(dir, device)?,
        ),
        None => {
            let eos = tokenizer
                .eos_token_id()
                .ok_or_else(|| PipelineError::Invalid("built-in tokenizer has no eos".into()))?;
            let model_cfg = ModelConfig::builtin_default(tokenizer.vocab_size(), eos);
            let weights = Weights::random(&model_cfg, cfg.seed, DType::F32, device)?;
            (model_cfg, weights)
        }
    };
    Ok(Policy {
        model_cfg,
        weights,
        tokenizer: Arc::new(tokenizer),
        renderer,
    })
}

/// Engines behind the proxy, the environment managers for training (sampling) and
/// evaluation (greedy, no injected latency or failures), and the version channel.
struct Rollout {
    proxy: LlmProxy,
    version: watch::Sender<PolicyVersion>,
    envs: EnvManager,
    make: EnvFactory,
    eval_envs: EnvManager,
    eval_make: EnvFactory,
}

fn start_rollout(
    cfg: &TrainConfig,
    policy: &Policy,
    model: &TrainableModel,
    version: PolicyVersion,
) -> Result<Rollout, PipelineError> {
    let snapshot = Arc::new(model.snapshot()?);
    let mut backends = Vec::new();
    for i in 0..cfg.rollout.engines {
        let b = EngineBackend::start(
            Arc::clone(&snapshot),
            version,
            EngineBackendConfig {
                name: format!("engine-{i}"),
                engine: EngineConfig {
                    max_running_requests: cfg.rollout.max_running_requests,
                    threads: cfg.rollout.engine_threads,
                    ..Default::default()
                },
            },
        )?;
        backends.push(BackendEntry {
            backend: Arc::new(b) as Arc<dyn Backend>,
            max_running_requests: cfg.rollout.max_running_requests,
        });
    }
    let routing = routing_policy(&cfg.rollout.routing).ok_or_else(|| {
        PipelineError::Invalid(format!("unknown routing {}", cfg.rollout.routing))
    })?;
    let proxy = LlmProxy::start(
        backends,
        routing,
        ProxyConfig::with_request_timeout(std::time::Duration::from_secs_f64(
            cfg.rollout.request_timeout_secs,
        )),
    );
    let (vtx, vrx) = watch::channel(version);
    let sampling = SamplingParams {
        temperature: cfg.rollout.temperature,
        top_p: cfg.rollout.top_p,
        max_new_tokens: cfg.rollout.max_new_tokens,
        stop_token_ids: policy.tokenizer.eos_token_id().into_iter().collect(),
        seed: Some(cfg.seed),
        ..Default::default()
    };
    let env_cfg = EnvManagerConfig {
        max_turns: cfg.rollout.max_turns,
        max_total_tokens: cfg.rollout.max_total_tokens,
        sampling: sampling.clone(),
        step_timeout: std::time::Duration::from_secs_f64(cfg.rollout.step_timeout_secs),
    };
    let envs = EnvManager::new(
        proxy.handle(),
        Arc::clone(&policy.tokenizer),
        policy.renderer.clone(),
        env_cfg.clone(),
        vrx.clone(),
    );
    let spec = cfg.env.clone();
    spec.validate()?;
    let make: EnvFactory = Arc::new(move || make_env(&spec));
    let mut eval_spec = cfg.env.clone();
    eval_spec.latency = None;
    eval_spec.failure = None;
    let eval_make: EnvFactory = Arc::new(move || make_env(&eval_spec));
    let eval_envs = EnvManager::new(
        proxy.handle(),
        Arc::clone(&policy.tokenizer),
        policy.renderer.clone(),
        EnvManagerConfig {
            sampling: SamplingParams {
                temperature: 0.0,
                ..sampling
            },
            ..env_cfg
        },
        vrx,
    );
    Ok(Rollout {
        proxy,
        version: vtx,
        envs,
        make,
        eval_envs,
        eval_make,
    })
}

/// The supervised warm-up the task needs, cached under `output_dir`: the math task's
/// worked solutions, or a grid world's optimal moves.
async fn warm_up(
    cfg: &TrainConfig,
    policy: &Policy,
    model: &mut TrainableModel,
    device: &Device,
    stop: &rollflash_trainer::StopFlag,
) -> Result<(), PipelineError> {
    if cfg.warmup.steps == 0 {
        return Ok(());
    }
    let supported = matches!(cfg.env.env, EnvConfig::Math(_) | EnvConfig::FrozenLake(_));
    if !supported {
        println!(
            "warm-up: skipped (warm-up data exists for math and frozen_lake; env is `{}`)",
            cfg.env.name()
        );
        return Ok(());
    }
    let cache = cfg
        .output_dir
        .join(format!("warmup-{:016x}", warmup::cache_key(cfg)));
    if cfg.warmup.cache && cache.join("model.safetensors").exists() {
        let w = rollflash_model::hf::load_weights(&cache, device)?;
        *model = TrainableModel::new(&policy.model_cfg, &w, DType::F32, device)?;
        println!("warm-up: reused {}", cache.display());
        return Ok(());
    }
    match &cfg.env.env {
        EnvConfig::Math(task_cfg) => {
            let task = MathTask::new(task_cfg.clone())
                .map_err(|e| PipelineError::Invalid(format!("env: {e}")))?;
            tokio::task::block_in_place(|| {
                warmup::run(model, &policy.tokenizer, &task, cfg, stop)
            })?;
        }
        EnvConfig::FrozenLake(lake) => {
            agentic_warmup::run(model, &policy.tokenizer, lake, cfg, stop).await?;
        }
        _ => {}
    }
    if cfg.warmup.cache {
        rollflash_model::hf::save_dir(
            &cache,
            &policy.model_cfg,
            &model.weights(),
            Some(&policy.tokenizer),
        )?;
    }
    Ok(())
}

/// Runs everything the config describes, from scratch.
pub async fn run(cfg: TrainConfig) -> Result<TrainSummary, PipelineError> {
    run_with(cfg, RunOptions::default()).await
}

/// Runs everything the config describes, resuming or serving metrics as `opts` asks.
pub async fn run_with(
    cfg: TrainConfig,
    mut opts: RunOptions,
) -> Result<TrainSummary, PipelineError> {
    let device = Device::Cpu;
    std::fs::create_dir_all(&cfg.output_dir).map_err(|source| PipelineError::Io {
        what: "cannot create output directory",
        path: cfg.output_dir.clone(),
        source,
    })?;
    let ckpt_root = checkpoint::root(&cfg.output_dir);

    // The policy: from a checkpoint when resuming (no warm-up: the checkpoint is past it).
    let resumed = match &opts.resume {
        Some(Resume::Latest) => Some(checkpoint::load(&checkpoint::latest(&ckpt_root)?, &device)?),
        Some(Resume::Dir(d)) => Some(checkpoint::load(d, &device)?),
        None => None,
    };
    let mut policy = initial_policy(&cfg, &device)?;
    if let Some(r) = &resumed {
        if r.state.seed != cfg.seed {
            return Err(PipelineError::Invalid(format!(
                "checkpoint {} was written by a run with seed {}, this config has seed {}",
                r.dir.display(),
                r.state.seed,
                cfg.seed
            )));
        }
        policy.model_cfg = r.model_cfg.clone();
        policy.weights = r.weights.clone();
        println!(
            "resuming from {} (step {}, version {})",
            r.dir.display(),
            r.state.cursor.steps_done,
            r.state.cursor.version
        );
    }
    let mut model = TrainableModel::new(&policy.model_cfg, &policy.weights, DType::F32, &device)?;
    if resumed.is_none() {
        warm_up(&cfg, &policy, &mut model, &device, &opts.stop).await?;
    }

    let start_version = resumed
        .as_ref()
        .map_or(PolicyVersion(0), |r| r.state.cursor.version);
    let rollout = start_rollout(&cfg, &policy, &model, start_version)?;
    let threshold = success_threshold(&cfg.env.env);

    let eval_before = match &resumed {
        Some(r) => r.state.eval_before,
        None => {
            let e = tokio::select! {
                e = evaluate_both(&cfg, &rollout, threshold) => e,
                _ = opts.stop.stopped() => {
                    let _ = rollout.proxy.shutdown().await;
                    return Err(PipelineError::Interrupted { phase: "the evaluation before RL" });
                }
            };
            if let Some(e) = e {
                println!("eval before RL: {}", describe_eval(&e));
            }
            e
        }
    };

    // Metrics: the file (with the resumed checkpoint's records first), the progress bar,
    // the Prometheus endpoint.
    let metrics_path = cfg.output_dir.join("metrics.jsonl");
    let prefix = resumed
        .as_ref()
        .map(|r| r.metrics.clone())
        .unwrap_or_default();
    let log = MetricsLog::create(&metrics_path, &prefix)?;
    let done_before = resumed.as_ref().map_or(0, |r| r.state.cursor.steps_done);
    let progress = Progress::new(cfg.train.steps, done_before, cfg.metrics.progress);
    let gauges: SharedGauges = Arc::default();
    let prom_addr = match opts.metrics_addr {
        Some(a) => Some(a),
        None => cfg
            .metrics
            .prometheus
            .as_deref()
            .map(|a| {
                a.parse::<SocketAddr>()
                    .map_err(|e| PipelineError::Invalid(format!("metrics.prometheus: {e}")))
            })
            .transpose()?,
    };
    let prom = match prom_addr {
        Some(addr) => {
            let s = PromServer::start(addr, Arc::clone(&gauges), Some(rollout.proxy.handle()))
                .await
                .map_err(|source| PipelineError::Prometheus {
                    addr: addr.to_string(),
                    source,
                })?;
            println!("prometheus metrics at http://{}/metrics", s.addr());
            if let Some(tx) = opts.metrics_bound.take() {
                let _ = tx.send(s.addr());
            }
            Some(s)
        }
        None => None,
    };

    // The learner, with the optimizer's moments and schedule position when resuming.
    let mut buffer = cfg.buffer.clone();
    if cfg.controller.sync {
        buffer.alpha = 0.0;
        buffer.barrier = true;
    }
    let learner_cfg = cfg.learner_config();
    let opt_cfg = learner_cfg.optimizer.clone();
    let mut learner = PolicyLearner::new(model, learner_cfg)?;
    if let Some(r) = &resumed {
        learner.set_optimizer(r.optimizer(opt_cfg)?);
    }
    let mut ctl = AsyncController::new(
        ControllerConfig {
            buffer,
            redundancy: cfg.rollout.group_size_redundancy,
            steps: cfg.train.steps,
            pause_mode: cfg.controller.pause_mode,
            serve_timeout: std::time::Duration::from_secs_f64(cfg.controller.serve_timeout_secs),
            seed: cfg.seed.wrapping_mul(1_000_003),
        },
        rollout.proxy.handle(),
        rollout.envs.clone(),
        Arc::clone(&rollout.make),
        rollout.version.clone(),
        learner,
    )?
    .with_success_threshold(threshold)
    .with_stop(opts.stop.clone());
    if let Some(r) = &resumed {
        ctl = ctl.resume_from(ResumeFrom {
            cursor: r.state.cursor,
            accounting: r.state.accounting,
        });
    }
    let checkpointer = (cfg.checkpoint.every > 0).then(|| {
        Checkpointer::new(
            ckpt_root.clone(),
            cfg.checkpoint.keep,
            policy.model_cfg.clone(),
            Arc::clone(&policy.tokenizer),
        )
    });
    let mut sink = RunSink {
        log,
        progress,
        gauges,
        checkpointer,
        every: cfg.checkpoint.every,
        seed: cfg.seed,
        elapsed_before: resumed.as_ref().map_or(0.0, |r| r.state.elapsed_s),
        eval_before,
    };
    let outcome = ctl.run_with_sink(&mut sink).await;
    sink.progress.finish();
    let (report, learner) = match outcome {
        Ok(x) => x,
        Err(e) => {
            if let Some(p) = prom {
                p.shutdown().await;
            }
            let _ = rollout.proxy.shutdown().await;
            return Err(e.into());
        }
    };

    // A run that stopped early (the user asked; or no backend served its weights) is not
    // evaluated; it saves where it stopped so `--resume` continues from there.
    let stopped_early = report.end != RunEnd::Completed;
    let eval_after = if stopped_early {
        None
    } else {
        // Every step ran; a stop now only skips the evaluation.
        tokio::select! {
            e = evaluate_both(&cfg, &rollout, threshold) => e,
            _ = opts.stop.stopped() => {
                println!("evaluation after RL skipped: stop requested");
                None
            }
        }
    };
    if let Some(p) = prom {
        p.shutdown().await;
    }
    rollout.proxy.shutdown().await?;

    let final_dir = if stopped_early {
        let c = match sink.checkpointer.take() {
            Some(c) => c,
            None => Checkpointer::new(
                ckpt_root.clone(),
                cfg.checkpoint.keep,
                policy.model_cfg.clone(),
                Arc::clone(&policy.tokenizer),
            ),
        };
        match &learner {
            Some(l) => {
                let state = checkpoint::state(
                    report.cursor,
                    report.accounting,
                    l.optimizer().steps_taken(),
                    cfg.seed,
                    sink.elapsed_before + report.wall.as_secs_f64(),
                    eval_before,
                );
                c.save(l, &state, sink.log.path())?
            }
            None => ckpt_root.clone(),
        }
    } else {
        let final_dir = cfg.output_dir.join("final");
        if let Some(l) = &learner {
            rollflash_model::hf::save_dir(
                &final_dir,
                &policy.model_cfg,
                &l.model().weights(),
                Some(&policy.tokenizer),
            )?;
        }
        final_dir
    };
    crate::report::write_summary(
        &cfg.output_dir,
        &RunSummary {
            env: cfg.env.name().to_string(),
            alpha: if cfg.controller.sync {
                0.0
            } else {
                cfg.buffer.alpha
            },
            sync: cfg.controller.sync,
            steps: report.cursor.steps_done,
            eval_before,
            eval_after,
            accounting: report.accounting,
            wall_s: report.wall.as_secs_f64(),
            samples_per_s: report.samples_per_sec(),
            tokens_per_s: report.tokens_per_sec(),
            staleness: report.staleness.clone(),
            interrupted: report.interrupted,
        },
    )?;
    let report_path = if cfg.metrics.report {
        Some(crate::report::write(&cfg.output_dir)?)
    } else {
        None
    };
    if let RunEnd::Stalled { version, waited } = report.end {
        return Err(PipelineError::Stalled {
            version,
            waited_s: waited.as_secs_f64(),
            checkpoint: final_dir,
        });
    }
    Ok(TrainSummary {
        eval_before,
        eval_after,
        interrupted: report.interrupted,
        report,
        checkpoint: final_dir,
        resumed_from: resumed.map(|r| r.dir),
        report_path,
    })
}

/// What the run does with each published step: append it to `metrics.jsonl`, move the
/// progress bar, update the Prometheus gauges, and write a checkpoint every `every` steps.
struct RunSink {
    log: MetricsLog,
    progress: Progress,
    gauges: SharedGauges,
    checkpointer: Option<Checkpointer>,
    every: usize,
    seed: u64,
    /// Wall time of earlier processes of this run (resumes).
    elapsed_before: f64,
    eval_before: Option<EvalResult>,
}

impl StepSink<PolicyLearner> for RunSink {
    fn on_step(
        &mut self,
        record: &StepRecord,
        learner: &PolicyLearner,
        cursor: Cursor,
    ) -> Result<(), SinkError> {
        self.log
            .append(&crate::metrics::step_json(record, self.elapsed_before))
            .map_err(|e| SinkError::new("metrics", e))?;
        self.progress.step(record);
        if let Ok(mut g) = self.gauges.lock() {
            g.update(record);
        }
        if let Some(c) = &self.checkpointer {
            if self.every > 0 && cursor.steps_done.is_multiple_of(self.every) {
                let state = checkpoint::state(
                    cursor,
                    record.accounting,
                    learner.optimizer().steps_taken(),
                    self.seed,
                    self.elapsed_before + record.elapsed.as_secs_f64(),
                    self.eval_before,
                );
                let dir = c
                    .save(learner, &state, self.log.path())
                    .map_err(|e| SinkError::new("checkpoint", e))?;
                tracing::info!(path = %dir.display(), "checkpoint");
            }
        }
        Ok(())
    }
}

/// Greedy evaluation, and sampled pass@1 when `train.eval_samples` asks for it.
async fn evaluate_both(cfg: &TrainConfig, rollout: &Rollout, threshold: f64) -> Option<EvalResult> {
    let mut e = evaluate(
        &rollout.eval_envs,
        &rollout.eval_make,
        cfg.train.eval_problems,
        threshold,
    )
    .await?;
    e.sampled = evaluate_sampled(
        &rollout.envs,
        &rollout.eval_make,
        cfg.train.eval_problems,
        cfg.train.eval_samples,
        cfg.rollout.temperature,
        threshold,
    )
    .await;
    Some(e)
}

/// Greedy held-out evaluation of the checkpoint in `dir` (a `final/` or `step-N/`
/// directory, or any Hugging Face directory of the configured model's family) on the task
/// `cfg` describes, over `problems` tasks.
pub async fn evaluate_checkpoint(
    cfg: &TrainConfig,
    dir: &Path,
    problems: usize,
) -> Result<EvalResult, PipelineError> {
    let device = Device::Cpu;
    let (tokenizer, renderer) = tokenizer_and_renderer(cfg)?;
    let policy = Policy {
        model_cfg: rollflash_model::hf::load_config(dir)?,
        weights: rollflash_model::hf::load_weights(dir, &device)?,
        tokenizer: Arc::new(tokenizer),
        renderer,
    };
    let model = TrainableModel::new(&policy.model_cfg, &policy.weights, DType::F32, &device)?;
    let rollout = start_rollout(cfg, &policy, &model, PolicyVersion(0))?;
    let out = evaluate(
        &rollout.eval_envs,
        &rollout.eval_make,
        problems.max(1),
        success_threshold(&cfg.env.env),
    )
    .await;
    rollout.proxy.shutdown().await?;
    out.ok_or_else(|| PipelineError::Invalid("no problems to evaluate".into()))
}
