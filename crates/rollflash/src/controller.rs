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

/// Why the controller stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Learner(#[from] LearnerError),
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
    /// Mean (version − start version) of the batch.
    pub staleness: f64,
    /// Time from the previous publication (or the start) to this one.
    pub wall: Duration,
    /// Time the trainer spent in the step.
    pub train: Duration,
    /// Time the trainer waited for a batch.
    pub wait: Duration,
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
        })
    }

    /// Runs `cfg.steps` training steps and returns what happened. Everything it started is
    /// finished or aborted (and counted) before it returns.
    pub async fn run(self) -> Result<RunReport, ControllerError> {
        self.run_returning_learner().await.map(|(r, _)| r)
    }

    /// As [`AsyncController::run`], also handing back the learner (to save its model).
    pub async fn run_returning_learner(
        mut self,
    ) -> Result<(RunReport, Option<L>), ControllerError> {
        let mut buffer: SampleBuffer<Trajectory> = SampleBuffer::new(self.cfg.buffer.clone());
        let mut groups: JoinSet<GroupDone> = JoinSet::new();
        let mut next_seed = self.cfg.seed;
        let group_samples = (self.cfg.buffer.group_size + self.cfg.redundancy) as u64;
        let start = Instant::now();
        let mut last_publish = start;
        let mut steps = Vec::new();
        let mut training: Option<tokio::task::JoinHandle<TrainDone<L>>> = None;
        let mut wait_since = Some(start);
        let mut result = Ok(());

        while steps.len() < self.cfg.steps {
            // Admission: start every group the buffer allows now.
            while let Some((key, _v)) = buffer.try_start(group_samples) {
                let envs = self.envs.clone();
                let make_env = Arc::clone(&self.make_env);
                let seed = next_seed;
                next_seed += 1;
                let (size, red) = (self.cfg.buffer.group_size, self.cfg.redundancy);
                groups.spawn(async move { (key, envs.run_group(make_env, seed, size, red).await) });
            }
            // Training: start a step as soon as a batch is ready.
            if training.is_none() {
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
            tokio::select! {
                Some(done) = groups.join_next() => {
                    if let Ok((key, g)) = done {
                        buffer.finish(key, outcome(g));
                    }
                }
                done = join_training(&mut training), if training.is_some() => {
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
                    let sync = match self.proxy.sync_weights(&update, self.cfg.pause_mode).await {
                        Ok(t) => t,
                        Err(e) => {
                            tracing::warn!(error = %e, "weight sync incomplete");
                            SyncTimings::default()
                        }
                    };
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
                    let now = Instant::now();
                    let record = StepRecord {
                        step: steps.len(),
                        version: batch.version,
                        samples,
                        tokens,
                        mean_reward: reward / samples.max(1) as f64,
                        staleness: batch.mean_staleness(),
                        wall: now - last_publish,
                        train: done.train,
                        wait: done.waited,
                        sync,
                        stats,
                        accounting: buffer.accounting(),
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
                    steps.push(record);
                    last_publish = now;
                    wait_since = Some(now);
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
        buffer.shutdown();
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
        result?;
        let report = RunReport {
            steps,
            accounting: buffer.accounting(),
            wall: start.elapsed(),
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

/// A group's rollout result as the buffer counts it.
fn outcome(g: GroupResult) -> GroupOutcome<Trajectory> {
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
