//! The whole `rollflash train` run from a [`TrainConfig`]: policy (built-in or a Hugging
//! Face directory), a cached supervised warm-up where the task needs one, engine workers
//! behind the proxy, environments through the `EnvManager`, the asynchronous controller with
//! the policy learner, greedy evaluation before and after, metrics and the final checkpoint.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device};
use rollflash_core::proxy::{routing_policy, GroupId};
use rollflash_core::{PolicyVersion, SamplingParams};
use rollflash_env::envs::{make_env, EnvConfig};
use rollflash_env::math_task::MathTask;
use rollflash_env::Env;
use rollflash_model::chat::ChatTemplate;
use rollflash_model::config::ModelConfig;
use rollflash_model::engine::EngineConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::{OptimizerConfig, TrainableModel};
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    Backend, BackendEntry, EngineBackend, EngineBackendConfig, EnvFactory, EnvManager,
    EnvManagerConfig, LlmProxy, ProxyConfig, Renderer,
};
use tokio::sync::watch;

use crate::config::TrainConfig;
use crate::controller::{AsyncController, ControllerConfig, RunReport};
use crate::learner::{LearnerConfig, PolicyLearner};
use crate::warmup;

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
    Controller(#[from] crate::controller::ControllerError),
    #[error("learner: {0}")]
    Learner(#[from] crate::controller::LearnerError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// Mean greedy reward on held-out tasks before RL (after the warm-up).
    pub eval_before: Option<f64>,
    /// The same after RL.
    pub eval_after: Option<f64>,
    pub report: RunReport,
    /// Where the final checkpoint was written.
    pub checkpoint: PathBuf,
}

/// Episode seeds for evaluation, far from the training seeds so no task is shared.
const EVAL_SEED_BASE: u64 = 1 << 40;

/// Runs everything the config describes.
pub async fn run(cfg: TrainConfig) -> Result<TrainSummary, PipelineError> {
    let device = Device::Cpu;
    std::fs::create_dir_all(&cfg.output_dir).map_err(|source| PipelineError::Io {
        what: "cannot create output directory",
        path: cfg.output_dir.clone(),
        source,
    })?;

    // The policy and how conversations become tokens.
    let (model_cfg, weights, tokenizer, renderer) = match &cfg.model.path {
        Some(dir) => {
            let model_cfg = rollflash_model::hf::load_config(dir)?;
            let weights = rollflash_model::hf::load_weights(dir, &device)?;
            let tokenizer = Tokenizer::from_dir(dir)?;
            let renderer =
                match ChatTemplate::from_tokenizer_config(&dir.join("tokenizer_config.json"))? {
                    Some(t) => Renderer::Chat {
                        template: Arc::new(t),
                        system: None,
                    },
                    None => plain(),
                };
            (model_cfg, weights, tokenizer, renderer)
        }
        None => {
            let tokenizer = Tokenizer::builtin();
            let eos = tokenizer
                .eos_token_id()
                .ok_or_else(|| PipelineError::Invalid("built-in tokenizer has no eos".into()))?;
            let model_cfg = ModelConfig::builtin_default(tokenizer.vocab_size(), eos);
            let weights = Weights::random(&model_cfg, cfg.seed, DType::F32, &device)?;
            (model_cfg, weights, tokenizer, plain())
        }
    };
    let tokenizer = Arc::new(tokenizer);
    let eos = tokenizer.eos_token_id();
    let mut model = TrainableModel::new(&model_cfg, &weights, DType::F32, &device)?;

    // Supervised warm-up (math task only: its generator lives with the task), cached.
    if cfg.warmup.steps > 0 {
        if let EnvConfig::Math(task_cfg) = &cfg.env.env {
            let task = MathTask::new(task_cfg.clone())
                .map_err(|e| PipelineError::Invalid(format!("env: {e}")))?;
            let cache = cfg
                .output_dir
                .join(format!("warmup-{:016x}", warmup::cache_key(&cfg)));
            if cfg.warmup.cache && cache.join("model.safetensors").exists() {
                let w = rollflash_model::hf::load_weights(&cache, &device)?;
                model = TrainableModel::new(&model_cfg, &w, DType::F32, &device)?;
                println!("warm-up: reused {}", cache.display());
            } else {
                tokio::task::block_in_place(|| warmup::run(&model, &tokenizer, &task, &cfg))?;
                if cfg.warmup.cache {
                    rollflash_model::hf::save_dir(
                        &cache,
                        &model_cfg,
                        &model.weights(),
                        Some(&tokenizer),
                    )?;
                }
            }
        } else {
            println!(
                "warm-up: skipped (only the math task ships warm-up data; env is `{}`)",
                cfg.env.name()
            );
        }
    }

    // Rollout plane: engine workers behind the proxy.
    let snapshot = Arc::new(model.snapshot()?);
    let mut backends = Vec::new();
    for i in 0..cfg.rollout.engines {
        let b = EngineBackend::start(
            Arc::clone(&snapshot),
            PolicyVersion(0),
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
    let policy = routing_policy(&cfg.rollout.routing).ok_or_else(|| {
        PipelineError::Invalid(format!("unknown routing {}", cfg.rollout.routing))
    })?;
    let proxy = LlmProxy::start(backends, policy, ProxyConfig::default());
    let (vtx, vrx) = watch::channel(PolicyVersion(0));
    let sampling = SamplingParams {
        temperature: cfg.rollout.temperature,
        top_p: cfg.rollout.top_p,
        max_new_tokens: cfg.rollout.max_new_tokens,
        stop_token_ids: eos.into_iter().collect(),
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
        Arc::clone(&tokenizer),
        renderer.clone(),
        env_cfg.clone(),
        vrx.clone(),
    );
    let spec = cfg.env.clone();
    spec.validate()?;
    let make: EnvFactory = Arc::new(move || make_env(&spec));
    // Evaluation: the same environments without injected latency or failures, greedy.
    let mut eval_spec = cfg.env.clone();
    eval_spec.latency = None;
    eval_spec.failure = None;
    let eval_make: EnvFactory = Arc::new(move || make_env(&eval_spec));
    let eval_envs = EnvManager::new(
        proxy.handle(),
        Arc::clone(&tokenizer),
        renderer,
        EnvManagerConfig {
            sampling: SamplingParams {
                temperature: 0.0,
                ..sampling
            },
            ..env_cfg
        },
        vrx,
    );

    let eval_before = evaluate(&eval_envs, &eval_make, cfg.train.eval_problems).await;
    if let Some(r) = eval_before {
        println!(
            "eval before RL: mean greedy reward {r:.3} on {} tasks",
            cfg.train.eval_problems
        );
    }

    // The controller with the real learner.
    let mut buffer = cfg.buffer.clone();
    if cfg.controller.sync {
        buffer.alpha = 0.0;
        buffer.barrier = true;
    }
    let learner = PolicyLearner::new(
        model,
        LearnerConfig {
            optimizer: OptimizerConfig {
                lr: cfg.train.lr,
                weight_decay: cfg.train.weight_decay,
                max_grad_norm: Some(cfg.train.max_grad_norm),
                warmup_steps: cfg.train.lr_warmup_steps,
                total_steps: 0,
                ..Default::default()
            },
            loss: cfg.train.loss.clone(),
            advantage: cfg.train.advantage,
            temperature: cfg.rollout.temperature,
            threads: cfg.train.threads,
        },
    )?;
    let ctl = AsyncController::new(
        ControllerConfig {
            buffer,
            redundancy: cfg.rollout.group_size_redundancy,
            steps: cfg.train.steps,
            pause_mode: cfg.controller.pause_mode,
            seed: cfg.seed.wrapping_mul(1_000_003),
        },
        proxy.handle(),
        envs,
        make,
        vtx,
        learner,
    )?;
    let (report, learner) = ctl.run_returning_learner().await?;

    let eval_after = evaluate(&eval_envs, &eval_make, cfg.train.eval_problems).await;
    proxy.shutdown().await?;

    write_metrics(&cfg.output_dir.join("metrics.jsonl"), &report)?;
    let checkpoint = cfg.output_dir.join("final");
    if let Some(l) = learner {
        rollflash_model::hf::save_dir(
            &checkpoint,
            &model_cfg,
            &l.model().weights(),
            Some(&tokenizer),
        )?;
    }
    Ok(TrainSummary {
        eval_before,
        eval_after,
        report,
        checkpoint,
    })
}

fn plain() -> Renderer {
    Renderer::Plain {
        separator: "\n".into(),
    }
}

/// Mean greedy reward over `n` held-out tasks, each a one-trajectory group.
async fn evaluate(envs: &EnvManager, make: &EnvFactory, n: usize) -> Option<f64> {
    if n == 0 {
        return None;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n as u64 {
        let envs = envs.clone();
        let make = Arc::clone(make);
        tasks.spawn(async move {
            let mut env: Box<dyn Env> = match make() {
                Ok(e) => e,
                Err(_) => return 0.0,
            };
            let t = envs
                .run_trajectory(env.as_mut(), EVAL_SEED_BASE + i, 0, GroupId(u64::MAX - i))
                .await;
            t.reward
        });
    }
    let mut sum = 0.0;
    while let Some(r) = tasks.join_next().await {
        sum += r.unwrap_or(0.0);
    }
    Some(sum / n as f64)
}

fn write_metrics(path: &Path, report: &RunReport) -> Result<(), PipelineError> {
    let io = |source| PipelineError::Io {
        what: "cannot write metrics",
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::create(path).map_err(io)?;
    for s in &report.steps {
        let mut m = serde_json::json!({
            "step": s.step,
            "version": s.version.0,
            "samples": s.samples,
            "tokens": s.tokens,
            "reward": s.mean_reward,
            "staleness": s.staleness,
            "loss": s.stats.loss,
            "wall_s": s.wall.as_secs_f64(),
            "train_s": s.train.as_secs_f64(),
            "wait_s": s.wait.as_secs_f64(),
            "sync_s": s.sync.total().as_secs_f64(),
            "trained": s.accounting.trained,
            "filtered": s.accounting.filtered,
            "dropped_stale": s.accounting.dropped_stale,
            "aborted": s.accounting.aborted,
            "failed": s.accounting.failed,
        });
        for (k, v) in &s.stats.metrics {
            m[k] = serde_json::json!(v);
        }
        writeln!(f, "{m}").map_err(io)?;
    }
    Ok(())
}
