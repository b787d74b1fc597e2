//! `rollflash sim validate`: calibrates the simulator's cost model on this machine and
//! compares a simulated run with a measured `rollflash train` run.
//!
//! Validation, step by step (see `BENCHMARKS.md`):
//! 1. `rollflash train --set output_dir=D …` writes `D/metrics.jsonl`.
//! 2. [`validate`] with the same config and `--set`s builds the run's initial policy (or its
//!    cached warm-up) and measures the run's own first tasks with it:
//!    - single-turn (the math task): draws the first prompts and times the real engine on
//!      them (continuous batching, the run's sampling); the generated lengths are the
//!      workload;
//!    - multi-turn (any other environment): rolls out real episodes through the real
//!      rollout plane (engine workers behind the `LlmProxy`, the `EnvManager`), then
//!      times the real engine replaying their turns (each turn's real context, its
//!      measured length, each submitted when the turn before it finished); the measured
//!      groups are the workload, replayed whole by the simulator, and the environment's
//!      configured latency and failures are drawn by it.
//!
//!    A least-squares fit of every engine step gives the decode/prefill cost; two batch
//!    sizes of the real learner on those trajectories give the training cost; running
//!    both at once gives their contention. Nothing is taken from the metrics but the number
//!    of steps.
//! 3. The simulator runs the run's config with those costs; samples/s are compared.

mod build;
mod compare;
mod engine;
mod episodes;
mod fit;
mod learner;
mod plan;

use std::path::PathBuf;
use std::sync::Arc;

use rollflash_core::{PolicyVersion, SamplingParams, Trajectory};
use rollflash_env::envs::make_env;
use rollflash_model::config::ModelConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;
use rollflash_run::config::{ConfigError, TrainConfig};
use rollflash_run::plan::RunPlan;
use rollflash_sim::{simulate, Contention, SimConfig, Table};

pub use build::{latency_dist, sim_config, Costs, Tasks};
pub use compare::{read_metrics, table, Measured, Provenance};
pub use engine::TurnRequest;
pub use episodes::{episode_shape, turn_requests};
pub use fit::{fit_inference, fit_training, least_squares, slowdown, StepSample};
pub use plan::{Plan, TaskKind};

/// Why a calibration could not run.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("model")]
    Model(#[from] rollflash_model::ModelError),
    #[error("tensor")]
    Tensor(#[from] candle_core::Error),
    #[error("environment")]
    Env(#[from] rollflash_env::EnvError),
    #[error("rollout")]
    Backend(#[from] rollflash_rollout::BackendError),
    #[error("proxy")]
    Proxy(#[from] rollflash_rollout::ProxyError),
    #[error(transparent)]
    Plan(#[from] rollflash_run::plan::PlanError),
    #[error("renderer")]
    Renderer(#[from] rollflash_run::stack::StackError),
    #[error("learner")]
    Learner(#[from] rollflash_trainer::LearnerError),
    #[error("simulation")]
    Sim(#[from] rollflash_sim::SimError),
    #[error("cannot start a runtime for the rollout")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Io(#[from] rollflash_core::IoError),
    #[error("{path} line {line}: not JSON")]
    MetricsJson {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} line {line}: no number `{key}`")]
    MetricsField {
        path: PathBuf,
        line: usize,
        key: String,
    },
    #[error("{0}: no steps")]
    NoSteps(PathBuf),
    #[error("no cached warm-up in {0} — run `rollflash train` with the same settings first")]
    NoWarmup(PathBuf),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Invalid(String),
    #[error("calibration engine thread panicked")]
    Panicked,
}

/// What to validate.
#[derive(Debug, Clone)]
pub struct ValidateOptions {
    /// The run's config file, if it had one.
    pub config: Option<PathBuf>,
    /// The run's `--set` overrides.
    pub sets: Vec<String>,
    /// The run's `metrics.jsonl`.
    pub metrics: PathBuf,
    /// Samples drawn for calibration: the run's first `samples / group_size` tasks.
    /// `None`: 256 for a single-turn task; 1024 for a multi-turn one, whose groups the
    /// simulator replays whole (about as many tasks as a short run starts, so the share of
    /// groups a reward filter drops is measured on enough of them).
    pub samples: Option<usize>,
}

/// Episodes of a multi-turn calibration replayed on the engine to fit its costs (the rest
/// only add workload statistics, not engine steps of a different kind).
const ENGINE_EPISODES: usize = 256;

/// The outcome: the comparison, and the simulation it ran (costs and workload included).
#[derive(Debug, Clone)]
pub struct Validation {
    pub table: Table,
    pub sim: SimConfig,
}

/// The run's starting policy.
struct Policy {
    model_cfg: ModelConfig,
    weights: Weights,
    tokenizer: Arc<Tokenizer>,
    /// The ids its generation stops on ([`ModelConfig::stop_tokens`]).
    stop: Vec<u32>,
    model: Arc<rollflash_model::model::Transformer>,
}

/// The run's starting policy: its cached warm-up, or the seeded random init.
fn starting_policy(plan: &Plan) -> Result<Policy, CalibrateError> {
    let (device, dtype) = (&plan.placement.device, plan.placement.dtype);
    let tokenizer = Tokenizer::builtin();
    let eos = tokenizer
        .eos_token_id()
        .ok_or_else(|| CalibrateError::Invalid("built-in tokenizer has no eos".into()))?;
    let model_cfg = ModelConfig::builtin_default(tokenizer.vocab_size(), eos);
    let weights = match &plan.warmup_dir {
        Some(dir) => {
            if !dir.join("model.safetensors").exists() {
                return Err(CalibrateError::NoWarmup(dir.clone()));
            }
            rollflash_model::hf::load_weights(dir, device)?
        }
        None => Weights::random(&model_cfg, plan.seed, dtype, device)?,
    };
    let model = Arc::new(rollflash_model::model::Transformer::from_weights(
        &model_cfg, &weights, dtype, device,
    )?);
    Ok(Policy {
        stop: model_cfg.stop_tokens(Some(&tokenizer)),
        model_cfg,
        weights,
        tokenizer: Arc::new(tokenizer),
        model,
    })
}

/// Calibrates on this machine, simulates the run and compares (printing progress as it
/// goes).
pub fn validate(opts: &ValidateOptions) -> Result<Validation, CalibrateError> {
    let cfg = TrainConfig::load(opts.config.as_deref(), &opts.sets)?;
    let plan = Plan::from_run(&RunPlan::new(cfg)?)?;
    let measured = read_metrics(&opts.metrics)?;
    let policy = starting_policy(&plan)?;
    let group = plan.buffer.group_size.max(1);
    let samples = opts.samples.unwrap_or(match plan.kind {
        TaskKind::SingleTurn => 256,
        TaskKind::Episodes => 1024,
    });
    let n_groups = samples.div_ceil(group).max(2);
    let (workload, samples) = match plan.kind {
        TaskKind::SingleTurn => single_turn(&plan, &policy, n_groups)?,
        TaskKind::Episodes => multi_turn(&plan, &policy, n_groups)?,
    };
    let sim = sim_config(&plan, measured.steps, &workload.costs, &workload.tasks);
    let r = simulate(&sim)?;
    let table = table(
        &plan,
        &measured,
        &r,
        &Provenance {
            samples,
            metrics: opts.metrics.clone(),
        },
    );
    Ok(Validation { table, sim })
}

/// Costs and tasks, measured.
struct Calibrated {
    costs: Costs,
    tasks: Tasks,
}

/// Calibration on the math task: the run's first prompts, each generated `group_size`
/// times by the engine alone. Returns the calibration and the number of samples.
fn single_turn(
    plan: &Plan,
    policy: &Policy,
    n_groups: usize,
) -> Result<(Calibrated, usize), CalibrateError> {
    let group = plan.buffer.group_size.max(1);
    let tokenizer = &policy.tokenizer;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(CalibrateError::Runtime)?;
    let spec = plan.quiet_env();
    let mut prompts = Vec::new();
    for k in 0..n_groups as u64 {
        let mut env = make_env(&spec)?;
        let obs = rt
            .block_on(env.reset(plan.task_seed.wrapping_add(k)))?
            .observation;
        let mut ids: Vec<u32> = tokenizer.bos_token_id().into_iter().collect();
        ids.extend(tokenizer.encode(&obs, false)?);
        prompts.push(ids);
    }
    println!(
        "calibrating on this machine: engine ({} thread(s)) on {} prompts × {group}, then the learner ({} thread(s))",
        plan.engine_threads, n_groups, plan.train_threads
    );
    let sampling = plan.sampling(policy.stop.clone());
    // One chain per sample, seeded by (prompt, sample).
    let chains_of = |prompts: &[Vec<u32>]| -> Vec<Vec<TurnRequest>> {
        prompts
            .iter()
            .enumerate()
            .flat_map(|(p, prompt)| {
                let sampling = &sampling;
                (0..group).map(move |i| {
                    vec![TurnRequest {
                        prompt: prompt.clone(),
                        params: SamplingParams {
                            seed: Some((p * 1000 + i) as u64),
                            ..sampling.clone()
                        },
                    }]
                })
            })
            .collect()
    };
    let mut steps = Vec::new();
    let mut responses: Vec<(usize, Vec<u32>)> = Vec::new();
    // Two passes: the run's admission limit, and a small one for low-batch points.
    for (pass, max_running) in [plan.max_running, 4].into_iter().enumerate() {
        let groups = if pass == 0 { n_groups } else { 2 };
        let (s, outputs) = engine::time_chains(
            &policy.model,
            plan.engine_threads,
            max_running,
            &chains_of(&prompts[..groups]),
        )?;
        steps.extend(s);
        if pass == 0 {
            responses = outputs
                .into_iter()
                .enumerate()
                .map(|(i, mut turns)| (i / group, turns.pop().unwrap_or_default()))
                .collect();
        }
    }
    let inference = fit_inference(&steps);
    print_inference(steps.len(), &inference);

    // The learner on batches of those very trajectories.
    let trajs: Vec<Trajectory> = responses
        .iter()
        .map(|(p, toks)| {
            let prompt = &prompts[*p];
            let mut t = Trajectory::default();
            for &tok in prompt {
                t.push(tok, 0, 0.0, PolicyVersion(0));
            }
            t.prompt_len = prompt.len();
            for &tok in toks {
                t.push(tok, 1, -1.0, PolicyVersion(0));
            }
            t
        })
        .collect();
    let requests: Vec<TurnRequest> = prompts
        .iter()
        .map(|p| TurnRequest {
            prompt: p.clone(),
            params: sampling.clone(),
        })
        .collect();
    let costs = learner_and_contention(plan, policy, &trajs, &requests, inference)?;
    let tasks = Tasks::SingleTurn {
        prompt_tokens: responses
            .iter()
            .map(|(p, _)| prompts[*p].len() as u64)
            .collect(),
        response_tokens: responses.iter().map(|(_, r)| r.len() as u64).collect(),
    };
    Ok((Calibrated { costs, tasks }, responses.len()))
}

/// Calibration on a multi-turn task: the run's first tasks rolled out as real episodes,
/// then the engine timed replaying their turns. Returns the calibration and the number of
/// episodes.
fn multi_turn(
    plan: &Plan,
    policy: &Policy,
    n_groups: usize,
) -> Result<(Calibrated, usize), CalibrateError> {
    println!(
        "calibrating on this machine: {n_groups} tasks × {} episodes rolled out ({} engine(s) × {} thread(s)), replayed on the engine, then the learner ({} thread(s))",
        plan.members(),
        plan.engines,
        plan.engine_threads,
        plan.train_threads
    );
    let t0 = std::time::Instant::now();
    let rollout = episodes::roll_out(plan, policy, n_groups)?;
    let trajs: Vec<&Trajectory> = rollout.groups.iter().flatten().collect();
    if trajs.is_empty() {
        return Err(CalibrateError::Invalid(format!(
            "no usable episode in {n_groups} tasks ({} failed)",
            rollout.failed
        )));
    }
    let groups: Vec<Vec<rollflash_sim::Episode>> = rollout
        .groups
        .iter()
        .map(|g| g.iter().map(episode_shape).collect())
        .collect();
    let env_turns: Vec<f64> = trajs
        .iter()
        .flat_map(|t| t.turns.iter().map(|x| x.env.as_secs_f64()))
        .collect();
    let env_step_s = env_turns.iter().sum::<f64>() / env_turns.len().max(1) as f64;
    let episodes: Vec<&rollflash_sim::Episode> = groups.iter().flatten().collect();
    let n = episodes.len() as f64;
    let turns: f64 = episodes.iter().map(|e| e.turns.len() as f64).sum();
    let resp: f64 = episodes
        .iter()
        .flat_map(|e| e.turns.iter())
        .map(|t| t.response_tokens as f64)
        .sum();
    let seq: f64 = trajs.iter().map(|t| t.tokens.len() as f64).sum();
    let mixed = groups
        .iter()
        .filter(|g| g.iter().any(|e| e.reward != g[0].reward))
        .count();
    println!(
        "episodes: {} in {:.1} s ({} failed): {:.2} turns, {:.2} response tokens/turn, {:.0} tokens each; {} of {} groups with mixed rewards; environment step {:.1} µs",
        episodes.len(),
        t0.elapsed().as_secs_f64(),
        rollout.failed,
        turns / n,
        resp / turns.max(1.0),
        seq / n,
        mixed,
        groups.len(),
        env_step_s * 1e6
    );

    let sampling = plan.sampling(policy.stop.clone());
    let chains: Vec<Vec<TurnRequest>> = trajs.iter().map(|t| turn_requests(t, &sampling)).collect();
    let mut steps = Vec::new();
    // Two passes, as for single-turn tasks: the run's admission limit on the first
    // episodes, and a small one on two groups' worth for low-batch points.
    let members = plan.members().max(1);
    for (pass, max_running) in [plan.max_running, 4].into_iter().enumerate() {
        let take = if pass == 0 {
            ENGINE_EPISODES.min(chains.len())
        } else {
            (2 * members).min(chains.len())
        };
        let (s, _) = engine::time_chains(
            &policy.model,
            plan.engine_threads,
            max_running,
            &chains[..take],
        )?;
        steps.extend(s);
    }
    let inference = fit_inference(&steps);
    print_inference(steps.len(), &inference);
    let owned: Vec<Trajectory> = trajs.iter().map(|t| (*t).clone()).collect();
    let requests: Vec<TurnRequest> = chains.into_iter().flatten().collect();
    let costs = learner_and_contention(plan, policy, &owned, &requests, inference)?;
    let count = episodes.len();
    Ok((
        Calibrated {
            costs,
            tasks: Tasks::Episodes { groups, env_step_s },
        },
        count,
    ))
}

fn print_inference(steps: usize, c: &rollflash_sim::InferenceCost) {
    println!(
        "engine: {} steps fitted: step {:.3} ms + {:.1} µs/sequence + {:.3} µs/context token, prefill {:.1} µs/token",
        steps,
        c.step_s * 1e3,
        c.seq_s * 1e6,
        c.context_token_s * 1e6,
        c.prefill_token_s * 1e6
    );
}

/// Times the learner on `trajs`, then engine (on `requests`) and learner together.
fn learner_and_contention(
    plan: &Plan,
    policy: &Policy,
    trajs: &[Trajectory],
    requests: &[TurnRequest],
    inference: rollflash_sim::InferenceCost,
) -> Result<Costs, CalibrateError> {
    let mut timed = learner::time_learner(plan, &policy.model_cfg, &policy.weights, trajs)?;
    println!(
        "learner: {:.1} ms/step + {:.1} µs/token; the first step {:.2} s more",
        timed.cost.step_s * 1e3,
        timed.cost.token_s * 1e6,
        timed.cost.first_step_s
    );
    // Engines and trainer share this machine's cores: measure how much they slow each
    // other when they run together (the asynchronous run overlaps them; sync never does).
    let (gen, train) =
        learner::time_contention(&policy.model, plan, requests, &inference, &mut timed)?;
    println!("together: engine steps {gen:.2}× and training {train:.2}× as long as alone");
    Ok(Costs {
        inference,
        training: timed.cost,
        contention: Contention { gen, train },
    })
}
