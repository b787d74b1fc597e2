//! `AsyncController`: the driver of `rollflash_core::controller::ControllerCore` with real
//! tasks. The core decides (which groups start, when a step trains, sync, publication, the
//! end); this file carries the decisions out — each group's rollout in its own task, each
//! training step on a blocking thread, each weight sync through the proxy (pause → update
//! every backend → resume) — and reports back what happened, with the time since the run
//! started as the core's clock. With α = 0 and the barrier on, the same loop is the
//! synchronous baseline.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use rollflash_core::buffer::{Accounting, Batch, BufferConfig, BufferConfigError, GroupOutcome};
use rollflash_core::controller::{
    ControllerCore, CoreAction, CoreEvent, PublishedStep, RunEnd, Waiting,
};
use rollflash_core::timeline::{EventKind, TimelineEvent, TRAINER_LANE};
use rollflash_core::{PauseMode, PolicyVersion, Trajectory};
use rollflash_rollout::{
    EnvFactory, EnvManager, GroupResult, ProxyError, ProxyHandle, ProxyMetrics, SyncTimings,
    Timeline, WeightUpdate,
};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use rollflash_core::controller::{CoreConfig, Cursor, ResumeFrom};

use crate::StopFlag;

/// What one training step reports.
#[derive(Debug, Clone, Default)]
pub struct StepStats {
    pub loss: f64,
    /// Free-form named metrics (KL, entropy, clip fraction…).
    pub metrics: Vec<(String, f64)>,
    /// The train–inference mismatch (`behav_kl`: mean behaviour − proximal log-prob over
    /// response tokens) of each backend's tokens, by backend name, where the batch says
    /// which backend generated them.
    pub behav_kl_by_backend: Vec<(String, f64)>,
}

/// The training side, as the controller sees it: one step on a batch, returning the new
/// weights to publish. Runs on a blocking thread (it is CPU-bound).
pub trait Learner: Send + 'static {
    /// Trains on `batch` (whose `version` is the policy it starts from) and returns the
    /// weights of version `batch.version + 1`.
    fn train(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError>;

    /// How often the controller lets the learner look after its trainer while it waits for
    /// a batch ([`Learner::idle`]); `None` (the default): never.
    fn idle_every(&self) -> Option<Duration> {
        None
    }

    /// Called every [`Learner::idle_every`] while the learner waits for a batch (on a
    /// blocking thread; a batch that becomes ready meanwhile waits for it). A learner whose
    /// trainer lives elsewhere checks it here: one whose server lost the model (restarted)
    /// rebuilds it from its saved state and returns the weights of the version it last
    /// published, now found elsewhere, for the controller to give the fleet in place of
    /// the lost ones. It must be the same version; the controller checks. An error stops
    /// the run as a failed step does.
    fn idle(&mut self) -> Result<Option<WeightUpdate>, LearnerError> {
        Ok(None)
    }
}

/// A training step failed.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    #[error("training step: tensor operation failed")]
    Tensor(#[from] candle_core::Error),
    #[error("training step: model")]
    Model(#[from] rollflash_model::ModelError),
    #[error("training step: loss or advantages")]
    Train(#[from] rollflash_train::TrainError),
    #[error("training step: thread pool")]
    ThreadPool(#[from] rayon::ThreadPoolBuildError),
    /// The batch's token, mask and log-prob counts disagree.
    #[error(
        "training step: batch has {tokens} tokens but {mask} mask and {logprobs} log-prob entries"
    )]
    Layout {
        tokens: usize,
        mask: usize,
        logprobs: usize,
    },
    /// Another learner's failure.
    #[error("training step failed")]
    Other(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl LearnerError {
    /// A failure described by a message (for learners outside this crate).
    pub fn other(message: impl Into<String>) -> Self {
        LearnerError::Other(message.into().into())
    }
}

/// A step observer (metrics, checkpoints) failed; the run stops rather than lose them.
#[derive(Debug, thiserror::Error)]
#[error("step observer failed: {message}")]
pub struct SinkError {
    pub message: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl SinkError {
    /// An error with a message and the error that caused it.
    pub fn new(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        SinkError {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}

/// Sees every step as it is published, with the learner at the new version: writes
/// metrics, shows progress, saves checkpoints. Runs on the controller's task, between
/// steps; keep it short.
pub trait StepSink<L>: Send {
    /// One step was published.
    fn on_step(
        &mut self,
        record: &StepRecord,
        learner: &L,
        cursor: Cursor,
    ) -> Result<(), SinkError>;

    /// The batch of step `step` was trained on (called just before its `on_step`): for
    /// sinks that keep samples of what the model wrote. Does nothing unless overridden.
    fn on_batch(&mut self, _step: usize, _batch: &Batch<Trajectory>) -> Result<(), SinkError> {
        Ok(())
    }
}

/// A sink that does nothing.
#[derive(Debug, Default)]
pub struct NoSink;

impl<L> StepSink<L> for NoSink {
    fn on_step(&mut self, _: &StepRecord, _: &L, _: Cursor) -> Result<(), SinkError> {
        Ok(())
    }
}

/// The rollout plane as the controller sees it: one group's rollout from a task seed.
#[async_trait]
pub trait GroupRunner: Send + Sync + 'static {
    /// Runs `group_size + redundancy` trajectories of the task `seed` and keeps the first
    /// `group_size` usable ones.
    async fn run_group(&self, seed: u64, group_size: usize, redundancy: usize) -> GroupResult;
}

/// Groups rolled out by an [`EnvManager`] over environments from a factory.
#[derive(Clone)]
pub struct EnvGroups {
    pub envs: EnvManager,
    pub make_env: EnvFactory,
}

#[async_trait]
impl GroupRunner for EnvGroups {
    async fn run_group(&self, seed: u64, group_size: usize, redundancy: usize) -> GroupResult {
        self.envs
            .run_group(Arc::clone(&self.make_env), seed, group_size, redundancy)
            .await
    }
}

/// Why the controller stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Learner(#[from] LearnerError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("invalid controller config")]
    Config(#[from] BufferConfigError),
    #[error("training task panicked: {0}")]
    Panicked(String),
    /// No backend served the current weights for the configured time: every one failed to
    /// load them, or every one went down.
    #[error(
        "no backend has served policy {version} for {:.0} s \
         (controller.serve_timeout_secs): every backend failed to load it or went down",
        waited.as_secs_f64()
    )]
    Stalled {
        version: PolicyVersion,
        waited: Duration,
    },
    /// Between steps no group added a sample to the buffer for the configured time.
    #[error(
        "no progress for {:.0} s at policy {version} (controller.progress_timeout_secs): \
         no group added a sample to the buffer; {failed} samples failed and {filtered} were \
         filtered out in that time, {running} are still running",
        waited.as_secs_f64()
    )]
    NoProgress {
        version: PolicyVersion,
        waited: Duration,
        running: u64,
        failed: u64,
        filtered: u64,
    },
    /// The learner published weights under another version than the controller decided
    /// (the batch's version + 1): a learner bug, or a remote trainer out of step with the
    /// run. Stopping keeps the buffer's versions and the backends' from splitting.
    #[error(
        "the learner returned weights of policy {learner}, the controller expected {expected}"
    )]
    VersionMismatch {
        expected: PolicyVersion,
        learner: PolicyVersion,
    },
    /// Nothing was running and nothing could start: a bug, reported instead of a hang.
    #[error("the controller has nothing to wait for ({running} groups running, no step training, {buffered} samples buffered)")]
    Stuck { running: usize, buffered: u64 },
}

/// Settings of the controller loop: the core's ([`CoreConfig`]: buffer, redundancy, steps,
/// seed, the serve and progress deadlines), and what only this driver uses. The core's
/// settings are held whole, so each has one home.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// What the core decides by: admission, α, filtering, barrier, redundancy, steps, the
    /// first task seed, and how long the run goes on unserved or without progress.
    pub core: CoreConfig,
    /// How in-flight requests are treated during a weight sync.
    pub pause_mode: PauseMode,
    /// With no step published for this long, say what the run waits on ([`StallReport`]),
    /// and again every such interval; `None` never does.
    pub stall_report: Option<Duration>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            core: CoreConfig {
                buffer: BufferConfig::default(),
                redundancy: 0,
                steps: 1,
                seed: 0,
                serve_timeout: DEFAULT_SERVE_TIMEOUT,
                progress_timeout: DEFAULT_PROGRESS_TIMEOUT,
            },
            pause_mode: PauseMode::default(),
            stall_report: Some(DEFAULT_STALL_REPORT),
        }
    }
}

/// The default of [`ControllerConfig::stall_report`]: a step of the built-in run takes
/// seconds, of SmolLM2 on this CPU under a minute.
pub const DEFAULT_STALL_REPORT: Duration = Duration::from_secs(120);

/// How many [`StallReport`]s a [`RunReport`] keeps (each is also logged).
const STALL_REPORTS_KEPT: usize = 32;

/// What a run waited on when no step had been published for
/// [`ControllerConfig::stall_report`]: logged as a warning, and kept in the [`RunReport`].
#[derive(Debug, Clone)]
pub struct StallReport {
    /// Since the run started.
    pub at: Duration,
    /// Since the last published step (or the start).
    pub since_step: Duration,
    pub steps_done: usize,
    pub waiting: Waiting,
    pub accounting: Accounting,
    /// The proxy's queue and backends, if it answered within [`STALL_PROXY_DEADLINE`].
    pub proxy: Option<ProxyMetrics>,
}

/// How long a stall report waits for the proxy's metrics (a wedged proxy is itself news).
pub const STALL_PROXY_DEADLINE: Duration = Duration::from_secs(2);

impl std::fmt::Display for StallReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no step published for {:.0} s ({} steps done): ",
            self.since_step.as_secs_f64(),
            self.steps_done
        )?;
        match &self.waiting {
            Waiting::Batch {
                ready_groups,
                groups_per_batch,
                running_groups,
                admissible,
            } => write!(
                f,
                "the trainer waits for a batch ({ready_groups} of {groups_per_batch} groups \
                 ready, {running_groups} rolling out, {admissible} more may start)"
            )?,
            Waiting::Training { version, for_ } => write!(
                f,
                "the trainer is training from {version} (for {:.0} s)",
                for_.as_secs_f64()
            )?,
            Waiting::Sync { version, for_ } => write!(
                f,
                "the weight sync of {version} waits on the backends (for {:.0} s)",
                for_.as_secs_f64()
            )?,
            Waiting::Unserved {
                version,
                for_,
                timeout,
            } => write!(
                f,
                "no backend serves {version} (for {:.0} s of {:.0} s before the run stops)",
                for_.as_secs_f64(),
                timeout.as_secs_f64()
            )?,
            Waiting::Stopping => write!(f, "stopping")?,
            Waiting::Done => write!(f, "done")?,
        }
        match &self.proxy {
            Some(p) => {
                write!(f, "; proxy: {} queued", p.queue_depth)?;
                if let Some(mode) = p.paused {
                    write!(f, " (paused, {mode:?})")?;
                }
                for (name, running, up) in &p.backends {
                    let state = if *up {
                        "in rotation"
                    } else {
                        "OUT of rotation"
                    };
                    write!(f, "; {name}: {running} running, {state}")?;
                }
            }
            None => write!(
                f,
                "; the proxy did not answer within {:.0} s",
                STALL_PROXY_DEADLINE.as_secs_f64()
            )?,
        }
        let a = self.accounting;
        write!(
            f,
            "; samples: {} trained, {} failed, {} filtered, {} aborted, {} running, {} buffered",
            a.trained, a.failed, a.filtered, a.aborted, a.running, a.buffered
        )
    }
}

/// The default of [`CoreConfig::progress_timeout`] in [`ControllerConfig`]: far above a batch's rollout on
/// this CPU (seconds to a minute), short enough that a run failing every trajectory stops
/// within the hour.
pub const DEFAULT_PROGRESS_TIMEOUT: Duration = Duration::from_secs(1800);

/// The default of [`CoreConfig::serve_timeout`] in [`ControllerConfig`]: long enough for a restarted server
/// to come back and load a checkpoint, short enough that a broken fleet is noticed.
pub const DEFAULT_SERVE_TIMEOUT: Duration = Duration::from_secs(300);

/// How often the controller asks the proxy whether a backend serves the newest weights
/// while none does (a message to the proxy task: cheap).
const SERVING_PROBE: Duration = Duration::from_millis(250);

/// What happened in one step, for logs, metrics and benchmarks.
#[derive(Debug, Clone)]
pub struct StepRecord {
    pub step: usize,
    /// The version the step trained from.
    pub version: PolicyVersion,
    pub samples: usize,
    /// Model tokens trained on.
    pub tokens: usize,
    pub mean_reward: f64,
    /// Fraction of the batch's samples whose reward reached the success threshold.
    pub accuracy: f64,
    /// Mean of −log π_behav(token) over the batch's model tokens: a Monte Carlo estimate
    /// of the sampling policy's per-token entropy, free because the engine recorded the
    /// log-probs.
    pub sampled_entropy: f64,
    /// Mean (version − start version) of the batch.
    pub staleness: f64,
    /// Samples of the batch by staleness (version − start version), ascending.
    pub staleness_hist: Vec<(u64, u64)>,
    /// Largest staleness in the batch; never above ⌈α⌉.
    pub staleness_max: u64,
    /// Time from the previous publication (or the start) to this one.
    pub wall: Duration,
    /// Time the trainer spent in the step.
    pub train: Duration,
    /// Time the trainer waited for a batch.
    pub wait: Duration,
    /// Time within `wall` when no rollout group was running (nothing to generate or
    /// admission closed) or generation was paused for the weight sync.
    pub rollout_idle: Duration,
    /// Summed over the batch's trajectories and their turns: time waiting for the model's
    /// turns (queueing included) and time in environment steps. Their ratio says whether a
    /// workload is generation- or environment-bound.
    pub turn_generate: Duration,
    pub turn_env: Duration,
    /// Time since the controller started (at this publication).
    pub elapsed: Duration,
    pub sync: SyncTimings,
    pub stats: StepStats,
    pub accounting: Accounting,
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub steps: Vec<StepRecord>,
    pub accounting: Accounting,
    pub wall: Duration,
    /// Trained samples by staleness.
    pub staleness: Vec<(u64, u64)>,
    /// Where the run ended (what a checkpoint of its end would hold).
    pub cursor: Cursor,
    /// How the run ended.
    pub end: RunEnd,
    /// The run stopped before `steps` because a stop was asked for
    /// ([`AsyncController::with_stop`]).
    pub interrupted: bool,
    /// Groups whose task panicked (their samples count as failed), with the panic messages
    /// (the first few).
    pub lost_groups: Vec<String>,
    /// What the run waited on whenever no step was published for
    /// [`ControllerConfig::stall_report`] (the first few).
    pub stall_reports: Vec<StallReport>,
}

impl RunReport {
    /// Trained samples per second over the whole run.
    pub fn samples_per_sec(&self) -> f64 {
        self.accounting.trained as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Trained model tokens per second over the whole run.
    pub fn tokens_per_sec(&self) -> f64 {
        let t: usize = self.steps.iter().map(|s| s.tokens).sum();
        t as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// The controller.
pub struct AsyncController<L: Learner> {
    cfg: ControllerConfig,
    proxy: ProxyHandle,
    groups: Arc<dyn GroupRunner>,
    version: watch::Sender<PolicyVersion>,
    learner: Option<Box<L>>,
    /// A sample counts as a success (for `accuracy`) when its reward is at least this.
    success_threshold: f64,
    /// Continue a checkpointed run instead of starting at version 0.
    resume: Option<ResumeFrom>,
    /// Stop early when this is set.
    stop: Option<StopFlag>,
    /// Where each training step is reported as a timeline bar.
    timeline: Option<Timeline>,
}

impl<L: Learner> std::fmt::Debug for AsyncController<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncController")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// A group task's result: the rollout, or the panic message.
type GroupDone = (
    rollflash_core::buffer::GroupKey,
    Result<GroupResult, String>,
);

/// A finished training step waiting for its sync and publication.
struct Trained {
    batch: Batch<Trajectory>,
    update: WeightUpdate,
    stats: StepStats,
    sync: SyncTimings,
}

impl<L: Learner> AsyncController<L> {
    /// A controller rolling groups out with `envs` over environments from `make_env`.
    /// `version` is the sender whose receiver the `EnvManager` reads.
    pub fn new(
        cfg: ControllerConfig,
        proxy: ProxyHandle,
        envs: EnvManager,
        make_env: EnvFactory,
        version: watch::Sender<PolicyVersion>,
        learner: L,
    ) -> Result<Self, ControllerError> {
        Self::with_groups(
            cfg,
            proxy,
            Arc::new(EnvGroups { envs, make_env }),
            version,
            learner,
        )
    }

    /// A controller over any [`GroupRunner`].
    pub fn with_groups(
        cfg: ControllerConfig,
        proxy: ProxyHandle,
        groups: Arc<dyn GroupRunner>,
        version: watch::Sender<PolicyVersion>,
        learner: L,
    ) -> Result<Self, ControllerError> {
        cfg.core.buffer.validate()?;
        Ok(AsyncController {
            cfg,
            proxy,
            groups,
            version,
            learner: Some(Box::new(learner)),
            success_threshold: 1.0,
            resume: None,
            stop: None,
            timeline: None,
        })
    }

    /// Counts a sample as a success (for `accuracy`) when its reward is at least
    /// `threshold` (default 1: the math task's exact answer, a grid world's goal).
    pub fn with_success_threshold(mut self, threshold: f64) -> Self {
        self.success_threshold = threshold;
        self
    }

    /// Continues a checkpointed run: the buffer starts at the cursor's version, groups at
    /// its seed, step numbers after its steps, and the counts from its accounting. The
    /// learner and the backends must already hold that version's weights.
    pub fn resume_from(mut self, from: ResumeFrom) -> Self {
        self.resume = Some(from);
        self
    }

    /// Stops the run early when `stop` is set: no new group starts, running groups are
    /// aborted (their samples count as aborted), buffered samples are aborted, a training
    /// step already running finishes and is published (so the learner and the backends
    /// agree), and `run` returns with [`RunReport::interrupted`] set. Nothing the run
    /// spawned is still running when it returns.
    pub fn with_stop(mut self, stop: StopFlag) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Reports every training step (start, end, version, samples, tokens) to `timeline`,
    /// on the trainer's lane.
    pub fn with_timeline(mut self, timeline: Timeline) -> Self {
        self.timeline = Some(timeline);
        self
    }

    /// Runs `cfg.core.steps` training steps and returns what happened. Everything it started is
    /// finished or aborted (and counted) before it returns. A stalled run is an error.
    pub async fn run(self) -> Result<RunReport, ControllerError> {
        self.run_returning_learner().await.map(|(r, _)| r)
    }

    /// As [`AsyncController::run`], also handing back the learner (to save its model).
    pub async fn run_returning_learner(self) -> Result<(RunReport, Option<L>), ControllerError> {
        let (report, learner) = self.run_with_sink(&mut NoSink).await?;
        match report.end {
            RunEnd::Stalled { version, waited } => {
                return Err(ControllerError::Stalled { version, waited })
            }
            RunEnd::NoProgress {
                version,
                waited,
                running,
                failed,
                filtered,
            } => {
                return Err(ControllerError::NoProgress {
                    version,
                    waited,
                    running,
                    failed,
                    filtered,
                })
            }
            RunEnd::Completed | RunEnd::Interrupted => {}
        }
        Ok((report, learner))
    }

    /// As [`AsyncController::run_returning_learner`], showing every step to `sink` as it
    /// is published. A stalled run returns `Ok` with [`RunReport::end`] saying so and the
    /// learner at the last published version, so the caller can checkpoint it.
    ///
    /// It reads like the simulator's dispatch: the core's actions are carried out one by
    /// one ([`Driver::act`]), then the driver waits for the next event ([`Driver::next_event`])
    /// and hands it to the core, until an action ends the run; then [`Driver::close`] drains.
    pub async fn run_with_sink(
        self,
        sink: &mut dyn StepSink<L>,
    ) -> Result<(RunReport, Option<L>), ControllerError> {
        let mut d = Driver::new(self, sink)?;
        let result = d.run().await;
        d.close(result).await
    }

    /// Publishes `update` through the proxy; returns the timings and whether some backend
    /// holds the new version. A backend that fails leaves rotation (the proxy catches it up
    /// later); the run goes on with the rest.
    async fn sync(&self, update: &WeightUpdate) -> (SyncTimings, bool) {
        match self.proxy.sync_weights(update, self.cfg.pause_mode).await {
            Ok(t) => (t, true),
            Err(ProxyError::Sync {
                failed, timings, ..
            }) => {
                let serving = failed.len() < self.proxy.backends().len();
                tracing::warn!(?failed, serving, "weight sync incomplete");
                (*timings, serving)
            }
            Err(e) => {
                tracing::warn!(error = %rollflash_core::error_chain(&e), "weight sync failed");
                (SyncTimings::default(), false)
            }
        }
    }

    /// Whether some backend is in rotation, i.e. holds the newest weights.
    async fn serving(&self) -> bool {
        self.proxy
            .metrics()
            .await
            .is_ok_and(|m| m.backends.iter().any(|(_, _, in_rotation)| *in_rotation))
    }

    /// The full record of a published step: the core's view plus the batch's contents.
    fn record(&self, p: PublishedStep, t: Trained) -> StepRecord {
        let samples = t.batch.groups.iter().flat_map(|g| g.samples.iter());
        let (mut tokens, mut reward, mut successes) = (0usize, 0.0f64, 0usize);
        let (mut nll, mut n_tok) = (0.0f64, 0usize);
        let (mut turn_generate, mut turn_env) = (Duration::ZERO, Duration::ZERO);
        for (traj, r) in samples {
            tokens += traj.response_tokens();
            for turn in &traj.turns {
                turn_generate += turn.generate;
                turn_env += turn.env;
            }
            reward += *r;
            successes += usize::from(*r >= self.success_threshold);
            for (lp, m) in traj.logprobs.iter().zip(&traj.loss_mask) {
                if *m == 1 {
                    nll -= f64::from(*lp);
                    n_tok += 1;
                }
            }
        }
        let n = p.samples.max(1) as f64;
        StepRecord {
            step: p.step,
            version: p.version,
            samples: p.samples,
            tokens,
            mean_reward: reward / n,
            accuracy: successes as f64 / n,
            sampled_entropy: nll / n_tok.max(1) as f64,
            staleness: p.staleness,
            staleness_hist: p.staleness_hist,
            staleness_max: p.staleness_max,
            wall: p.wall,
            train: p.train,
            wait: p.wait,
            rollout_idle: p.rollout_idle,
            turn_generate,
            turn_env,
            elapsed: p.elapsed,
            sync: t.sync,
            stats: t.stats,
            accounting: p.accounting,
        }
    }
}

/// Whether the run goes on after an action or an event.
enum Flow {
    Continue,
    End,
}

/// One run of an [`AsyncController`]: the core, the tasks it started, and what the run has
/// reported so far. Each core action is a method, as in the simulator.
struct Driver<'s, L: Learner> {
    ctl: AsyncController<L>,
    sink: &'s mut dyn StepSink<L>,
    start: Instant,
    core: ControllerCore<Trajectory>,
    groups: JoinSet<GroupDone>,
    training: Option<tokio::task::JoinHandle<TrainDone<L>>>,
    /// A finished step waiting for its sync and publication.
    trained: Option<Trained>,
    steps: Vec<StepRecord>,
    todo: VecDeque<CoreAction<Trajectory>>,
    end: RunEnd,
    stop: StopFlag,
    /// Whether some backend is in rotation, as the proxy sees it change: the whole fleet
    /// going down between syncs starts the same serve deadline as a sync nobody loaded.
    fleet: watch::Receiver<bool>,
    fleet_open: bool,
    stall_reports: Vec<StallReport>,
    last_report: Duration,
    /// When the running step started (Unix ms), for its timeline bar.
    train_started: u64,
    /// The learner looking after its trainer while it waits for a batch ([`Learner::idle`]).
    idle: Option<tokio::task::JoinHandle<IdleDone<L>>>,
    /// A batch that became ready while the learner was in [`Learner::idle`]: it trains as
    /// soon as the learner is back.
    deferred: Option<Batch<Trajectory>>,
    /// When the learner last came back (from a step or an idle call): its next idle call is
    /// an interval after.
    idle_from: Instant,
}

impl<'s, L: Learner> Driver<'s, L> {
    fn new(
        ctl: AsyncController<L>,
        sink: &'s mut dyn StepSink<L>,
    ) -> Result<Self, ControllerError> {
        let start = Instant::now();
        let core = ControllerCore::new(ctl.cfg.core.clone(), ctl.resume, Duration::ZERO)?;
        Ok(Driver {
            stop: ctl.stop.clone().unwrap_or_default(),
            fleet: ctl.proxy.serving(),
            ctl,
            sink,
            start,
            core,
            groups: JoinSet::new(),
            training: None,
            trained: None,
            steps: Vec::new(),
            todo: VecDeque::new(),
            end: RunEnd::Completed,
            fleet_open: true,
            stall_reports: Vec::new(),
            last_report: Duration::ZERO,
            train_started: 0,
            idle: None,
            deferred: None,
            idle_from: start,
        })
    }

    /// The core's clock: the time since the run started.
    fn clock(&self) -> Duration {
        self.start.elapsed()
    }

    /// Hands `ev` to the core and queues what it decides.
    fn handle(&mut self, ev: CoreEvent<Trajectory>) {
        let mut out = Vec::new();
        self.core.handle(self.clock(), ev, &mut out);
        self.todo.extend(out);
    }

    async fn run(&mut self) -> Result<(), ControllerError> {
        self.handle(CoreEvent::Tick);
        loop {
            while let Some(action) = self.todo.pop_front() {
                if let Flow::End = self.act(action).await? {
                    return Ok(());
                }
            }
            // Resumed from the checkpoint of the last step (killed in the evaluation or the
            // final save): there is nothing left to run.
            if self.groups.is_empty() && self.training.is_none() && self.core.is_done() {
                return Ok(());
            }
            // Nothing to wait for and no end: say so rather than wait forever.
            if self.groups.is_empty()
                && self.training.is_none()
                && self.idle.is_none()
                && self.core.serve_deadline().is_none()
            {
                let b = self.core.buffer();
                return Err(ControllerError::Stuck {
                    running: b.running_groups(),
                    buffered: b.accounting().buffered,
                });
            }
            let ev = self.next_event().await?;
            self.handle(ev);
        }
    }

    /// Carries out one of the core's actions.
    async fn act(&mut self, action: CoreAction<Trajectory>) -> Result<Flow, ControllerError> {
        match action {
            CoreAction::StartGroup { key, seed, .. } => {
                self.start_group(key, seed);
                Ok(Flow::Continue)
            }
            CoreAction::Train { batch } => Ok(self.start_training(batch)),
            CoreAction::Sync { version } => {
                self.sync(version).await?;
                Ok(Flow::Continue)
            }
            CoreAction::Published(p) => self.publish(*p),
            CoreAction::AbortRollout => {
                tracing::info!("stop requested: aborting rollout, finishing the running step");
                self.groups.abort_all();
                Ok(Flow::Continue)
            }
            CoreAction::Done(e) => {
                self.done(e);
                Ok(Flow::End)
            }
        }
    }

    fn start_group(&mut self, key: rollflash_core::buffer::GroupKey, seed: u64) {
        let runner = Arc::clone(&self.ctl.groups);
        let (size, red) = (
            self.ctl.cfg.core.buffer.group_size,
            self.ctl.cfg.core.redundancy,
        );
        self.groups.spawn(async move {
            let run = AssertUnwindSafe(runner.run_group(seed, size, red));
            (key, run.catch_unwind().await.map_err(panic_message))
        });
    }

    fn start_training(&mut self, batch: Batch<Trajectory>) -> Flow {
        let Some(mut learner) = self.ctl.learner.take() else {
            if self.idle.is_some() {
                self.deferred = Some(batch);
                return Flow::Continue;
            }
            return Flow::End;
        };
        if let Some(tl) = &self.ctl.timeline {
            self.train_started = tl.now_ms();
        }
        self.training = Some(tokio::task::spawn_blocking(move || {
            let out = learner.train(&batch);
            TrainDone {
                learner,
                batch,
                out,
            }
        }));
        Flow::Continue
    }

    /// Syncs the trained step's weights as `version`, which the core decided; a learner
    /// that says otherwise would split the buffer's view of the policy from what the
    /// backends serve.
    async fn sync(&mut self, version: PolicyVersion) -> Result<(), ControllerError> {
        let serving = match self.trained.as_mut() {
            Some(t) if t.update.version() != version => {
                return Err(ControllerError::VersionMismatch {
                    expected: version,
                    learner: t.update.version(),
                })
            }
            Some(t) => {
                let (timings, serving) = self.ctl.sync(&t.update).await;
                t.sync = timings;
                serving
            }
            None => false,
        };
        self.handle(CoreEvent::SyncFinished { serving });
        Ok(())
    }

    /// Publishes a synced step: the rollouts' version, the sink, the record.
    fn publish(&mut self, p: PublishedStep) -> Result<Flow, ControllerError> {
        let Some(t) = self.trained.take() else {
            return Ok(Flow::Continue);
        };
        // The core's version, which the sync checked the learner's against.
        self.ctl.version.send_replace(p.cursor.version);
        self.sink.on_batch(p.step, &t.batch)?;
        let cursor = p.cursor;
        let record = self.ctl.record(p, t);
        tracing::info!(
            step = record.step,
            version = %cursor.version,
            reward = record.mean_reward,
            staleness = record.staleness,
            loss = record.stats.loss,
            wall_s = record.wall.as_secs_f64(),
            "step"
        );
        let seen = match self.ctl.learner.as_deref() {
            Some(l) => self.sink.on_step(&record, l, cursor),
            None => Ok(()),
        };
        self.steps.push(record);
        seen?;
        Ok(Flow::Continue)
    }

    fn done(&mut self, end: RunEnd) {
        self.end = end;
        match end {
            RunEnd::Stalled { version, waited } => tracing::error!(
                %version,
                waited_s = waited.as_secs_f64(),
                "no backend serves the newest weights: stopping"
            ),
            RunEnd::NoProgress {
                waited,
                running,
                failed,
                filtered,
                ..
            } => tracing::error!(
                waited_s = waited.as_secs_f64(),
                failed,
                filtered,
                running,
                groups_running = self.core.buffer().running_groups(),
                buffered = self.core.buffer().accounting().buffered,
                "no progress: the trainer waits for a batch, no group added a sample to the \
                 buffer (environments or servers failing every trajectory, or a filter \
                 nothing passes): stopping"
            ),
            RunEnd::Completed | RunEnd::Interrupted => {}
        }
    }

    /// Waits for what happens next: a stop, a group, the training step, the fleet, or one
    /// of the deadlines (progress, stall report, the serve probe).
    async fn next_event(&mut self) -> Result<CoreEvent<Trajectory>, ControllerError> {
        let start = self.start;
        let probe = self
            .core
            .serve_deadline()
            .map(|d| (self.clock() + SERVING_PROBE).min(d))
            .map(|at| start + at);
        // The progress deadline needs a wake-up of its own when nothing else reports.
        let progress = self
            .core
            .progress_deadline()
            .and_then(|at| start.checked_add(at));
        // The next stall report: an interval after the last step, or the last report.
        let report_at = self.ctl.cfg.stall_report.and_then(|every| {
            let now = self.clock();
            let quiet_from = now
                .saturating_sub(self.core.since_publish(now))
                .max(self.last_report);
            start.checked_add(quiet_from + every)
        });
        let idle_at = self.idle_due();
        Ok(tokio::select! {
            _ = self.stop.stopped(), if !self.core.stopping() => CoreEvent::Stop,
            Some(done) = self.groups.join_next(), if !self.groups.is_empty() => match done {
                Ok((key, Ok(g))) => CoreEvent::GroupFinished { key, outcome: outcome(g) },
                Ok((key, Err(reason))) => {
                    tracing::error!(group = key.0, %reason, "rollout group panicked; its samples count as failed");
                    CoreEvent::GroupLost { key, reason }
                }
                // Cancelled by a stop: `close` counts it.
                Err(_) => CoreEvent::Tick,
            },
            done = join_training(&mut self.training), if self.training.is_some() => {
                self.training = None;
                let done = done.map_err(|e| ControllerError::Panicked(e.to_string()))?;
                self.trained_step(done)?
            }
            done = join_training(&mut self.idle), if self.idle.is_some() => {
                self.idle = None;
                let done = done.map_err(|e| ControllerError::Panicked(e.to_string()))?;
                self.idled(done)?
            }
            _ = sleep_until(idle_at), if idle_at.is_some() => {
                self.start_idle();
                CoreEvent::Tick
            }
            changed = self.fleet.changed(), if self.fleet_open => match changed {
                Ok(()) if *self.fleet.borrow_and_update() => CoreEvent::Serving,
                Ok(()) => {
                    tracing::error!(
                        waiting_s = self.ctl.cfg.core.serve_timeout.as_secs_f64(),
                        "no backend is in rotation (every server down or behind on weights): \
                         waiting for one to come back, then stopping with a checkpoint"
                    );
                    CoreEvent::Unserved
                }
                Err(_) => {
                    self.fleet_open = false;
                    CoreEvent::Tick
                }
            },
            _ = sleep_until(progress), if progress.is_some() => CoreEvent::Tick,
            _ = sleep_until(report_at), if report_at.is_some() => {
                self.stall_report().await;
                CoreEvent::Tick
            }
            _ = sleep_until(probe), if probe.is_some() => {
                if self.ctl.serving().await { CoreEvent::Serving } else { CoreEvent::Tick }
            }
        })
    }

    /// When the learner's next [`Learner::idle`] call is due: only while it is home with
    /// nothing trained waiting for its sync, and only for a learner that asks for them.
    fn idle_due(&self) -> Option<Instant> {
        if self.training.is_some() || self.trained.is_some() || self.core.stopping() {
            return None;
        }
        let every = self.ctl.learner.as_deref()?.idle_every()?;
        self.idle_from.checked_add(every)
    }

    /// Hands the learner to a blocking thread for its [`Learner::idle`] call.
    fn start_idle(&mut self) {
        let Some(mut learner) = self.ctl.learner.take() else {
            return;
        };
        self.idle = Some(tokio::task::spawn_blocking(move || {
            let out = learner.idle();
            IdleDone { learner, out }
        }));
    }

    /// The learner is back from [`Learner::idle`]: weights it rebuilt (the same version,
    /// elsewhere) replace the lost ones for the fleet's catch-ups; a batch that became ready
    /// meanwhile starts training; its error stops the run.
    fn idled(&mut self, done: IdleDone<L>) -> Result<CoreEvent<Trajectory>, ControllerError> {
        self.ctl.learner = Some(done.learner);
        self.idle_from = Instant::now();
        if let Some(update) = done.out? {
            let expected = self.core.cursor().version;
            if update.version() != expected {
                return Err(ControllerError::VersionMismatch {
                    expected,
                    learner: update.version(),
                });
            }
            tracing::warn!(
                version = %expected,
                "the learner rebuilt its weights on its trainer: backends catch up to them"
            );
            self.ctl.proxy.republish_weights(&update);
        }
        if let Some(batch) = self.deferred.take() {
            // The learner is home: this starts the step.
            let _ = self.start_training(batch);
        }
        Ok(CoreEvent::Tick)
    }

    /// The training step ended: the learner comes back, the trainer's timeline bar is
    /// recorded, and the step waits for its sync (or the run stops with the learner's error).
    fn trained_step(
        &mut self,
        done: TrainDone<L>,
    ) -> Result<CoreEvent<Trajectory>, ControllerError> {
        self.ctl.learner = Some(done.learner);
        self.idle_from = Instant::now();
        if let Some(tl) = &self.ctl.timeline {
            let tokens = done
                .batch
                .groups
                .iter()
                .flat_map(|g| &g.samples)
                .map(|(t, _)| t.response_tokens() as u64)
                .sum();
            tl.record(TimelineEvent {
                lane: TRAINER_LANE.to_string(),
                kind: EventKind::Train,
                start_ms: self.train_started,
                end_ms: tl.now_ms(),
                version: done.batch.version.0,
                count: done.batch.len() as u64,
                tokens,
            });
        }
        let (update, stats) = done.out?;
        self.trained = Some(Trained {
            batch: done.batch,
            update,
            stats,
            sync: SyncTimings::default(),
        });
        Ok(CoreEvent::TrainFinished)
    }

    /// Says what the run waits on (logged, and kept in the report).
    async fn stall_report(&mut self) {
        let now = self.clock();
        self.last_report = now;
        let proxy = tokio::time::timeout(STALL_PROXY_DEADLINE, self.ctl.proxy.metrics())
            .await
            .ok()
            .and_then(Result::ok);
        let report = StallReport {
            at: now,
            since_step: self.core.since_publish(now),
            steps_done: self.core.cursor().steps_done,
            waiting: self.core.waiting(now),
            accounting: self.core.accounting(),
            proxy,
        };
        tracing::warn!("{report}");
        if self.stall_reports.len() < STALL_REPORTS_KEPT {
            self.stall_reports.push(report);
        }
    }

    /// The end: a running step is finished (not published), groups are aborted and
    /// drained, and the core counts what never reported; then `result` decides.
    async fn close(
        mut self,
        result: Result<(), ControllerError>,
    ) -> Result<(RunReport, Option<L>), ControllerError> {
        if let Some(h) = self.training.take() {
            if let Ok(d) = h.await {
                self.ctl.learner = Some(d.learner);
            }
        }
        // A batch deferred for an idle call is dropped untrained, as a step cut short is.
        if let Some(h) = self.idle.take() {
            if let Ok(d) = h.await {
                self.ctl.learner = Some(d.learner);
            }
        }
        self.groups.abort_all();
        while let Some(done) = self.groups.join_next().await {
            let ev = match done {
                Ok((key, Ok(g))) => CoreEvent::GroupFinished {
                    key,
                    outcome: outcome(g),
                },
                Ok((key, Err(reason))) => CoreEvent::GroupLost { key, reason },
                Err(_) => continue,
            };
            let mut out = Vec::new();
            self.core.handle(self.clock(), ev, &mut out);
        }
        let summary = self.core.close(self.clock());
        result?;
        let report = RunReport {
            cursor: summary.cursor,
            steps: self.steps,
            accounting: summary.accounting,
            wall: summary.wall,
            interrupted: self.end == RunEnd::Interrupted,
            end: self.end,
            staleness: summary.staleness,
            lost_groups: summary.lost_groups,
            stall_reports: self.stall_reports,
        };
        Ok((report, self.ctl.learner.map(|l| *l)))
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Awaits the running training step (never resolves when there is none; the `select!`
/// guard keeps it from being polled then).
async fn join_training<T>(
    h: &mut Option<tokio::task::JoinHandle<T>>,
) -> Result<T, tokio::task::JoinError> {
    match h {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

struct IdleDone<L> {
    learner: Box<L>,
    out: Result<Option<WeightUpdate>, LearnerError>,
}

struct TrainDone<L> {
    learner: Box<L>,
    batch: Batch<Trajectory>,
    out: Result<(WeightUpdate, StepStats), LearnerError>,
}

/// The text of a panic payload.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    format!("group task panicked: {text}")
}

/// A group's rollout result as the buffer counts it. Samples are put in index order, not
/// finishing order, so a batch (and every float sum over it) does not depend on timing.
fn outcome(mut g: GroupResult) -> GroupOutcome<Trajectory> {
    g.kept.sort_by_key(|t| t.index);
    GroupOutcome {
        samples: g
            .kept
            .into_iter()
            .map(|t| {
                let r = t.reward;
                (t, r)
            })
            .collect(),
        aborted: g.aborted as u64,
        failed: g.failed.len() as u64,
    }
}
