//! The controller's decisions in order, as a plain state machine: which groups start
//! (admission), when a training step starts (a batch is ready), what follows a step (weight
//! sync, then publication), when the run ends (its steps are done, a stop was asked for, or
//! no backend serves the current weights in time), and what every step reports. Events and a
//! clock go in, actions come out; like `ProxyScheduler` and `SampleBuffer`, it does no I/O.
//! `rollflash-trainer`'s `AsyncController` drives it with real tasks, `rollflash-sim` with
//! a virtual clock: the loop is written once.
//!
//! ## The loop
//! While the run is *running*, every event is followed by the same sequence, repeated until
//! nothing changes: start every group the buffer admits → start a training step if none runs
//! and a batch is ready → hand one finished group to the buffer. Finished groups are queued
//! and taken one at a time, so a driver that reports several at once (the simulator, during a
//! sync) sees exactly the order of a driver that reports them one by one.
//!
//! A finished step is synced (`Sync`), and only when the sync ends is its version published
//! to the buffer (`Published`). Nothing else is decided while a sync runs: the real
//! controller awaits it.
//!
//! ## Ending
//! - After `steps` published steps: `Done(Completed)`.
//! - `Stop` (Ctrl-C): the buffer is shut (buffered samples aborted), `AbortRollout` asks the
//!   driver to abort every running group, a step already training is still synced and
//!   published (learner and backends stay at one version), then `Done(Interrupted)`.
//! - A sync after which no backend holds the new version: the run goes on, but if no backend
//!   reports serving it within `serve_timeout`, `Done(Stalled)` — the run stops with its
//!   state intact instead of waiting forever on generation nobody can do. The same deadline
//!   runs when the driver reports `Unserved` between syncs (every backend went down).
//!
//! After `Done`, the driver reports the groups it drains ([`ControllerCore::handle`] still
//! counts them) and calls [`ControllerCore::close`], which counts what never reported as
//! aborted.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::buffer::{
    Accounting, Batch, BufferConfig, BufferConfigError, GroupKey, GroupOutcome, SampleBuffer,
};
use crate::PolicyVersion;

/// Where the run stands after a step: everything a checkpoint needs, besides the learner,
/// to continue exactly there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// Where a resumed run starts: a [`Cursor`] read back from a checkpoint, and the sample
/// counts so far (so per-step accounting continues from them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeFrom {
    pub cursor: Cursor,
    pub accounting: Accounting,
}

/// Settings of the controller.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreConfig {
    /// Admission, α, filtering, barrier.
    pub buffer: BufferConfig,
    /// Extra trajectories per group (redundant environment rollout).
    pub redundancy: usize,
    /// Training steps of the whole run (a resumed run counts the steps before it).
    pub steps: usize,
    /// The first task seed; group `k` uses `seed + k`.
    pub seed: u64,
    /// How long the run may go on with no backend serving the newest weights before it
    /// stops as stalled.
    pub serve_timeout: Duration,
    /// How long the run may go between steps with no group adding a sample to the buffer
    /// (every group failing, or filtered out, or none finishing) before it stops as
    /// [`RunEnd::NoProgress`].
    pub progress_timeout: Duration,
}

impl CoreConfig {
    /// Samples started per group: the kept ones plus the redundant ones.
    pub fn group_samples(&self) -> u64 {
        (self.buffer.group_size + self.redundancy) as u64
    }
}

/// What the driver reports.
#[derive(Debug)]
pub enum CoreEvent<T> {
    /// Nothing happened but time passed: the first call, and deadline checks.
    Tick,
    /// A group's rollout ended.
    GroupFinished {
        key: GroupKey,
        outcome: GroupOutcome<T>,
    },
    /// A group's task ended without an outcome (it panicked): every sample it started counts
    /// as failed, and admission makes room for another group.
    GroupLost { key: GroupKey, reason: String },
    /// The training step asked for by `Train` finished: its weights are the next version.
    TrainFinished,
    /// The sync asked for by `Sync` ended; `serving` says whether at least one backend holds
    /// the new version.
    SyncFinished { serving: bool },
    /// A backend serves the current version (it was caught up after a failed sync, or came
    /// back after the whole fleet went down).
    Serving,
    /// No backend serves the current version any more, outside a sync (every server went
    /// down mid-run): the `serve_timeout` deadline starts, as after a sync nobody loaded.
    Unserved,
    /// Stop early (Ctrl-C, SIGTERM).
    Stop,
}

/// What the driver must do, in order.
#[derive(Debug)]
pub enum CoreAction<T> {
    /// Run one group's rollout from task seed `seed`; report it as `GroupFinished { key }`
    /// (or `GroupLost`).
    StartGroup {
        key: GroupKey,
        seed: u64,
        version: PolicyVersion,
    },
    /// Train one step on `batch` (which starts from `batch.version`); report
    /// `TrainFinished`.
    Train { batch: Batch<T> },
    /// Publish the finished step's weights to the backends (pause → update → resume);
    /// report `SyncFinished`.
    Sync { version: PolicyVersion },
    /// The step is published: the buffer moved to its version. Record it.
    Published(Box<PublishedStep>),
    /// Abort every running group (a stop); their outcomes are still reported.
    AbortRollout,
    /// The run is over: drain the running groups, then [`ControllerCore::close`].
    Done(RunEnd),
}

/// Why the run ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunEnd {
    /// Every step ran.
    Completed,
    /// A stop was asked for.
    Interrupted,
    /// No backend served `version` for `waited` after its sync.
    Stalled {
        version: PolicyVersion,
        waited: Duration,
    },
    /// Between steps, no group added a sample to the buffer for `waited`: what ended in that
    /// time is `failed` and `filtered` samples (an environment or server failing every
    /// trajectory, or a filter no group passes).
    NoProgress {
        version: PolicyVersion,
        waited: Duration,
        /// Samples started by the groups still running then.
        running: u64,
        failed: u64,
        filtered: u64,
    },
}

/// One published step, with the controller's view of it (the driver adds what it knows
/// about the samples themselves).
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedStep {
    /// The step's number in the whole run.
    pub step: usize,
    /// The version it trained from (it published `version + 1`).
    pub version: PolicyVersion,
    /// Samples trained on.
    pub samples: usize,
    /// Mean (version − start version) of the batch.
    pub staleness: f64,
    /// Samples of the batch by staleness, ascending.
    pub staleness_hist: Vec<(u64, u64)>,
    /// Largest staleness in the batch; never above ⌈α⌉.
    pub staleness_max: u64,
    /// Time from the previous publication (or the start) to this one.
    pub wall: Duration,
    /// Time the step trained.
    pub train: Duration,
    /// Time the trainer waited for the batch.
    pub wait: Duration,
    /// Time the weight sync took.
    pub sync: Duration,
    /// Time within `wall` when no group was running, or generation was paused for the sync.
    pub rollout_idle: Duration,
    /// Time since the run started.
    pub elapsed: Duration,
    /// Where samples ended, including earlier processes of a resumed run.
    pub accounting: Accounting,
    /// Where the run stands after this step.
    pub cursor: Cursor,
}

/// The end of a run: what a final report (and a checkpoint of the end) needs.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreSummary {
    pub accounting: Accounting,
    pub cursor: Cursor,
    /// Trained samples by staleness.
    pub staleness: Vec<(u64, u64)>,
    /// Groups lost (their task panicked), with the reasons.
    pub lost_groups: Vec<String>,
    pub wall: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Syncing,
    Done,
}

/// The step in flight, from `Train` to `Published`.
#[derive(Debug)]
struct InFlight {
    version: PolicyVersion,
    samples: usize,
    staleness: f64,
    staleness_hist: Vec<(u64, u64)>,
    started: Duration,
    waited: Duration,
    /// When training ended and the sync began.
    trained: Option<Duration>,
}

/// The controller state machine. `T` is what the driver stores per sample.
#[derive(Debug)]
pub struct ControllerCore<T> {
    cfg: CoreConfig,
    buffer: SampleBuffer<T>,
    phase: Phase,
    stopping: bool,
    next_seed: u64,
    steps_done: usize,
    base: Accounting,
    /// Finished groups not yet handed to the buffer.
    pending: VecDeque<(GroupKey, Option<GroupOutcome<T>>)>,
    step: Option<InFlight>,
    start: Duration,
    last_publish: Duration,
    wait_since: Option<Duration>,
    /// Set when the last event left no group running (outside a sync): rollout is idle from
    /// then until the next event.
    idle_since: Option<Duration>,
    rollout_idle: Duration,
    /// The newest version has no backend serving it since then.
    unserved_since: Option<Duration>,
    /// When a sample last entered the buffer (or a step started or was published), and the
    /// accounting then: the progress deadline runs from it.
    progress_at: Duration,
    progress_mark: (u64, Accounting),
    lost: Vec<String>,
}

/// What a run waits on at one moment: the answer to "why no step?", which a driver reports
/// when none has been published for a while.
#[derive(Debug, Clone, PartialEq)]
pub enum Waiting {
    /// The trainer waits for a batch: `ready_groups` of `groups_per_batch` whole groups are
    /// in the buffer, `running_groups` are being rolled out, `admissible` more may start.
    Batch {
        ready_groups: usize,
        groups_per_batch: usize,
        running_groups: usize,
        admissible: usize,
    },
    /// A step trains from `version`, since `for_` ago.
    Training {
        version: PolicyVersion,
        for_: Duration,
    },
    /// The weights `version` are being synced to the backends, since `for_` ago.
    Sync {
        version: PolicyVersion,
        for_: Duration,
    },
    /// No backend serves `version`, for `for_`; the run stops at the serve deadline.
    Unserved {
        version: PolicyVersion,
        for_: Duration,
        timeout: Duration,
    },
    /// A stop was asked for; the run drains.
    Stopping,
    /// The run ended.
    Done,
}

/// How many lost-group reasons a summary keeps (the count is in the accounting).
const LOST_REASONS_KEPT: usize = 16;

impl<T> ControllerCore<T> {
    /// A controller starting at `now`, from scratch or from a checkpoint's cursor.
    pub fn new(
        cfg: CoreConfig,
        resume: Option<ResumeFrom>,
        now: Duration,
    ) -> Result<Self, BufferConfigError> {
        cfg.buffer.validate()?;
        let (buffer, next_seed, steps_done, base) = match resume {
            Some(r) => (
                SampleBuffer::starting_at(cfg.buffer.clone(), r.cursor.version),
                r.cursor.next_seed,
                r.cursor.steps_done,
                r.accounting,
            ),
            None => (
                SampleBuffer::new(cfg.buffer.clone()),
                cfg.seed,
                0,
                Accounting::default(),
            ),
        };
        let phase = if steps_done >= cfg.steps {
            Phase::Done
        } else {
            Phase::Running
        };
        Ok(ControllerCore {
            cfg,
            buffer,
            phase,
            stopping: false,
            next_seed,
            steps_done,
            base,
            pending: VecDeque::new(),
            step: None,
            start: now,
            last_publish: now,
            wait_since: Some(now),
            idle_since: None,
            rollout_idle: Duration::ZERO,
            unserved_since: None,
            progress_at: now,
            progress_mark: (0, Accounting::default()),
            lost: Vec::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// The buffer (read-only: its state is the core's).
    pub fn buffer(&self) -> &SampleBuffer<T> {
        &self.buffer
    }

    /// Whether a training step (or its sync) is in flight.
    pub fn training(&self) -> bool {
        self.step.is_some()
    }

    /// Whether a stop was asked for.
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// What the run waits on at `now` (see [`Waiting`]).
    pub fn waiting(&self, now: Duration) -> Waiting {
        if self.phase == Phase::Done {
            return Waiting::Done;
        }
        if self.stopping {
            return Waiting::Stopping;
        }
        if let Some(t) = self.unserved_since {
            return Waiting::Unserved {
                version: self.buffer.version(),
                for_: now.saturating_sub(t),
                timeout: self.cfg.serve_timeout,
            };
        }
        match (&self.step, self.phase) {
            (Some(s), Phase::Syncing) => Waiting::Sync {
                version: s.version.next(),
                for_: now.saturating_sub(s.trained.unwrap_or(s.started)),
            },
            (Some(s), _) => Waiting::Training {
                version: s.version,
                for_: now.saturating_sub(s.started),
            },
            (None, _) => Waiting::Batch {
                ready_groups: self.buffer.ready_groups(),
                groups_per_batch: self.cfg.buffer.groups_per_batch,
                running_groups: self.buffer.running_groups(),
                admissible: self.buffer.admissible(),
            },
        }
    }

    /// Time since the last step was published (or the run started).
    pub fn since_publish(&self, now: Duration) -> Duration {
        now.saturating_sub(self.last_publish)
    }

    /// Whether `Done` was emitted.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Whether the newest version waits for a backend to serve it, and the time by which one
    /// must (a driver checks its backends until then, and reports `Tick` at the deadline).
    pub fn serve_deadline(&self) -> Option<Duration> {
        self.unserved_since.map(|t| t + self.cfg.serve_timeout)
    }

    /// The time by which a sample must enter the buffer (between steps), or the run stops as
    /// [`RunEnd::NoProgress`]; the driver reports `Tick` at it.
    pub fn progress_deadline(&self) -> Option<Duration> {
        if self.phase != Phase::Running || self.step.is_some() || self.stopping {
            return None;
        }
        self.progress_at.checked_add(self.cfg.progress_timeout)
    }

    /// Where samples ended so far, including earlier processes of a resumed run.
    pub fn accounting(&self) -> Accounting {
        add(self.base, self.buffer.accounting())
    }

    /// Where the run stands now.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            steps_done: self.steps_done,
            version: self.buffer.version(),
            next_seed: self.next_seed,
        }
    }

    /// Handles one event at time `now` and appends the resulting actions to `out`.
    pub fn handle(&mut self, now: Duration, ev: CoreEvent<T>, out: &mut Vec<CoreAction<T>>) {
        if let Some(t) = self.idle_since.take() {
            self.rollout_idle += now.saturating_sub(t);
        }
        match ev {
            CoreEvent::Tick => {}
            CoreEvent::GroupFinished { key, outcome } => self.group_ended(key, Some(outcome)),
            CoreEvent::GroupLost { key, reason } => {
                if self.lost.len() < LOST_REASONS_KEPT {
                    self.lost.push(reason);
                }
                self.group_ended(key, None);
            }
            CoreEvent::TrainFinished => {
                // After `Done` the driver only drains: a step still training then is not
                // published (the summary's cursor stays at the last published version).
                let running = self.phase == Phase::Running;
                if let Some(s) = self
                    .step
                    .as_mut()
                    .filter(|s| running && s.trained.is_none())
                {
                    s.trained = Some(now);
                    self.phase = Phase::Syncing;
                    out.push(CoreAction::Sync {
                        version: s.version.next(),
                    });
                }
            }
            CoreEvent::SyncFinished { serving } => self.publish(now, serving, out),
            CoreEvent::Serving => self.unserved_since = None,
            CoreEvent::Unserved => {
                if self.phase != Phase::Done && self.unserved_since.is_none() {
                    self.unserved_since = Some(now);
                }
            }
            CoreEvent::Stop => {
                if !self.stopping && self.phase != Phase::Done {
                    self.stopping = true;
                    self.pending_to_buffer();
                    self.buffer.shutdown();
                    out.push(CoreAction::AbortRollout);
                }
            }
        }
        self.advance(now, out);
    }

    /// Counts what never reported as aborted and sums the run up. Call once, after `Done`,
    /// when the driver has drained (and reported) every group it could; the core takes no
    /// events after it.
    pub fn close(&mut self, now: Duration) -> CoreSummary {
        self.phase = Phase::Done;
        self.pending_to_buffer();
        // Groups whose tasks were cancelled never reported.
        for key in self.buffer.running_keys() {
            self.buffer.finish(
                key,
                GroupOutcome {
                    samples: Vec::new(),
                    aborted: 0,
                    failed: 0,
                },
            );
        }
        // Last, so groups that finished while being drained are not left buffered.
        self.buffer.shutdown();
        CoreSummary {
            accounting: self.accounting(),
            cursor: self.cursor(),
            staleness: self
                .buffer
                .staleness_histogram()
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect(),
            lost_groups: std::mem::take(&mut self.lost),
            wall: now.saturating_sub(self.start),
        }
    }

    fn group_ended(&mut self, key: GroupKey, outcome: Option<GroupOutcome<T>>) {
        // Groups that end during a sync wait for the publication, as they do in the real
        // controller (which is awaiting the sync): the buffer sees them at the new version.
        if self.phase != Phase::Done && !self.stopping {
            self.pending.push_back((key, outcome));
        } else {
            // Draining: count at once.
            self.finish_group(key, outcome);
        }
    }

    fn finish_group(&mut self, key: GroupKey, outcome: Option<GroupOutcome<T>>) {
        let outcome = outcome.unwrap_or_else(|| GroupOutcome {
            samples: Vec::new(),
            aborted: 0,
            failed: self.cfg.group_samples(),
        });
        self.buffer.finish(key, outcome);
    }

    fn pending_to_buffer(&mut self) {
        while let Some((key, outcome)) = self.pending.pop_front() {
            self.finish_group(key, outcome);
        }
    }

    /// The controller's loop: admission → a training step → one finished group, until
    /// nothing changes; then the end checks.
    fn advance(&mut self, now: Duration, out: &mut Vec<CoreAction<T>>) {
        // A stall is declared only between steps: a step in flight is still synced and
        // published (that sync may bring a backend back), so learner and cursor agree.
        let stall_due = self
            .serve_deadline()
            .is_some_and(|deadline| now >= deadline);
        if self.phase == Phase::Running && !self.stopping && !stall_due {
            loop {
                while let Some((key, version)) = self.buffer.try_start(self.cfg.group_samples()) {
                    let seed = self.next_seed;
                    self.next_seed += 1;
                    out.push(CoreAction::StartGroup { key, seed, version });
                }
                if self.step.is_none() {
                    if let Some(batch) = self.buffer.take_batch() {
                        self.mark_progress(now);
                        self.step = Some(in_flight(&batch, now, self.wait_since.take()));
                        out.push(CoreAction::Train { batch });
                    }
                }
                match self.pending.pop_front() {
                    Some((key, outcome)) => self.finish_group(key, outcome),
                    None => break,
                }
            }
        }
        // After the finished groups reached the buffer: a sample among them is progress.
        self.note_progress(now);
        let no_progress = self.progress_deadline().is_some_and(|d| now >= d);
        if no_progress {
            let a = self.buffer.accounting();
            let then = self.progress_mark.1;
            let end = RunEnd::NoProgress {
                version: self.buffer.version(),
                waited: now.saturating_sub(self.progress_at),
                running: a.running,
                failed: a.failed.saturating_sub(then.failed),
                filtered: a.filtered.saturating_sub(then.filtered),
            };
            self.done(end, out);
            return;
        }
        if self.phase == Phase::Running && self.step.is_none() {
            if let (true, Some(since)) = (stall_due, self.unserved_since) {
                let end = RunEnd::Stalled {
                    version: self.buffer.version(),
                    waited: now.saturating_sub(since),
                };
                self.done(end, out);
            } else if self.stopping {
                self.done(RunEnd::Interrupted, out);
            }
        }
        if self.phase == Phase::Running && self.buffer.running_groups() == 0 {
            self.idle_since = Some(now);
        }
    }

    fn publish(&mut self, now: Duration, serving: bool, out: &mut Vec<CoreAction<T>>) {
        let Some(s) = self.step.take() else {
            return;
        };
        let trained = s.trained.unwrap_or(now);
        let version = s.version.next();
        // Generation is paused for the sync (or nothing runs at all).
        let sync = now.saturating_sub(trained);
        self.rollout_idle += sync;
        self.buffer.publish(version);
        self.steps_done += 1;
        if serving {
            self.unserved_since = None;
        } else if self.unserved_since.is_none() {
            self.unserved_since = Some(now);
        }
        let staleness_max = s.staleness_hist.last().map_or(0, |(k, _)| *k);
        out.push(CoreAction::Published(Box::new(PublishedStep {
            step: self.steps_done - 1,
            version: s.version,
            samples: s.samples,
            staleness: s.staleness,
            staleness_hist: s.staleness_hist,
            staleness_max,
            wall: now.saturating_sub(self.last_publish),
            train: trained.saturating_sub(s.started),
            wait: s.waited,
            sync,
            rollout_idle: std::mem::take(&mut self.rollout_idle),
            elapsed: now.saturating_sub(self.start),
            accounting: self.accounting(),
            cursor: self.cursor(),
        })));
        self.last_publish = now;
        self.wait_since = Some(now);
        self.mark_progress(now);
        if self.phase == Phase::Syncing {
            self.phase = Phase::Running;
        }
        if self.steps_done >= self.cfg.steps && self.phase == Phase::Running {
            self.done(RunEnd::Completed, out);
        }
    }

    /// Moves the progress mark when samples entered the buffer since the last look (every
    /// sample that ever entered is counted as buffered, trained or dropped from it, until a
    /// stop aborts what is buffered).
    fn note_progress(&mut self, now: Duration) {
        let entered = entered(&self.buffer.accounting());
        if entered > self.progress_mark.0 {
            self.mark_progress(now);
        }
    }

    /// Progress now: the deadline restarts, and the report counts what ends from here.
    fn mark_progress(&mut self, now: Duration) {
        let a = self.buffer.accounting();
        self.progress_at = now;
        self.progress_mark = (entered(&a).max(self.progress_mark.0), a);
    }

    fn done(&mut self, end: RunEnd, out: &mut Vec<CoreAction<T>>) {
        self.phase = Phase::Done;
        self.idle_since = None;
        self.pending_to_buffer();
        out.push(CoreAction::Done(end));
    }
}

/// Samples that ever entered the buffer (until a stop aborts buffered ones).
fn entered(a: &Accounting) -> u64 {
    a.buffered + a.trained + a.dropped_stale
}

fn in_flight<T>(batch: &Batch<T>, now: Duration, wait_since: Option<Duration>) -> InFlight {
    let mut hist = BTreeMap::<u64, u64>::new();
    for g in &batch.groups {
        *hist
            .entry(batch.version.0.saturating_sub(g.start.0))
            .or_default() += g.samples.len() as u64;
    }
    InFlight {
        version: batch.version,
        samples: batch.len(),
        staleness: batch.mean_staleness(),
        staleness_hist: hist.into_iter().collect(),
        started: now,
        waited: wait_since.map_or(Duration::ZERO, |t| now.saturating_sub(t)),
        trained: None,
    }
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
