//! The whole `rollflash train` run from a [`RunPlan`] (made from a [`TrainConfig`]): policy (built-in or a Hugging
//! Face directory), a cached supervised warm-up where the task needs one, engine workers
//! behind the proxy, environments through the `EnvManager`, the asynchronous controller with
//! the policy learner, greedy evaluation before and after, per-step metrics (file, progress
//! bar, Prometheus), checkpoints and `--resume`, the final checkpoint and report. Also
//! `rollflash eval`'s evaluation of a checkpoint, which shares the rollout setup.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rollflash_core::PolicyVersion;
use rollflash_model::model::Transformer;
use rollflash_model::train::TrainableModel;
use rollflash_trainer::learner::PolicyLearner;
use rollflash_trainer::{
    AsyncController, Cursor, ResumeFrom, RunEnd, RunReport, SinkError, StepRecord, StepSink,
};

use crate::checkpoint::{self, Checkpointer};
use crate::config::{OnCheckpointError, TrainConfig};
use crate::eval::{describe_eval, evaluate, evaluate_sampled, EvalResult};
use crate::metrics::MetricsLog;
use crate::plan::{ModelSource, RunPlan, TrainerPlan};
use crate::progress::Progress;
use crate::prometheus::{PromServer, SharedGauges};
use crate::report::RunSummary;
use crate::stack::{self, Policy, Stack, StackError, WarmedUp};
use rollflash_core::IoError;

/// Why a run failed; the message says at which stage.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
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
    Controller(#[from] rollflash_trainer::ControllerError),
    /// The learner failed mid-run (a trainer server that died or stopped answering within
    /// its deadlines): the run stopped; `--resume` continues from the newest checkpoint.
    #[error("the learner failed and the run stopped; {}", resume_hint(.checkpoint.as_deref()))]
    LearnerFailed {
        #[source]
        source: Box<rollflash_trainer::ControllerError>,
        checkpoint: Option<PathBuf>,
    },
    #[error("learner")]
    Learner(#[from] rollflash_trainer::LearnerError),
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("report")]
    Report(#[from] crate::report::ReportError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("dashboard files")]
    Dashboard(#[from] rollflash_dashboard::FileError),
    #[error("prometheus endpoint {addr}")]
    Prometheus {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// An evaluation of no tasks was asked for.
    #[error("nothing to evaluate: 0 problems")]
    NoProblems,
    /// `--resume` from a checkpoint of a run with another seed: its task stream and rollouts
    /// would not continue the same run.
    #[error("checkpoint {dir} was written by a run with seed {checkpoint}, this config has seed {config}")]
    SeedMismatch {
        dir: PathBuf,
        checkpoint: u64,
        config: u64,
    },
    /// `--resume` of a dataset run with a config whose data is not the checkpoint's (other
    /// files or contents, shuffle seed, weights), or across a dataset and a generated task.
    #[error("checkpoint {}: {reason}", dir.display())]
    DataMismatch {
        dir: PathBuf,
        reason: String,
        /// Boxed: an `EnvError` would make every `PipelineError` larger.
        #[source]
        source: Option<Box<rollflash_env::EnvError>>,
    },
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Stack(#[from] crate::stack::StackError),
    #[error(transparent)]
    Warmup(crate::warmup::WarmupError),
    /// After a weight sync no backend served the new weights, or every backend went down,
    /// for `controller.serve_timeout_secs`; the run stopped with a checkpoint of where it was.
    #[error(
        "no rollout backend has served policy {version} for {waited_s:.0} s (every one failed \
         to load it or went down; controller.serve_timeout_secs); stopped with a checkpoint at {}",
        checkpoint.display()
    )]
    Stalled {
        version: PolicyVersion,
        waited_s: f64,
        checkpoint: PathBuf,
    },
    /// Between steps no group added a sample to the buffer for
    /// `controller.progress_timeout_secs`; the run stopped with a checkpoint.
    #[error(
        "no progress for {waited_s:.0} s at policy {version} (controller.progress_timeout_secs): \
         no group added a sample to the buffer ({failed} samples failed, {filtered} filtered \
         out, {running} still running: is the environment or every server failing?); stopped \
         with a checkpoint at {}",
        checkpoint.display()
    )]
    NoProgress {
        version: PolicyVersion,
        waited_s: f64,
        running: u64,
        failed: u64,
        filtered: u64,
        checkpoint: PathBuf,
    },
    /// Something this build cannot do yet, named.
    #[error("not supported yet: {0}")]
    Unsupported(String),
    /// `reward = "code"` and the sandbox cannot start: the run refuses to start rather than
    /// run the model's code unsandboxed.
    #[error("code reward")]
    Sandbox(#[from] rollflash_sandbox::SandboxError),
    /// `reward = { python = … }` and the worker pool cannot start (no such interpreter, a
    /// broken one): the run refuses to start rather than score every sample as failed.
    #[error("Python reward")]
    PythonReward(#[from] rollflash_env::verify::python::PythonError),
    /// A phase asked for the rollout stack before it was built (a bug, reported).
    #[error("the rollout stack is not running")]
    NoStack,
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
    /// checkpoint of where it stopped); `None` for a completed run with
    /// `checkpoint.final = false`, which writes none.
    pub checkpoint: Option<PathBuf>,
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
    /// The dashboard serving this run, told the run's phase, its evaluation before RL and
    /// the rollout plane while it exists.
    pub live: Option<rollflash_dashboard::Live>,
}

/// Runs everything the config describes, from scratch.
pub async fn run(cfg: TrainConfig) -> Result<TrainSummary, PipelineError> {
    run_with(cfg, RunOptions::default()).await
}

/// Runs everything the config describes, resuming or serving metrics as `opts` asks.
pub async fn run_with(cfg: TrainConfig, opts: RunOptions) -> Result<TrainSummary, PipelineError> {
    run_plan(RunPlan::new(cfg)?, opts).await
}

/// Runs a plan, resuming or serving metrics as `opts` asks: the phases [`prepare`] (output
/// folder, Prometheus, environment check, policy, resume, warm-up, LoRA), [`start_rollout`],
/// the evaluation before RL, [`train`], the evaluation after RL and [`finish`] (final
/// checkpoint, summary, report), over a [`RunGuard`] that owns what runs beside the run, so
/// that every exit — an error in any phase, a stop, a panic — shuts it down.
pub async fn run_plan(plan: RunPlan, mut opts: RunOptions) -> Result<TrainSummary, PipelineError> {
    let mut guard = RunGuard::new(opts.live.clone().unwrap_or_default());
    let out = run_phases(&plan, &mut opts, &mut guard).await;
    guard.close().await;
    out
}

async fn run_phases(
    plan: &RunPlan,
    opts: &mut RunOptions,
    guard: &mut RunGuard,
) -> Result<TrainSummary, PipelineError> {
    if let (Some(config), Some(data)) = (plan.sandbox(), plan.data()) {
        // Before the model, the warm-up or a server check: a run that cannot score its
        // task says so at once. Every clone of the task's config (each trajectory's
        // environment) shares the sandbox set here.
        let sandbox = rollflash_sandbox::Sandbox::new(config.clone()).await?;
        data.set_sandbox(sandbox);
    }
    if let (Some(config), Some(data)) = (plan.python_reward(), plan.data()) {
        // The same, for the Python reward's workers: a missing interpreter is said at once.
        let pool = rollflash_env::verify::python::PythonPool::start(config.clone()).await?;
        data.set_python_pool(pool);
    }
    let (prepared, model) = prepare(plan, opts, guard).await?;
    let timeline = start_rollout(plan, &prepared, &model, guard).await?;
    guard.live.set_phase("evaluation before RL");
    let eval_before = match &prepared.resumed {
        Some(r) => r.state.eval_before,
        None => {
            let e = tokio::select! {
                e = evaluate_both(plan, guard.stack()?, plan.eval().problems, plan.eval().samples) => e,
                _ = opts.stop.stopped() => {
                    return Err(PipelineError::Interrupted { phase: "the evaluation before RL" });
                }
            };
            if let Some(e) = e {
                println!("eval before RL: {}", describe_eval(&e));
            }
            e
        }
    };
    guard
        .live
        .set_eval_before(eval_before.and_then(|e| serde_json::to_value(e).ok()));
    guard.live.set_phase("rl");
    match plan.trainer() {
        TrainerPlan::Embedded => {
            let learner = embedded_learner(plan, &prepared, model)?;
            rl(plan, opts, guard, prepared, learner, eval_before, timeline).await
        }
        TrainerPlan::Tinker(cfg) => {
            let learner = tinker_learner(plan, cfg, &prepared, guard).await?;
            rl(plan, opts, guard, prepared, learner, eval_before, timeline).await
        }
    }
}

/// The Tinker learner: a fresh model on the server, or, resuming, one that loads the
/// checkpoint's saved state and whose weights the samplers load before the first rollout.
async fn tinker_learner(
    plan: &RunPlan,
    cfg: &rollflash_trainer::TinkerLearnerConfig,
    p: &Prepared,
    guard: &RunGuard,
) -> Result<rollflash_trainer::TinkerLearner, PipelineError> {
    let Some(r) = &p.resumed else {
        return Ok(rollflash_trainer::TinkerLearner::connect(cfg.clone()).await?);
    };
    let saved = r.tinker()?;
    let version = r.state.cursor.version;
    let running = r
        .state
        .reward_running
        .filter(|_| plan.learner().shaping.uses_running())
        .map(|m| m.moments());
    let (learner, update) = rollflash_trainer::TinkerLearner::resume(
        cfg.clone(),
        &saved.state_path,
        r.state.optimizer_step,
        running,
        version,
    )
    .await?;
    println!(
        "tinker: loaded {} into model {} on {} (step {}, version {version})",
        saved.state_path,
        learner.model_id(),
        learner.url(),
        r.state.cursor.steps_done,
    );
    // The samplers start on the base model; the resumed run samples from its own weights.
    let proxy = guard.stack()?.proxy.handle();
    if let Err(e) = proxy
        .sync_weights(&update, rollflash_rollout::PauseMode::Abort)
        .await
    {
        RunLearner::close(learner).await;
        return Err(e.into());
    }
    Ok(learner)
}

/// What to do after a learner failure, given the newest checkpoint.
fn resume_hint(checkpoint: Option<&Path>) -> String {
    match checkpoint {
        Some(c) => format!(
            "once the trainer is back, `--resume` continues from {} (its newest checkpoint)",
            c.display()
        ),
        None => "no checkpoint was written before it (set checkpoint.every to write some)".into(),
    }
}

/// RL with `learner`, the evaluation after it, the rollout's shutdown and the end of the run.
async fn rl<L: RunLearner>(
    plan: &RunPlan,
    opts: &RunOptions,
    guard: &mut RunGuard,
    prepared: Prepared,
    learner: L,
    eval_before: Option<EvalResult>,
    timeline: rollflash_rollout::Timeline,
) -> Result<TrainSummary, PipelineError> {
    let trained = train(plan, opts, guard, &prepared, learner, eval_before, timeline).await?;
    // A run that stopped early (the user asked; or no backend served its weights) is not
    // evaluated; it saves where it stopped so `--resume` continues from there.
    let eval_after = if trained.report.end != RunEnd::Completed {
        None
    } else {
        guard.live.set_phase("evaluation after RL");
        // Every step ran; a stop now only skips the evaluation.
        tokio::select! {
            e = evaluate_both(plan, guard.stack()?, plan.eval().problems, plan.eval().samples) => e,
            _ = opts.stop.stopped() => {
                println!("evaluation after RL skipped: stop requested");
                None
            }
        }
    };
    // Shut down here (not only in `close`) so that a failed shutdown is the run's error.
    guard.shutdown_rollout().await?;
    let out = finish(plan, prepared, trained, eval_before, eval_after).await;
    guard.live.set_phase("done");
    out
}

/// What runs beside a run: the Prometheus endpoint, the dashboard's view of it, and the
/// rollout stack (engines, proxy, servers' clients). [`RunGuard::close`] shuts all of them
/// down and is called on every return of [`run_plan`]; should a phase panic instead, `Drop`
/// stops the endpoint and the proxy's [`Drop`](rollflash_rollout::LlmProxy) aborts its task
/// and engines (mini-redis's drop guard).
struct RunGuard {
    prom: Option<PromServer>,
    /// What the endpoint serves, updated by the step sink.
    gauges: SharedGauges,
    live: rollflash_dashboard::Live,
    stack: Option<Stack>,
}

impl RunGuard {
    fn new(live: rollflash_dashboard::Live) -> Self {
        RunGuard {
            prom: None,
            gauges: Arc::default(),
            live,
            stack: None,
        }
    }

    /// The rollout stack; an error before [`start_rollout`] built it (a bug).
    fn stack(&self) -> Result<&Stack, PipelineError> {
        self.stack.as_ref().ok_or(PipelineError::NoStack)
    }

    /// Shuts the rollout stack down (the live view and the endpoint stop asking it first).
    async fn shutdown_rollout(&mut self) -> Result<(), PipelineError> {
        self.live.set_source(None);
        if let Some(p) = &self.prom {
            p.set_proxy(None);
        }
        if let Some(s) = self.stack.take() {
            s.proxy.shutdown().await?;
        }
        Ok(())
    }

    /// Stops everything still running.
    async fn close(&mut self) {
        if let Err(e) = self.shutdown_rollout().await {
            tracing::warn!(error = %rollflash_core::error_chain(&e), "rollout shutdown at the end of the run");
        }
        if let Some(p) = self.prom.take() {
            p.shutdown().await;
        }
    }
}

/// The run before its rollout starts: where it resumes from and its policy.
struct Prepared {
    resumed: Option<checkpoint::Loaded>,
    policy: Policy,
    /// Whether the weights LoRA trains on are the model directory's own (no warm-up changed
    /// them): then the final adapter can name that directory as its base.
    base_is_source: bool,
    ckpt_root: PathBuf,
}

/// The output folder, the Prometheus endpoint (up through the warm-up and the first
/// evaluation, with zero steps), the environment check, the policy (from a checkpoint when
/// resuming, past the warm-up), the warm-up, and the LoRA adapters over the result.
async fn prepare(
    plan: &RunPlan,
    opts: &mut RunOptions,
    guard: &mut RunGuard,
) -> Result<(Prepared, TrainableModel), PipelineError> {
    let out = plan.output();
    let device = &plan.placement().device;
    std::fs::create_dir_all(&out.dir).map_err(IoError::at(
        "cannot create output directory",
        out.dir.clone(),
    ))?;
    let ckpt_root = checkpoint::root(&out.dir);
    // Bars (the evaluations' and the steps') only where the config wants them.
    crate::progress::set_enabled(out.metrics.progress);
    if let Some(addr) = opts.metrics_addr.or(out.metrics.prometheus) {
        let s = PromServer::start(addr, Arc::clone(&guard.gauges), None)
            .await
            .map_err(|source| PipelineError::Prometheus {
                addr: addr.to_string(),
                source,
            })?;
        println!("prometheus metrics at http://{}/metrics", s.addr());
        if let Some(tx) = opts.metrics_bound.take() {
            let _ = tx.send(s.addr());
        }
        guard.prom = Some(s);
    }
    // An environment server that is down stops the run here, before the warm-up.
    if let Some(line) = stack::check_env(plan).await? {
        println!("{line}");
    }
    let resumed = match &opts.resume {
        Some(Resume::Latest) => Some(resume_latest(&ckpt_root, device)?),
        Some(Resume::Dir(d)) => Some(checkpoint::load(d, device)?),
        None => None,
    };
    let mut policy = Policy::load(plan)?;
    if let Some(r) = &resumed {
        take_resumed(plan, &ckpt_root, r, &mut policy)?;
    }
    let mut model = policy.trainable(plan)?;
    let mut base_is_source = resumed.is_none();
    if resumed.is_none() {
        guard.live.set_phase("warm-up");
        match stack::warm_up(plan, &policy, &mut model, &opts.stop).await? {
            WarmedUp::Unsupported { env } => println!(
                "warm-up: skipped (warm-up data exists for math and frozen_lake; env is `{env}`)"
            ),
            WarmedUp::Reused(dir) => {
                base_is_source = false;
                println!("warm-up: reused {}", dir.display())
            }
            WarmedUp::Ran { stale } => {
                base_is_source = false;
                if let Some(dir) = stale {
                    println!(
                        "warm-up: replaced {} (made by a build whose arithmetic differs from this one's)",
                        dir.display()
                    )
                }
            }
            WarmedUp::Skipped => {}
        }
    }
    // LoRA: the warmed-up (or resumed) weights become the frozen base of the adapters.
    let resumed_adapters = resumed
        .as_ref()
        .and_then(|r| r.embedded().ok())
        .and_then(|e| e.adapters.as_ref());
    if let Some(r) = &resumed {
        if plan.lora().is_some() && resumed_adapters.is_none() {
            return Err(stack::StackError::Lora(format!(
                "{} holds no adapters (a full fine-tuning run); resume it without [train.lora]",
                r.dir.display()
            ))
            .into());
        }
    }
    let model = stack::adapt(plan, &policy, model, resumed_adapters)?;
    Ok((
        Prepared {
            resumed,
            policy,
            base_is_source,
            ckpt_root,
        },
        model,
    ))
}

/// Checks a checkpoint against the plan (seed, data) and takes its weights; says what was
/// cleaned up or could not be verified.
fn take_resumed(
    plan: &RunPlan,
    ckpt_root: &Path,
    r: &checkpoint::Loaded,
    policy: &mut Policy,
) -> Result<(), PipelineError> {
    for p in checkpoint::clear_partial(ckpt_root) {
        println!(
            "removed {}: a checkpoint whose writing was cut short",
            p.display()
        );
    }
    if !r.verified {
        println!(
            "{}: written before checkpoints had checksums; not verified",
            r.dir.display()
        );
    }
    if r.state.seed != plan.seed() {
        return Err(PipelineError::SeedMismatch {
            dir: r.dir.clone(),
            checkpoint: r.state.seed,
            config: plan.seed(),
        });
    }
    check_data(plan, r)?;
    match plan.trainer() {
        TrainerPlan::Embedded => {
            let e = r.embedded()?;
            policy.model_cfg = e.model_cfg.clone();
            policy.weights = e.weights.clone();
        }
        // The weights are on the server; the local policy only tokenizes and evaluates.
        TrainerPlan::Tinker(_) => {
            r.tinker()?;
        }
    }
    println!(
        "resuming from {} (step {}, version {})",
        r.dir.display(),
        r.state.cursor.steps_done,
        r.state.cursor.version
    );
    if let Some(d) = &r.state.data {
        println!(
            "data: epoch {}, {} of {} rows given out; next {} {}",
            d.epoch, d.offset, d.epoch_len, d.next_file, d.next_row
        );
    }
    Ok(())
}

/// Builds the rollout stack into the guard, checks every server and gives it the starting
/// weights before anything is generated, and shows it to the dashboard and Prometheus.
/// Returns the dashboard's timeline (the proxy's and the trainer's bars).
async fn start_rollout(
    plan: &RunPlan,
    p: &Prepared,
    model: &TrainableModel,
    guard: &mut RunGuard,
) -> Result<rollflash_rollout::Timeline, PipelineError> {
    let start_version = p
        .resumed
        .as_ref()
        .map_or(PolicyVersion(0), |r| r.state.cursor.version);
    let timeline = crate::dashboard::timeline(&plan.output().dir, p.resumed.is_some())?;
    let hooks = stack::StackHooks {
        timeline: Some(timeline.clone()),
        ..Default::default()
    };
    let stack = guard.stack.insert(Stack::build_with(
        plan,
        &p.policy,
        model,
        start_version,
        &hooks,
    )?);
    stack.connect(&p.policy).await?;
    let proxy = stack.proxy.handle();
    guard
        .live
        .set_source(Some(Arc::new(crate::dashboard::ProxyLive(proxy.clone()))));
    if let Some(prom) = &guard.prom {
        prom.set_proxy(Some(proxy));
    }
    Ok(timeline)
}

/// What the RL phase left: the controller's report, the learner (at the last published
/// version), and the sink with its metrics file, checkpointer and TensorBoard writer.
struct Trained<L> {
    report: RunReport,
    learner: Option<L>,
    sink: RunSink,
}

/// What a run asks of its learner besides training: checkpoints and the final result. The
/// embedded learner writes weights and optimizer state; a Tinker learner saves its state on
/// the server and records where.
trait RunLearner: rollflash_trainer::Learner {
    /// Optimiser steps taken (for the checkpoint's state).
    fn optimizer_steps(&self) -> usize;
    /// ROLL's running reward statistics, when they are kept.
    fn running(&self) -> Option<rollflash_train::shaping::RunningMoments>;
    /// Writes a resumable checkpoint of `state`; returns where.
    fn checkpoint(
        &self,
        c: &Checkpointer,
        state: &checkpoint::CheckpointState,
        metrics: &Path,
    ) -> Result<PathBuf, PipelineError>;
    /// Writes the run's result to `dir` (`final/`).
    fn save_final(&self, plan: &RunPlan, p: &Prepared, dir: &Path) -> Result<(), PipelineError>;
    /// The weights it would publish now, for the periodic evaluation (`train.eval_every`);
    /// `None` where they are not in this process (a Tinker learner's).
    fn eval_weights(&self) -> Result<Option<Arc<Transformer>>, PipelineError>;
    /// Releases what the learner holds elsewhere once its result is saved (a Tinker
    /// server's model slot); a failure is logged, the run's result stands.
    async fn close(self);
}

impl RunLearner for PolicyLearner {
    fn optimizer_steps(&self) -> usize {
        self.optimizer().steps_taken()
    }
    fn running(&self) -> Option<rollflash_train::shaping::RunningMoments> {
        self.running_moments()
    }
    fn checkpoint(
        &self,
        c: &Checkpointer,
        state: &checkpoint::CheckpointState,
        metrics: &Path,
    ) -> Result<PathBuf, PipelineError> {
        Ok(c.save(checkpoint::Payload::Embedded(self), state, metrics)?)
    }
    fn save_final(&self, plan: &RunPlan, p: &Prepared, dir: &Path) -> Result<(), PipelineError> {
        save_final(plan, &p.policy, self.model(), dir, p.base_is_source)
    }
    fn eval_weights(&self) -> Result<Option<Arc<Transformer>>, PipelineError> {
        Ok(Some(Arc::new(
            self.model().snapshot().map_err(StackError::from)?,
        )))
    }
    async fn close(self) {}
}

impl RunLearner for rollflash_trainer::TinkerLearner {
    fn optimizer_steps(&self) -> usize {
        self.steps_taken()
    }
    fn running(&self) -> Option<rollflash_train::shaping::RunningMoments> {
        self.running_moments()
    }
    fn checkpoint(
        &self,
        c: &Checkpointer,
        state: &checkpoint::CheckpointState,
        metrics: &Path,
    ) -> Result<PathBuf, PipelineError> {
        let name = format!("step-{:08}", state.cursor.steps_done);
        let saved = save_tinker_state(self, &name)?;
        Ok(c.save(checkpoint::Payload::Tinker(&saved), state, metrics)?)
    }
    fn save_final(&self, _plan: &RunPlan, _p: &Prepared, dir: &Path) -> Result<(), PipelineError> {
        std::fs::create_dir_all(dir).map_err(IoError::at("cannot create", dir))?;
        write_tinker_state(self, "final", &dir.join("tinker.json"))
    }
    fn eval_weights(&self) -> Result<Option<Arc<Transformer>>, PipelineError> {
        Ok(None)
    }
    async fn close(self) {
        let url = self.url().to_string();
        if let Err(e) = rollflash_trainer::TinkerLearner::close(self).await {
            tracing::warn!(server = %url, error = %rollflash_core::error_chain(&e), "could not unload the trained model (the server frees it when the session expires)");
        }
    }
}

/// Saves a Tinker learner's state on its server under `name`; returns where (the server,
/// the model id, the state's `tinker://` path: what `load_state` takes).
fn save_tinker_state(
    l: &rollflash_trainer::TinkerLearner,
    name: &str,
) -> Result<checkpoint::TinkerSaved, PipelineError> {
    let state_path = tokio::task::block_in_place(|| l.save_state(name))?;
    Ok(checkpoint::TinkerSaved {
        server: l.url().to_string(),
        model_id: l.model_id().to_string(),
        state_path,
        optimizer_steps: l.steps_taken(),
    })
}

/// Saves a Tinker learner's state on its server under `name` and records where in `path`.
fn write_tinker_state(
    l: &rollflash_trainer::TinkerLearner,
    name: &str,
    path: &Path,
) -> Result<(), PipelineError> {
    let saved = save_tinker_state(l, name)?;
    let json = serde_json::to_string_pretty(&saved).unwrap_or_default();
    std::fs::write(path, format!("{json}\n")).map_err(|source| {
        PipelineError::Io(IoError::new("cannot write", path.to_path_buf(), source))
    })
}

/// The embedded learner, with the checkpoint's optimizer and running statistics when
/// resuming.
fn embedded_learner(
    plan: &RunPlan,
    p: &Prepared,
    model: TrainableModel,
) -> Result<PolicyLearner, PipelineError> {
    let mut learner = PolicyLearner::new(model, plan.learner().clone())?;
    if let Some(r) = &p.resumed {
        learner.set_optimizer(r.optimizer(plan.learner().optimizer.clone())?);
        // ROLL's running reward statistics continue where the checkpoint left them.
        match (
            r.state.reward_running,
            plan.learner().shaping.uses_running(),
        ) {
            (Some(m), true) => learner.set_running_moments(m.moments())?,
            (None, true) if r.state.cursor.steps_done > 0 => eprintln!(
                "checkpoint {} holds no running reward statistics (running normalisation \
                 was off when it was written); they start afresh",
                r.dir.display()
            ),
            _ => {}
        }
    }
    Ok(learner)
}

/// The RL phase: metrics (the file, with the resumed checkpoint's records first; the progress
/// bar; TensorBoard), the learner (with the checkpoint's optimizer and running statistics),
/// and the controller over the guard's stack.
async fn train<L: RunLearner>(
    plan: &RunPlan,
    opts: &RunOptions,
    guard: &RunGuard,
    p: &Prepared,
    learner: L,
    eval_before: Option<EvalResult>,
    timeline: rollflash_rollout::Timeline,
) -> Result<Trained<L>, PipelineError> {
    let resumed = p.resumed.as_ref();
    let rollout = guard.stack()?;
    let mut sink = RunSink::open(plan, p, Arc::clone(&guard.gauges), eval_before)?;
    let mut ctl = AsyncController::new(
        plan.controller().clone(),
        rollout.proxy.handle(),
        rollout.envs.clone(),
        Arc::clone(&rollout.make),
        rollout.version.clone(),
        learner,
    )?
    .with_success_threshold(plan.success_threshold())
    .with_stop(opts.stop.clone())
    .with_timeline(timeline);
    if let Some(r) = resumed {
        ctl = ctl.resume_from(ResumeFrom {
            cursor: r.state.cursor,
            accounting: r.state.accounting,
        });
    }
    let outcome = ctl.run_with_sink(&mut sink).await;
    sink.progress.finish();
    let (report, learner) = match outcome {
        Ok(o) => o,
        Err(source @ rollflash_trainer::ControllerError::Learner(_)) => {
            return Err(PipelineError::LearnerFailed {
                source: Box::new(source),
                checkpoint: checkpoint::latest(&p.ckpt_root).ok(),
            })
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Trained {
        report,
        learner,
        sink,
    })
}

/// The end of a run: the evaluation after RL in TensorBoard, the final weights (unless
/// `checkpoint.final = false`; for a run that stopped early, the resumable checkpoint of where
/// it stopped, always), `summary.json`, the report, and the run's end as its result.
// Long by design: the end of a run is one ordered sequence (TensorBoard, weights, summary,
// report, result), each step depending on what the one before wrote.
async fn finish<L: RunLearner>(
    plan: &RunPlan,
    p: Prepared,
    t: Trained<L>,
    eval_before: Option<EvalResult>,
    eval_after: Option<EvalResult>,
) -> Result<TrainSummary, PipelineError> {
    let out = plan.output();
    let Trained {
        report,
        learner,
        mut sink,
    } = t;
    // The evaluation after RL at the step after the last: the policy every step trained.
    if let (Some(tb), Some(e)) = (sink.tensorboard.as_mut(), &eval_after) {
        tb.scalars(
            report.cursor.steps_done as u64,
            crate::tensorboard::unix_now(),
            &crate::tensorboard::eval_scalars(e),
        )?;
    }
    let saved = if report.end != RunEnd::Completed {
        // Always, whatever `checkpoint.final` says: it is what `--resume` continues from.
        let c = match sink.checkpointer.take() {
            Some(c) => c,
            None => Checkpointer::new(
                p.ckpt_root.clone(),
                out.checkpoint.keep,
                p.policy.model_cfg.clone(),
                Arc::clone(&p.policy.tokenizer),
            ),
        };
        Some(match &learner {
            Some(l) => {
                let state = checkpoint::state(
                    report.cursor,
                    report.accounting,
                    l.optimizer_steps(),
                    plan.seed(),
                    sink.elapsed_before + report.wall.as_secs_f64(),
                    eval_before,
                )
                .with_data(data_cursor(sink.data.as_ref(), report.cursor))
                .with_running(l.running());
                match l.checkpoint(&c, &state, sink.log.path()) {
                    Ok(dir) => dir,
                    // A trainer server that went down cannot save where the run stopped; the
                    // newest checkpoint written before is where a resume continues.
                    Err(e) => match checkpoint::latest(&p.ckpt_root) {
                        Ok(older) => {
                            eprintln!(
                                "the checkpoint of step {} could not be written ({}); the \
                                 newest one is {}",
                                report.cursor.steps_done,
                                rollflash_core::error_chain(&e),
                                older.display()
                            );
                            older
                        }
                        Err(_) => return Err(e),
                    },
                }
            }
            None => p.ckpt_root.clone(),
        })
    } else if out.checkpoint.save_final {
        let final_dir = out.dir.join("final");
        if let Some(l) = &learner {
            l.save_final(plan, &p, &final_dir)?;
        }
        Some(final_dir)
    } else {
        None
    };
    if let Some(l) = learner {
        l.close().await;
    }
    crate::report::write_summary(
        &out.dir,
        &RunSummary {
            env: plan.env().name().to_string(),
            alpha: plan.alpha(),
            sync: plan.sync(),
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
    let report_path = if out.metrics.report {
        Some(crate::report::write(&out.dir)?)
    } else {
        None
    };
    match report.end {
        RunEnd::Stalled { version, waited } => {
            return Err(PipelineError::Stalled {
                version,
                waited_s: waited.as_secs_f64(),
                checkpoint: stopped_at(saved, &p),
            })
        }
        RunEnd::NoProgress {
            version,
            waited,
            running,
            failed,
            filtered,
        } => {
            return Err(PipelineError::NoProgress {
                version,
                waited_s: waited.as_secs_f64(),
                running,
                failed,
                filtered,
                checkpoint: stopped_at(saved, &p),
            })
        }
        RunEnd::Completed | RunEnd::Interrupted => {}
    }
    Ok(TrainSummary {
        eval_before,
        eval_after,
        interrupted: report.interrupted,
        report,
        checkpoint: saved,
        resumed_from: p.resumed.map(|r| r.dir),
        report_path,
    })
}

/// Where a run that did not complete left its resumable checkpoint: always written (see
/// [`finish`]), so the fallback, the checkpoint folder, is only a name to report.
fn stopped_at(saved: Option<PathBuf>, p: &Prepared) -> PathBuf {
    saved.unwrap_or_else(|| p.ckpt_root.clone())
}

/// The newest intact checkpoint under `root`. Newer ones that fail their checksums (or do
/// not read back) are named, moved aside, and passed over.
fn resume_latest(
    root: &Path,
    device: &candle_core::Device,
) -> Result<checkpoint::Loaded, PipelineError> {
    let (loaded, refused) = checkpoint::load_latest(root, device)?;
    for r in refused {
        let aside = checkpoint::set_aside(&r.dir)?;
        println!(
            "checkpoint {} refused: {}; moved to {}; falling back to {}",
            r.dir.display(),
            r.error,
            aside.display(),
            loaded.dir.display()
        );
    }
    Ok(loaded)
}

/// Opens the run's TensorBoard event file under `output_dir/tensorboard/`. A fresh run
/// removes an earlier run's files there (as it truncates `metrics.jsonl`); a resumed one cuts
/// them back to the steps before its checkpoint (as `metrics.jsonl` drops later records), so
/// no step is in two files. Both say what they removed.
fn open_tensorboard(
    output_dir: &Path,
    resumed: bool,
    done_before: usize,
) -> Result<crate::tensorboard::EventWriter, PipelineError> {
    let dir = output_dir.join(crate::tensorboard::DIR);
    if resumed {
        let n = crate::tensorboard::drop_steps_from(&dir, done_before as u64)?;
        if n > 0 {
            println!(
                "tensorboard: {n} event(s) from step {done_before} on dropped (written after \
                 the checkpoint; the resumed run writes its own)"
            );
        }
    } else {
        let n = crate::tensorboard::remove_all(&dir)?;
        if n > 0 {
            println!(
                "tensorboard: removed {n} event file(s) of an earlier run in {}",
                dir.display()
            );
        }
    }
    let w = crate::tensorboard::EventWriter::create(&dir)?;
    println!(
        "tensorboard events in {} (watch with: tensorboard --logdir {})",
        w.path().display(),
        dir.display()
    );
    Ok(w)
}

/// What the run does with each published step: append it to `metrics.jsonl` (and, when
/// asked, the TensorBoard event file), move the progress bar, update the Prometheus gauges,
/// and write a checkpoint every `every` steps.
struct RunSink {
    log: MetricsLog,
    /// `metrics.tensorboard`: the same record as scalars.
    tensorboard: Option<crate::tensorboard::EventWriter>,
    progress: Progress,
    gauges: SharedGauges,
    checkpointer: Option<Checkpointer>,
    every: usize,
    seed: u64,
    /// Wall time of earlier processes of this run (resumes).
    elapsed_before: f64,
    eval_before: Option<EvalResult>,
    /// The dataset task, whose cursor each checkpoint saves.
    data: Option<rollflash_env::envs::DatasetTaskConfig>,
    on_checkpoint_error: OnCheckpointError,
    /// Checkpoints not written under `checkpoint.on_error = "continue"`.
    checkpoints_skipped: usize,
    /// A few trajectories of each batch, for the dashboard.
    trajectories: crate::dashboard::TrajectorySampler,
    /// Mean and longest response of the batch of the step being published.
    lengths: Option<(f64, usize)>,
    /// The batch's reward verdict counts and extra metrics (`crate::verdicts`), for its line.
    verdicts: Vec<(String, f64)>,
    /// `train.eval_every`: what evaluates a published policy mid-run.
    periodic: Option<PeriodicEval>,
}

/// The periodic held-out evaluation (`train.eval_every`): every `every` steps but the last
/// (the evaluation after RL covers that one), the policy just published, greedy, on the
/// same tasks as the evaluations before and after RL, on an engine of its own
/// ([`Stack::probe`]).
struct PeriodicEval {
    plan: RunPlan,
    policy: Policy,
    every: usize,
}

impl PeriodicEval {
    fn new(plan: &RunPlan, policy: &Policy) -> Option<PeriodicEval> {
        let every = plan.eval().every;
        (every > 0).then(|| PeriodicEval {
            plan: plan.clone(),
            policy: policy.clone(),
            every,
        })
    }

    fn due(&self, steps_done: usize) -> bool {
        steps_done.is_multiple_of(self.every) && steps_done < self.plan.controller().core.steps
    }

    /// Evaluates `model` as `version`; blocks the controller's task meanwhile (the rollouts
    /// in flight go on), so the number is of exactly that version.
    fn run<L: RunLearner>(
        &self,
        learner: &L,
        version: PolicyVersion,
    ) -> Result<Option<EvalResult>, PipelineError> {
        let Some(model) = learner.eval_weights()? else {
            return Ok(None);
        };
        let n = self.plan.eval().problems;
        let probe = Stack::probe(&self.plan, &self.policy, model, version, n)?;
        let threshold = self.plan.success_threshold();
        let fut = async move {
            let e = evaluate(&probe.eval_envs, &probe.eval_make, n, threshold).await;
            if let Err(err) = probe.shutdown().await {
                tracing::warn!(error = %rollflash_core::error_chain(&err), "periodic evaluation: its engine did not stop cleanly");
            }
            e
        };
        match block_on_here(fut) {
            Some(e) => Ok(e),
            None => {
                // Only a thread or runtime that cannot be made (no memory) lands here.
                tracing::warn!(%version, "periodic evaluation skipped: no thread or runtime to run it on");
                Ok(None)
            }
        }
    }
}

/// Runs `fut` to completion from synchronous code inside the runtime: in place on a
/// multi-threaded runtime, else on a thread of its own with its own runtime (a
/// current-thread runtime cannot block in place); `None` if that thread or runtime could
/// not be made.
fn block_on_here<F>(fut: F) -> Option<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    let handle = tokio::runtime::Handle::current();
    if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
        return Some(tokio::task::block_in_place(|| handle.block_on(fut)));
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(fut))
        })
        .join()
    })
    .ok()
    .and_then(Result::ok)
}

impl RunSink {
    /// The sink of a run: `metrics.jsonl` (a resumed run's records first, later ones dropped
    /// and counted), the progress bar, TensorBoard (with the evaluation before RL at step 0),
    /// the checkpointer and the dashboard's trajectory sampler.
    fn open(
        plan: &RunPlan,
        p: &Prepared,
        gauges: SharedGauges,
        eval_before: Option<EvalResult>,
    ) -> Result<RunSink, PipelineError> {
        let out = plan.output();
        let resumed = p.resumed.as_ref();
        let metrics_path = out.dir.join("metrics.jsonl");
        let prefix = resumed.map(|r| r.metrics.clone()).unwrap_or_default();
        if let Some(r) = resumed {
            // Steps after the checkpoint (and a line cut short by a kill) are replaced by the
            // resumed run's own; say how many.
            let had = crate::metrics::count_lines(&metrics_path);
            if had > prefix.len() {
                println!(
                    "metrics.jsonl: {} record(s) after step {} dropped (written after the \
                     checkpoint; the resumed run writes its own)",
                    had - prefix.len(),
                    r.state.cursor.steps_done
                );
            }
        }
        let log = MetricsLog::create(&metrics_path, &prefix)?;
        let done_before = resumed.map_or(0, |r| r.state.cursor.steps_done);
        let progress = Progress::new(
            plan.controller().core.steps,
            done_before,
            out.metrics.progress,
        );
        let tensorboard = if out.metrics.tensorboard {
            let mut w = open_tensorboard(&out.dir, resumed.is_some(), done_before)?;
            // The evaluation before RL at step 0, beside the first step's rollouts of the same
            // policy; a resumed run's is in the file it continues (unless it resumes at 0).
            if let (0, Some(e)) = (done_before, &eval_before) {
                w.scalars(
                    0,
                    crate::tensorboard::unix_now(),
                    &crate::tensorboard::eval_scalars(e),
                )?;
            }
            Some(w)
        } else {
            None
        };
        let ck = out.checkpoint;
        let checkpointer = (ck.every > 0).then(|| {
            Checkpointer::new(
                p.ckpt_root.clone(),
                ck.keep,
                p.policy.model_cfg.clone(),
                Arc::clone(&p.policy.tokenizer),
            )
        });
        Ok(RunSink {
            log,
            progress,
            gauges,
            checkpointer,
            every: ck.every,
            seed: plan.seed(),
            elapsed_before: resumed.map_or(0.0, |r| r.state.elapsed_s),
            eval_before,
            data: plan.data().cloned(),
            on_checkpoint_error: ck.on_error,
            checkpoints_skipped: 0,
            tensorboard,
            trajectories: crate::dashboard::TrajectorySampler::create(
                &out.dir,
                resumed.is_some(),
                plan.dashboard().trajectories_per_step,
                plan.dashboard().trajectories_max_bytes,
                Arc::clone(&p.policy.tokenizer),
            )?,
            lengths: None,
            verdicts: Vec::new(),
            periodic: PeriodicEval::new(plan, &p.policy),
        })
    }
}

/// The data cursor at `cursor` of a dataset run (`None` for generated tasks). The data was
/// loaded and checked at config load, so this cannot fail in practice; if it did, the
/// checkpoint is still written without one (a resume then refuses it, naming why).
fn data_cursor(
    data: Option<&rollflash_env::envs::DatasetTaskConfig>,
    cursor: Cursor,
) -> Option<rollflash_env::envs::dataset_task::DataCursor> {
    data.and_then(|d| d.cursor(cursor.next_seed).ok())
}

/// Refuses a resume whose data is not the checkpoint's: the dataset cursor must match the
/// config's at the checkpoint's next task seed, and a dataset run resumes only a dataset
/// checkpoint (and the other way round).
fn check_data(plan: &RunPlan, r: &checkpoint::Loaded) -> Result<(), PipelineError> {
    let mismatch = |reason: String, source| PipelineError::DataMismatch {
        dir: r.dir.clone(),
        reason,
        source,
    };
    match (plan.data(), &r.state.data) {
        (None, None) => Ok(()),
        (Some(d), Some(saved)) => d
            .check_resume(saved, r.state.cursor.next_seed)
            .map_err(|e| mismatch(e.to_string(), Some(Box::new(e)))),
        (Some(_), None) => Err(mismatch(
            "it has no data cursor (written by a run of a generated task, or before \
             checkpoints saved one); resume it with its own config"
                .into(),
            None,
        )),
        (None, Some(saved)) => Err(mismatch(
            format!(
                "it was written by a dataset run (next row {} {}); this config's task is `{}`",
                saved.next_file,
                saved.next_row,
                plan.env().name()
            ),
            None,
        )),
    }
}

impl<L: RunLearner> StepSink<L> for RunSink {
    fn on_step(
        &mut self,
        record: &StepRecord,
        learner: &L,
        cursor: Cursor,
    ) -> Result<(), SinkError> {
        let mut json = crate::metrics::step_json(record, self.elapsed_before);
        if let Some((mean, max)) = self.lengths.take() {
            json["response_len_mean"] = serde_json::json!(mean);
            json["response_len_max"] = serde_json::json!(max);
        }
        for (k, v) in std::mem::take(&mut self.verdicts) {
            json[k] = serde_json::json!(v);
        }
        if let Some(pe) = self.periodic.as_ref().filter(|p| p.due(cursor.steps_done)) {
            let e = pe
                .run(learner, record.version.next())
                .map_err(|e| SinkError::new("periodic evaluation", e))?;
            if let Some(e) = e {
                json["eval_greedy"] = serde_json::json!(e.success_rate);
                json["eval_mean_reward"] = serde_json::json!(e.mean_reward);
                if let Some(f) = e.format_free {
                    json["eval_format_free"] = serde_json::json!(f);
                }
            }
        }
        self.log
            .append(&json)
            .map_err(|e| SinkError::new("metrics", e))?;
        if let Some(tb) = &mut self.tensorboard {
            tb.scalars(
                record.step as u64,
                crate::tensorboard::unix_now(),
                &crate::tensorboard::step_scalars(&json),
            )
            .map_err(|e| SinkError::new("tensorboard", e))?;
        }
        self.progress.step(record);
        if let Ok(mut g) = self.gauges.lock() {
            g.update(record);
        }
        if let Some(c) = &self.checkpointer {
            if self.every > 0 && cursor.steps_done.is_multiple_of(self.every) {
                let state = checkpoint::state(
                    cursor,
                    record.accounting,
                    learner.optimizer_steps(),
                    self.seed,
                    self.elapsed_before + record.elapsed.as_secs_f64(),
                    self.eval_before,
                )
                .with_data(data_cursor(self.data.as_ref(), cursor))
                .with_running(learner.running());
                match learner.checkpoint(c, &state, self.log.path()) {
                    Ok(dir) => tracing::info!(path = %dir.display(), "checkpoint"),
                    Err(e) if self.on_checkpoint_error == OnCheckpointError::Continue => {
                        self.checkpoints_skipped += 1;
                        eprintln!(
                            "checkpoint at step {} not written: {}; continuing without it \
                             (checkpoint.on_error = \"continue\"; {} skipped so far)",
                            cursor.steps_done,
                            rollflash_core::error_chain(&e),
                            self.checkpoints_skipped
                        );
                    }
                    Err(e) => return Err(SinkError::new("checkpoint", e)),
                }
            }
        }
        Ok(())
    }

    fn on_batch(
        &mut self,
        step: usize,
        batch: &rollflash_core::buffer::Batch<rollflash_core::Trajectory>,
    ) -> Result<(), SinkError> {
        self.lengths = Some(crate::dashboard::response_lengths(batch));
        self.verdicts = crate::verdicts::batch_verdicts(batch);
        self.trajectories
            .save(step, batch)
            .map_err(|e| SinkError::new("trajectories", e))
    }
}

/// Greedy evaluation over `problems` held-out tasks, and sampled pass@1 over `samples` per
/// task at the rollout temperature when `samples` > 0.
async fn evaluate_both(
    plan: &RunPlan,
    rollout: &Stack,
    problems: usize,
    samples: usize,
) -> Option<EvalResult> {
    let mut e = evaluate(
        &rollout.eval_envs,
        &rollout.eval_make,
        problems,
        plan.success_threshold(),
    )
    .await?;
    e.sampled = evaluate_sampled(
        &rollout.envs,
        &rollout.eval_make,
        problems,
        samples,
        plan.eval().temperature,
        plan.success_threshold(),
    )
    .await;
    Some(e)
}

/// Greedy held-out evaluation of the checkpoint in `dir` (a `final/` or `step-N/`
/// directory, or any Hugging Face directory of the configured model's family) on the task
/// `plan` describes, over `problems` tasks; with `samples` > 0 also its sampled pass@1 over
/// `samples` trajectories per task at the rollout temperature (as `train.eval_samples`).
pub async fn evaluate_checkpoint(
    plan: &RunPlan,
    dir: &Path,
    problems: usize,
    samples: usize,
) -> Result<EvalResult, PipelineError> {
    // Its samplers would answer with the server's base model, not the checkpoint's weights.
    if matches!(plan.trainer(), TrainerPlan::Tinker(_)) {
        return Err(PipelineError::Unsupported(
            "rollflash eval of a Tinker run (its weights live on the server; sample them there)"
                .into(),
        ));
    }
    stack::check_env(plan).await?;
    let policy = Policy::from_checkpoint(plan, dir)?;
    let mut model = policy.trainable(plan)?;
    // A LoRA checkpoint: its weights are the base, its PEFT adapter goes on top.
    if rollflash_model::lora::has_peft(dir) {
        let a = rollflash_model::lora::load_peft(dir, &plan.placement().device)?;
        model = TrainableModel::with_lora(
            &policy.model_cfg,
            &model.weights(),
            &a.config,
            Some(&a.weights),
            0,
            plan.placement().dtype,
            &plan.placement().device,
        )?;
    }
    let rollout = Stack::build(plan, &policy, &model, PolicyVersion(0))?;
    rollout.connect(&policy).await?;
    let out = evaluate_both(plan, &rollout, problems.max(1), samples).await;
    rollout.proxy.shutdown().await?;
    out.ok_or(PipelineError::NoProblems)
}

/// `final/`: the trained policy as a plain Hugging Face directory. With LoRA that is the base
/// with the adapters merged in (what `eval`, `serve` and any server load), and the adapter in
/// PEFT's layout under `final/adapter/`, whose base is the model directory when the adapters
/// were trained on its weights as they are, else the frozen base written to `final/base/`.
fn save_final(
    plan: &RunPlan,
    policy: &Policy,
    model: &TrainableModel,
    dir: &Path,
    base_is_source: bool,
) -> Result<(), PipelineError> {
    let tok = Some(policy.tokenizer.as_ref());
    let Some(adapters) = model.adapters() else {
        rollflash_model::hf::save_dir(dir, &policy.model_cfg, &model.weights(), tok)?;
        return Ok(());
    };
    let merged = model.model().merged_weights()?;
    rollflash_model::hf::save_dir(dir, &policy.model_cfg, &merged, tok)?;
    let base = match plan.model() {
        ModelSource::Dir(d) if base_is_source => d.clone(),
        _ => {
            let b = dir.join("base");
            rollflash_model::hf::save_dir(&b, &policy.model_cfg, &model.weights(), tok)?;
            b
        }
    };
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PipelineError::Io(IoError::new("cannot write the adapter to", path, source))
    };
    let base = std::path::absolute(&base).map_err(io(&base))?;
    let adapter_dir = dir.join("adapter");
    std::fs::create_dir_all(&adapter_dir).map_err(io(&adapter_dir))?;
    rollflash_model::lora::save_peft(&adapter_dir, adapters, &base.to_string_lossy())?;
    Ok(())
}
