//! `AsyncController`: runs rollout and training at the same time. Rollout groups start as
//! the sample buffer admits them (α), each in its own task; training pulls whole-group
//! batches, steps on its own threads, and publishes the new weights through the proxy
//! (pause → update every backend → resume). With α = 0 and the barrier on, the same loop is
//! the synchronous baseline.

use std::sync::Arc;
use std::time::Duration;

use rollflash_core::buffer::{
    Accounting, Batch, BufferConfig, GroupKey, GroupOutcome, SampleBuffer,
};
use rollflash_core::{PauseMode, PolicyVersion, Trajectory};
use rollflash_rollout::{
    EnvFactory, EnvManager, GroupResult, ProxyHandle, SyncTimings, WeightUpdate,
};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// What one training step reports.
#[derive(Debug, Clone, Default)]
pub struct StepStats {
    pub loss: f64,
    /// Free-form named metrics (KL, entropy, clip fraction…).
    pub metrics: Vec<(String, f64)>,
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
}

/// A training step failed.
#[derive(Debug, thiserror::Error)]
#[error("training step failed: {0}")]
pub struct LearnerError(pub String);

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

/// Where the run stands after a step: everything a checkpoint needs besides the learner
/// to continue exactly there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cursor {
    /// Steps completed (= records written).
    pub steps_done: usize,
    /// The policy version those steps published.
    pub version: PolicyVersion,
    /// The task seed the next group will use: the data cursor. Every random choice of a
    /// rollout derives from (task seed, index in group, turn), so this is also the rollout's
    /// whole random state.
    pub next_seed: u64,
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
}

/// A sink that does nothing.
#[derive(Debug, Default)]
pub struct NoSink;

impl<L> StepSink<L> for NoSink {
    fn on_step(&mut self, _: &StepRecord, _: &L, _: Cursor) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Where a resumed run starts: a [`Cursor`] read back from a checkpoint, and the sample
/// counts so far (so per-step accounting continues from them).
#[derive(Debug, Clone, Copy)]
pub struct ResumeFrom {
    pub cursor: Cursor,
    pub accounting: Accounting,
}

/// Why the controller stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Learner(#[from] LearnerError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("invalid controller config: {0}")]
    Config(String),
    #[error("training task panicked: {0}")]
    Panicked(String),
}

/// Settings of the controller loop.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Admission, α, filtering, barrier.
    pub buffer: BufferConfig,
    /// Extra trajectories per group (redundant environment rollout).
    pub redundancy: usize,
    /// Training steps to run.
    pub steps: usize,
    /// How in-flight requests are treated during a weight sync.
    pub pause_mode: PauseMode,
    /// The first task seed; group `k` uses `seed + k`.
    pub seed: u64,
}

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
    /// The run stopped before `steps` because a stop was asked for
    /// ([`AsyncController::with_stop`]).
    pub interrupted: bool,
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
    envs: EnvManager,
    make_env: EnvFactory,
    version: watch::Sender<PolicyVersion>,
    learner: Option<Box<L>>,
    /// A sample counts as a success (for `accuracy`) when its reward is at least this.
    success_threshold: f64,
    /// Continue a checkpointed run instead of starting at version 0.
    resume: Option<ResumeFrom>,
    /// Stop early when this is set.
    stop: Option<crate::StopFlag>,
}

impl<L: Learner> std::fmt::Debug for AsyncController<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncController")
            .field("cfg", &self.cfg)
            .finish()
    }
}

type GroupDone = (GroupKey, GroupResult);

impl<L: Learner> AsyncController<L> {
    /// A controller. `version` is the sender whose receiver the `EnvManager` reads.
    pub fn new(
        cfg: ControllerConfig,
        proxy: ProxyHandle,
        envs: EnvManager,
        make_env: EnvFactory,
        version: watch::Sender<PolicyVersion>,
        learner: L,
    ) -> Result<Self, ControllerError> {
        cfg.buffer.validate().map_err(ControllerError::Config)?;
        Ok(AsyncController {
            cfg,
            proxy,
            envs,
            make_env,
            version,
            learner: Some(Box::new(learner)),
            success_threshold: 1.0,
            resume: None,
            stop: None,
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
    pub fn with_stop(mut self, stop: crate::StopFlag) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Runs `cfg.steps` training steps and returns what happened. Everything it started is
    /// finished or aborted (and counted) before it returns.
    pub async fn run(self) -> Result<RunReport, ControllerError> {
        self.run_returning_learner().await.map(|(r, _)| r)
    }

    /// As [`AsyncController::run`], also handing back the learner (to save its model).
    pub async fn run_returning_learner(self) -> Result<(RunReport, Option<L>), ControllerError> {
        self.run_with_sink(&mut NoSink).await
    }

    /// As [`AsyncController::run_returning_learner`], showing every step to `sink` as it
    /// is published.
    pub async fn run_with_sink(
        mut self,
        sink: &mut dyn StepSink<L>,
    ) -> Result<(RunReport, Option<L>), ControllerError> {
        let (mut buffer, mut next_seed, done_before, base) = match self.resume {
            Some(r) => (
                SampleBuffer::starting_at(self.cfg.buffer.clone(), r.cursor.version),
                r.cursor.next_seed,
                r.cursor.steps_done,
                r.accounting,
            ),
            None => (
                SampleBuffer::new(self.cfg.buffer.clone()),
                self.cfg.seed,
                0,
                Accounting::default(),
            ),
        };
        let mut groups: JoinSet<GroupDone> = JoinSet::new();
        let group_samples = (self.cfg.buffer.group_size + self.cfg.redundancy) as u64;
        let start = Instant::now();
        let mut last_publish = start;
        let mut steps = Vec::new();
        let mut training: Option<tokio::task::JoinHandle<TrainDone<L>>> = None;
        let mut wait_since = Some(start);
        let mut rollout_idle = Duration::ZERO;
        let mut result = Ok(());
        let stop = self.stop.clone().unwrap_or_default();
        let mut stopping = false;

        while done_before + steps.len() < self.cfg.steps && !(stopping && training.is_none()) {
            if !stopping && stop.is_stopped() {
                stopping = true;
                buffer.shutdown();
                groups.abort_all();
                tracing::info!("stop requested: aborting rollout, finishing the running step");
                continue;
            }
            // Admission: start every group the buffer allows now.
            while let Some((key, _v)) = (!stopping)
                .then(|| buffer.try_start(group_samples))
                .flatten()
            {
                let envs = self.envs.clone();
                let make_env = Arc::clone(&self.make_env);
                let seed = next_seed;
                next_seed += 1;
                let (size, red) = (self.cfg.buffer.group_size, self.cfg.redundancy);
                groups.spawn(async move { (key, envs.run_group(make_env, seed, size, red).await) });
            }
            // Training: start a step as soon as a batch is ready.
            if training.is_none() && !stopping {
                if let Some(batch) = buffer.take_batch() {
                    let waited = wait_since.take().map(|t| t.elapsed()).unwrap_or_default();
                    let Some(mut learner) = self.learner.take() else {
                        break;
                    };
                    training = Some(tokio::task::spawn_blocking(move || {
                        let t0 = std::time::Instant::now();
                        let out = learner.train(&batch);
                        TrainDone {
                            learner,
                            batch,
                            out,
                            train: t0.elapsed(),
                            waited,
                        }
                    }));
                }
            }
            // Rollout is idle over this wait if no group runs while it lasts.
            let idle_since = (buffer.running_groups() == 0).then(Instant::now);
            tokio::select! {
                _ = stop.stopped(), if !stopping => {}
                Some(done) = groups.join_next() => {
                    if let Some(t) = idle_since {
                        rollout_idle += t.elapsed();
                    }
                    if let Ok((key, g)) = done {
                        buffer.finish(key, outcome(g));
                    }
                }
                done = join_training(&mut training), if training.is_some() => {
                    if let Some(t) = idle_since {
                        rollout_idle += t.elapsed();
                    }
                    training = None;
                    let done = match done {
                        Ok(d) => d,
                        Err(e) => {
                            result = Err(ControllerError::Panicked(e.to_string()));
                            break;
                        }
                    };
                    self.learner = Some(done.learner);
                    let (update, stats) = match done.out {
                        Ok(x) => x,
                        Err(e) => {
                            result = Err(e.into());
                            break;
                        }
                    };
                    let new_version = update.version();
                    // A backend that fails the sync leaves rotation (the proxy handles it);
                    // training goes on with the rest.
                    let sync_start = Instant::now();
                    let sync = match self.proxy.sync_weights(&update, self.cfg.pause_mode).await {
                        Ok(t) => t,
                        Err(e) => {
                            tracing::warn!(error = %e, "weight sync incomplete");
                            SyncTimings::default()
                        }
                    };
                    // Generation is paused for the sync (or nothing runs at all).
                    rollout_idle += sync_start.elapsed();
                    buffer.publish(new_version);
                    self.version.send_replace(new_version);
                    let batch = &done.batch;
                    let samples = batch.len();
                    let tokens = batch
                        .groups
                        .iter()
                        .flat_map(|g| g.samples.iter())
                        .map(|(t, _)| t.response_tokens())
                        .sum();
                    let reward: f64 = batch
                        .groups
                        .iter()
                        .flat_map(|g| g.samples.iter())
                        .map(|(_, r)| *r)
                        .sum();
                    let successes = batch
                        .groups
                        .iter()
                        .flat_map(|g| g.samples.iter())
                        .filter(|(_, r)| *r >= self.success_threshold)
                        .count();
                    let (mut nll, mut n_tok) = (0.0f64, 0usize);
                    for (t, _) in batch.groups.iter().flat_map(|g| g.samples.iter()) {
                        for (lp, m) in t.logprobs.iter().zip(&t.loss_mask) {
                            if *m == 1 {
                                nll -= f64::from(*lp);
                                n_tok += 1;
                            }
                        }
                    }
                    let mut hist = std::collections::BTreeMap::<u64, u64>::new();
                    for g in &batch.groups {
                        *hist.entry(batch.version.0.saturating_sub(g.start.0)).or_default() +=
                            g.samples.len() as u64;
                    }
                    let now = Instant::now();
                    let record = StepRecord {
                        step: done_before + steps.len(),
                        version: batch.version,
                        samples,
                        tokens,
                        mean_reward: reward / samples.max(1) as f64,
                        accuracy: successes as f64 / samples.max(1) as f64,
                        sampled_entropy: nll / n_tok.max(1) as f64,
                        staleness: batch.mean_staleness(),
                        staleness_max: hist.keys().next_back().copied().unwrap_or(0),
                        staleness_hist: hist.into_iter().collect(),
                        wall: now - last_publish,
                        train: done.train,
                        wait: done.waited,
                        rollout_idle: std::mem::take(&mut rollout_idle),
                        elapsed: now - start,
                        sync,
                        stats,
                        accounting: add(base, buffer.accounting()),
                    };
                    tracing::info!(
                        step = record.step,
                        version = %new_version,
                        reward = record.mean_reward,
                        staleness = record.staleness,
                        loss = record.stats.loss,
                        wall_s = record.wall.as_secs_f64(),
                        "step"
                    );
                    let cursor = Cursor {
                        steps_done: record.step + 1,
                        version: new_version,
                        next_seed,
                    };
                    if let Some(l) = self.learner.as_deref() {
                        if let Err(e) = sink.on_step(&record, l, cursor) {
                            result = Err(e.into());
                            steps.push(record);
                            break;
                        }
                    }
                    steps.push(record);
                    last_publish = Instant::now();
                    wait_since = Some(last_publish);
                }
                else => break,
            }
        }

        // Stop: abort what still runs and count it; drain finished groups.
        if let Some(h) = training.take() {
            if let Ok(d) = h.await {
                self.learner = Some(d.learner);
            }
        }
        groups.abort_all();
        while let Some(done) = groups.join_next().await {
            if let Ok((key, g)) = done {
                buffer.finish(key, outcome(g));
            }
        }
        // Groups whose tasks were cancelled never reported: count them as aborted.
        for key in buffer.running_keys() {
            buffer.finish(
                key,
                GroupOutcome {
                    samples: Vec::new(),
                    aborted: 0,
                    failed: 0,
                },
            );
        }
        // Last, so groups that finished while being drained are not left buffered.
        buffer.shutdown();
        result?;
        let report = RunReport {
            cursor: Cursor {
                steps_done: done_before + steps.len(),
                version: buffer.version(),
                next_seed,
            },
            steps,
            accounting: add(base, buffer.accounting()),
            wall: start.elapsed(),
            interrupted: stopping,
            staleness: buffer
                .staleness_histogram()
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect(),
        };
        Ok((report, self.learner.map(|l| *l)))
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

struct TrainDone<L> {
    learner: Box<L>,
    batch: Batch<Trajectory>,
    out: Result<(WeightUpdate, StepStats), LearnerError>,
    train: Duration,
    waited: Duration,
}

/// Counts of an earlier process (a resumed run's start) plus this one's. What was running
/// or buffered when the checkpoint was written is not resumed: it counts as aborted.
fn add(base: Accounting, now: Accounting) -> Accounting {
    Accounting {
        started: base.started + now.started,
        trained: base.trained + now.trained,
        filtered: base.filtered + now.filtered,
        dropped_stale: base.dropped_stale + now.dropped_stale,
        aborted: base.aborted + base.running + base.buffered + now.aborted,
        failed: base.failed + now.failed,
        running: now.running,
        buffered: now.buffered,
    }
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
