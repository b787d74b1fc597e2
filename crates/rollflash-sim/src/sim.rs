//! The discrete-event simulation: a virtual clock and an event queue drive the real
//! scheduling state machines — `ProxyScheduler` (queueing, routing, admission per worker,
//! aborts, pause/resume), `SampleBuffer` (α admission, whole-group batches, staleness,
//! filtering, barrier, accounting) and `GroupProgress` (redundancy) — against modelled
//! workers, trainers and environments.
//!
//! The controller is `rollflash_core::controller::ControllerCore`, the very state machine
//! `AsyncController` drives: this file reports what the modelled world did (a group ended, a
//! step trained, a sync finished) and carries out the core's actions (start a group, train,
//! pause → update → resume the workers). While the weights sync, nothing else is decided, as
//! in the real controller, which awaits `sync_weights`.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollflash_core::buffer::{Batch, GroupKey, GroupOutcome};
use rollflash_core::controller::{
    ControllerCore, CoreAction, CoreConfig, CoreEvent, CoreSummary, PublishedStep,
};
use rollflash_core::proxy::{
    Affinity, BackendId, Completion, GroupId, Outcome, ProxyAction, ProxyEvent, ProxySchedConfig,
    ProxyScheduler,
};
use rollflash_core::redundancy::{GroupDecision, GroupProgress, MemberEnd};
use rollflash_core::{PolicyVersion, RequestId};

use crate::config::SimConfig;
use crate::report::{SimReport, StepRecord};
use crate::worker::{Departure, Left, Seq, Wake, Worker};
use crate::SimError;

/// Bound on processed events, so a configuration that never finishes fails instead of
/// spinning.
const MAX_EVENTS: u64 = 200_000_000;

/// What the buffer stores per sample.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Tokens the trainer processes (the whole sequence).
    seq_tokens: u64,
    /// Model tokens (the response turns).
    response_tokens: u64,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Boundary {
        worker: usize,
        epoch: u64,
    },
    /// An environment reset (`turn == None`) or step finished.
    Env {
        traj: u64,
        turn: Option<u32>,
    },
    TrainDone {
        epoch: u64,
    },
    SyncDone,
}

/// An event in the queue, ordered by time then by insertion.
#[derive(Debug)]
struct Queued {
    at: f64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    // Reversed: `BinaryHeap` is a max-heap and we want the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at
            .total_cmp(&self.at)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// One turn of a trajectory, drawn when the trajectory starts.
#[derive(Debug, Clone, Copy)]
struct TurnPlan {
    response: u64,
    observation: u64,
    env_s: f64,
    fails: bool,
}

#[derive(Debug)]
struct Traj {
    group: GroupKey,
    wave: u64,
    turns: Vec<TurnPlan>,
    reward: f64,
    turn: u32,
    context: u64,
    response: u64,
    alive: bool,
}

#[derive(Debug)]
struct Group {
    progress: GroupProgress,
    members: Vec<u64>,
    kept: Vec<(Sample, f64)>,
}

#[derive(Debug)]
struct Req {
    traj: u64,
    prompt: u64,
    target: u64,
    generated: u64,
}

/// Work generated while handling an event, done in order before the next event.
#[derive(Debug)]
enum Work {
    Action(ProxyAction),
    Generate(u64),
    EnvStep(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Generate,
    EnvStep,
}

/// Trajectories of one policy version's wave, for lock-step rollout.
#[derive(Debug, Default)]
struct Wave {
    alive: usize,
    waiting: Vec<(u64, Phase)>,
}

/// The step training now (from `Train` to its publication).
#[derive(Debug)]
struct Training {
    start: f64,
    samples: usize,
    response_tokens: u64,
    seq_tokens: u64,
    mean_reward: f64,
    /// Seconds of training left at full speed, as of `updated`.
    work_left: f64,
    updated: f64,
    /// Progress per second now (below 1 while generation shares the hardware).
    rate: f64,
    /// Training is over; the step waits for its sync and publication.
    done: bool,
}

/// The simulation state. Build with [`simulate`].
struct Sim<'a> {
    cfg: &'a SimConfig,
    now: f64,
    seq: u64,
    queue: BinaryHeap<Queued>,
    events: u64,
    sched: ProxyScheduler,
    workers: Vec<Worker>,
    backend_of: HashMap<BackendId, usize>,
    reqs: HashMap<RequestId, Req>,
    next_req: u64,
    trajs: HashMap<u64, Traj>,
    next_traj: u64,
    groups: BTreeMap<GroupKey, Group>,
    waves: BTreeMap<u64, Wave>,
    work: VecDeque<Work>,
    scratch: Vec<ProxyAction>,
    departures: Vec<Departure>,
    // Controller.
    core: ControllerCore<Sample>,
    actions: Vec<CoreAction<Sample>>,
    /// The core's events not yet handled, in order (handled once the world is quiet).
    core_events: VecDeque<CoreEvent<Sample>>,
    training: Option<Training>,
    /// Workers still pausing for the running sync.
    pending_pauses: usize,
    syncing: bool,
    steps: Vec<StepRecord>,
    stopped: bool,
    /// What the core counted at the end.
    summary: Option<CoreSummary>,
    train_busy_s: f64,
    train_spans: Vec<(f64, f64)>,
    gen_spans: Vec<(f64, f64)>,
    /// Invalidates `TrainDone` events rescheduled after a change of speed.
    train_epoch: u64,
    /// Whether any worker was stepping after the last event (for contention).
    gen_busy: bool,
    /// A training step has started (the first one pays `TrainCost::first_step_s`).
    trained_any: bool,
}

/// Runs one simulation. Deterministic: the same config gives the same report.
pub fn simulate(cfg: &SimConfig) -> Result<SimReport, SimError> {
    cfg.validate()?;
    let policy = cfg.cluster.routing.policy();
    let mut sched = ProxyScheduler::new(ProxySchedConfig::default(), policy);
    let mut workers = Vec::new();
    let mut backend_of = HashMap::new();
    for i in 0..cfg.cluster.inference_workers {
        let b = sched.add_backend(cfg.cluster.max_running);
        backend_of.insert(b, i);
        workers.push(Worker::new(cfg.cluster.batching));
    }
    let mut sim = Sim {
        cfg,
        now: 0.0,
        seq: 0,
        queue: BinaryHeap::new(),
        events: 0,
        sched,
        core: ControllerCore::new(
            CoreConfig {
                buffer: cfg.sched.effective_buffer(),
                redundancy: cfg.sched.redundancy,
                steps: cfg.steps,
                seed: cfg.seed,
                // Every modelled worker loads every update: a sync always serves.
                serve_timeout: Duration::MAX,
                // Modelled groups always add their samples.
                progress_timeout: Duration::MAX,
            },
            None,
            Duration::ZERO,
        )
        .map_err(|e| SimError::Config {
            field: "sched.buffer".into(),
            message: e.to_string(),
        })?,
        actions: Vec::new(),
        core_events: VecDeque::from([CoreEvent::Tick]),
        workers,
        backend_of,
        reqs: HashMap::new(),
        next_req: 0,
        trajs: HashMap::new(),
        next_traj: 0,
        groups: BTreeMap::new(),
        waves: BTreeMap::new(),
        work: VecDeque::new(),
        scratch: Vec::new(),
        departures: Vec::new(),
        training: None,
        pending_pauses: 0,
        syncing: false,
        steps: Vec::new(),
        stopped: false,
        summary: None,
        train_busy_s: 0.0,
        train_spans: Vec::new(),
        gen_spans: Vec::new(),
        train_epoch: 0,
        gen_busy: false,
        trained_any: false,
    };
    sim.run()?;
    Ok(sim.report())
}

/// SplitMix64: independent streams from (seed, a, b) without correlations between
/// neighbouring keys.
fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut z = seed
        .wrapping_add(a.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add(b.wrapping_mul(0xd1b5_4a32_d192_ed03));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Sim<'_> {
    fn at(&mut self, at: f64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Queued {
            at: at.max(self.now),
            seq: self.seq,
            ev,
        });
    }

    fn wake(&mut self, worker: usize, w: Wake) {
        if let Wake::At(t) = w {
            let epoch = self.workers[worker].epoch;
            self.at(t, Ev::Boundary { worker, epoch });
        }
    }

    fn run(&mut self) -> Result<(), SimError> {
        self.drain();
        while !self.stopped {
            let Some(q) = self.queue.pop() else {
                return Err(SimError::Stalled {
                    step: self.steps.len(),
                    time_s: self.now,
                });
            };
            self.events += 1;
            if self.events > MAX_EVENTS {
                return Err(SimError::TooManyEvents(MAX_EVENTS));
            }
            self.now = q.at;
            match q.ev {
                Ev::Boundary { worker, epoch } => self.on_boundary(worker, epoch),
                Ev::Env { traj, turn } => self.on_env(traj, turn),
                Ev::TrainDone { epoch } => {
                    if epoch == self.train_epoch {
                        self.on_train_done();
                    }
                }
                Ev::SyncDone => self.on_sync_done(),
            }
            self.drain();
            if self.cfg.cluster.contention.is_active() {
                self.contend();
            }
        }
        self.shutdown();
        Ok(())
    }

    fn proxy(&mut self, ev: ProxyEvent) {
        let now = Duration::from_secs_f64(self.now);
        self.sched.handle(now, ev, &mut self.scratch);
        for a in self.scratch.drain(..) {
            self.work.push_back(Work::Action(a));
        }
    }

    /// Does all work caused by the last event, and hands the controller its events whenever
    /// the world is quiet, until everything is.
    fn drain(&mut self) {
        loop {
            while let Some(w) = self.work.pop_front() {
                match w {
                    Work::Action(a) => self.on_action(a),
                    Work::Generate(t) => self.generate(t),
                    Work::EnvStep(t) => self.env_step(t),
                }
            }
            if self.stopped {
                return;
            }
            let Some(ev) = self.core_events.pop_front() else {
                return;
            };
            self.controller(ev);
        }
    }

    // ---- The controller: the core decides, the simulation carries out ----

    fn controller(&mut self, ev: CoreEvent<Sample>) {
        let now = Duration::from_secs_f64(self.now);
        let mut actions = std::mem::take(&mut self.actions);
        self.core.handle(now, ev, &mut actions);
        for a in actions.drain(..) {
            match a {
                CoreAction::StartGroup { key, version, .. } => self.start_group(key, version),
                CoreAction::Train { batch } => self.start_training(&batch),
                CoreAction::Sync { .. } => self.start_sync(),
                CoreAction::Published(p) => self.published(&p),
                // The simulation is never asked to stop early.
                CoreAction::AbortRollout => {}
                CoreAction::Done(_) => self.stopped = true,
            }
        }
        self.actions = actions;
    }

    fn start_training(&mut self, batch: &Batch<Sample>) {
        let mut seq_tokens = 0;
        let mut response_tokens = 0;
        let mut reward = 0.0;
        for g in &batch.groups {
            for (s, r) in &g.samples {
                seq_tokens += s.seq_tokens;
                response_tokens += s.response_tokens;
                reward += r;
            }
        }
        let samples = batch.len();
        let first = if std::mem::replace(&mut self.trained_any, true) {
            0.0
        } else {
            self.cfg.training.first_step_s
        };
        let dt = first
            + self
                .cfg
                .training
                .step_time(seq_tokens, self.cfg.cluster.train_workers);
        let rate = self.train_rate();
        self.train_epoch += 1;
        let epoch = self.train_epoch;
        self.at(self.now + dt / rate, Ev::TrainDone { epoch });
        self.training = Some(Training {
            start: self.now,
            samples,
            response_tokens,
            seq_tokens,
            mean_reward: reward / samples.max(1) as f64,
            work_left: dt,
            updated: self.now,
            rate,
            done: false,
        });
        self.rescale_workers();
    }

    fn on_train_done(&mut self) {
        let Some(t) = self.training.as_mut().filter(|t| !t.done) else {
            return;
        };
        t.done = true;
        let start = t.start;
        self.train_busy_s += self.now - start;
        self.train_spans.push((start, self.now));
        self.rescale_workers();
        self.core_events.push_back(CoreEvent::TrainFinished);
    }

    /// sync_weights: pause (in the configured mode) → update every worker → resume.
    fn start_sync(&mut self) {
        let mode = self.cfg.sched.pause_mode;
        self.syncing = true;
        self.proxy(ProxyEvent::Pause { mode });
        self.pending_pauses = self.workers.len();
        for i in 0..self.workers.len() {
            let w = self.workers[i].pause(self.now, mode, &self.cfg.inference);
            self.wake(i, w);
        }
    }

    /// Training progress per second now.
    fn train_rate(&self) -> f64 {
        if self.gen_busy {
            1.0 / self.cfg.cluster.contention.train
        } else {
            1.0
        }
    }

    /// Engine steps planned from now on run this much slower while training runs.
    fn rescale_workers(&mut self) {
        let c = &self.cfg.cluster.contention;
        if !c.is_active() {
            return;
        }
        let scale = if self.training.as_ref().is_some_and(|t| !t.done) {
            c.gen
        } else {
            1.0
        };
        for i in 0..self.workers.len() {
            let w = self.workers[i].rescale(self.now, scale, &self.cfg.inference);
            self.wake(i, w);
        }
    }

    /// Generation started or stopped: the training step in progress changes speed.
    fn contend(&mut self) {
        let busy = self.workers.iter().any(Worker::is_busy);
        if busy == self.gen_busy {
            return;
        }
        self.gen_busy = busy;
        let rate = self.train_rate();
        let now = self.now;
        let Some(t) = self.training.as_mut().filter(|t| !t.done) else {
            return;
        };
        t.work_left = (t.work_left - (now - t.updated) * t.rate).max(0.0);
        t.updated = now;
        t.rate = rate;
        let at = now + t.work_left / rate;
        self.train_epoch += 1;
        let epoch = self.train_epoch;
        self.at(at, Ev::TrainDone { epoch });
    }

    fn worker_paused(&mut self) {
        self.pending_pauses = self.pending_pauses.saturating_sub(1);
        if self.pending_pauses == 0 && self.syncing {
            let s = &self.cfg.sync;
            let dt = s.fixed_s + s.worker_s * self.workers.len() as f64;
            self.at(self.now + dt, Ev::SyncDone);
        }
    }

    fn on_sync_done(&mut self) {
        if !std::mem::take(&mut self.syncing) {
            return;
        }
        let version = self.core.buffer().version().next();
        // Every worker loaded the new weights (the real proxy hears it from each update
        // before the resume), then the backends resume and the scheduler dispatches once
        // they generate again.
        for i in 0..self.workers.len() {
            self.proxy(ProxyEvent::WeightsLoaded {
                backend: BackendId(i),
                version,
            });
        }
        for i in 0..self.workers.len() {
            let w = self.workers[i].resume(self.now, &self.cfg.inference);
            self.wake(i, w);
        }
        self.proxy(ProxyEvent::Resume);
        self.core_events
            .push_back(CoreEvent::SyncFinished { serving: true });
    }

    fn published(&mut self, p: &PublishedStep) {
        let Some(t) = self.training.take() else {
            return;
        };
        self.steps.push(StepRecord {
            step: p.step,
            version: p.version.0,
            samples: t.samples,
            response_tokens: t.response_tokens,
            seq_tokens: t.seq_tokens,
            mean_reward: t.mean_reward,
            staleness: p.staleness,
            staleness_max: p.staleness_max,
            wall_s: p.wall.as_secs_f64(),
            train_s: p.train.as_secs_f64(),
            wait_s: p.wait.as_secs_f64(),
            sync_s: p.sync.as_secs_f64(),
            end_s: p.elapsed.as_secs_f64(),
            accounting: p.accounting,
        });
    }

    /// Stop: the core counts what is buffered or still running as aborted — what the real
    /// controller does after its last step.
    fn shutdown(&mut self) {
        let now = Duration::from_secs_f64(self.now);
        self.summary = Some(self.core.close(now));
    }

    // ---- Groups and trajectories (mirror EnvManager::run_group / run_trajectory) ----

    fn start_group(&mut self, key: GroupKey, start: PolicyVersion) {
        let w = &self.cfg.workload;
        let mut grng = ChaCha8Rng::seed_from_u64(mix(self.cfg.seed, key.0, u64::MAX));
        let prompt = w.prompt_tokens.sample(&mut grng);
        // A task's difficulty: each sample succeeds with this probability (only the
        // zero-variance filter looks at rewards).
        let p_success: f64 = grng.random();
        // A measured group replayed instead (validated non-empty).
        let replay = match w.measured_groups.len() {
            0 => None,
            n => w.measured_groups.get((key.0 % n as u64) as usize),
        };
        let progress =
            GroupProgress::new(self.cfg.sched.buffer.group_size, self.cfg.sched.redundancy);
        let mut members = Vec::with_capacity(progress.members());
        for m in 0..progress.members() {
            let mut rng = ChaCha8Rng::seed_from_u64(mix(self.cfg.seed, key.0, m as u64));
            let episode = replay.and_then(|g| g.get(m % g.len().max(1)));
            let reset_s = w.reset_latency.sample(&mut rng);
            let max_turns = episode.map_or(w.max_turns, |e| {
                w.max_turns
                    .min(u32::try_from(e.turns.len()).unwrap_or(u32::MAX))
            });
            let mut turns = Vec::new();
            for t in 0..max_turns {
                let env = w.step_latency.sample(&mut rng);
                let failed: bool = rng.random::<f64>() < w.failure_rate;
                let hang = failed && rng.random::<f64>() < w.hang_fraction;
                let env_s = if hang {
                    w.step_timeout_s
                } else {
                    env.min(w.step_timeout_s)
                };
                // A step slower than the timeout fails at the timeout, as in the real
                // `EnvManager`.
                let fails = failed || env > w.step_timeout_s;
                let (response, observation) = match episode.and_then(|e| e.turns.get(t as usize)) {
                    Some(turn) => (turn.response_tokens, turn.observation_tokens),
                    None => (
                        w.response_tokens.sample(&mut rng),
                        w.observation_tokens.sample(&mut rng),
                    ),
                };
                turns.push(TurnPlan {
                    response,
                    observation,
                    env_s,
                    fails,
                });
                // A replayed episode ends where the measured one did; draws keep their order
                // (no end draw after a failure).
                if fails
                    || (episode.is_none()
                        && t + 1 < w.max_turns
                        && rng.random::<f64>() < w.end_prob)
                {
                    break;
                }
            }
            let drawn = if rng.random::<f64>() < p_success {
                1.0
            } else {
                0.0
            };
            let reward = episode.map_or(drawn, |e| e.reward);
            let context = episode.map_or(prompt, |e| e.prompt_tokens);
            let id = self.next_traj;
            self.next_traj += 1;
            self.trajs.insert(
                id,
                Traj {
                    group: key,
                    wave: start.0,
                    turns,
                    reward,
                    turn: 0,
                    context,
                    response: 0,
                    alive: true,
                },
            );
            self.waves.entry(start.0).or_default().alive += 1;
            members.push(id);
            self.at(
                self.now + reset_s,
                Ev::Env {
                    traj: id,
                    turn: None,
                },
            );
        }
        self.groups.insert(
            key,
            Group {
                progress,
                members,
                kept: Vec::new(),
            },
        );
    }

    fn on_env(&mut self, traj: u64, turn: Option<u32>) {
        let Some(t) = self.trajs.get(&traj) else {
            return;
        };
        if !t.alive {
            return;
        }
        let Some(turn) = turn else {
            self.ready(traj, Phase::Generate);
            return;
        };
        let plan = t.turns[turn as usize];
        if plan.fails {
            self.end_traj(traj, MemberEnd::Failed);
            return;
        }
        let last = turn as usize + 1 >= t.turns.len();
        let max_total = self.cfg.workload.max_total_tokens;
        let Some(t) = self.trajs.get_mut(&traj) else {
            return;
        };
        if last {
            self.end_traj(traj, MemberEnd::Usable);
            return;
        }
        t.context += plan.observation;
        t.turn += 1;
        if t.context >= max_total {
            // No room left for the model to answer this observation.
            self.end_traj(traj, MemberEnd::Usable);
            return;
        }
        self.ready(traj, Phase::Generate);
    }

    /// A trajectory is ready for its next phase: at once, or when its whole wave is
    /// (lock-step rollout).
    fn ready(&mut self, traj: u64, phase: Phase) {
        if !self.cfg.sched.lockstep {
            self.work.push_back(match phase {
                Phase::Generate => Work::Generate(traj),
                Phase::EnvStep => Work::EnvStep(traj),
            });
            return;
        }
        let Some(wave) = self.trajs.get(&traj).map(|t| t.wave) else {
            return;
        };
        self.waves
            .entry(wave)
            .or_default()
            .waiting
            .push((traj, phase));
        self.release(wave);
    }

    fn release(&mut self, wave: u64) {
        let Some(w) = self.waves.get_mut(&wave) else {
            return;
        };
        if w.waiting.is_empty() || w.waiting.len() < w.alive {
            return;
        }
        let mut all = std::mem::take(&mut w.waiting);
        all.sort_by_key(|(t, _)| *t);
        for (t, phase) in all {
            self.work.push_back(match phase {
                Phase::Generate => Work::Generate(t),
                Phase::EnvStep => Work::EnvStep(t),
            });
        }
    }

    /// Submits the trajectory's next turn to the proxy.
    fn generate(&mut self, traj: u64) {
        let w = &self.cfg.workload;
        let Some(t) = self.trajs.get(&traj) else {
            return;
        };
        if !t.alive {
            return;
        }
        let room = w.max_total_tokens.saturating_sub(t.context);
        if room == 0 {
            self.end_traj(traj, MemberEnd::Usable);
            return;
        }
        // A response has at least its stop token.
        let target = t.turns[t.turn as usize]
            .response
            .clamp(1, w.max_new_tokens)
            .min(room);
        let affinity = if self.cfg.sched.replication {
            Affinity::Sticky(traj)
        } else {
            Affinity::Pinned(t.group.0)
        };
        let group = GroupId(t.group.0);
        let id = RequestId(self.next_req);
        self.next_req += 1;
        self.reqs.insert(
            id,
            Req {
                traj,
                prompt: t.context,
                target,
                generated: 0,
            },
        );
        self.proxy(ProxyEvent::Submit {
            id,
            group: Some(group),
            affinity,
        });
    }

    fn env_step(&mut self, traj: u64) {
        let Some(t) = self.trajs.get(&traj) else {
            return;
        };
        if !t.alive {
            return;
        }
        let dt = t.turns[t.turn as usize].env_s;
        let turn = t.turn;
        self.at(
            self.now + dt,
            Ev::Env {
                traj,
                turn: Some(turn),
            },
        );
    }

    fn end_traj(&mut self, traj: u64, end: MemberEnd) {
        let Some(t) = self.trajs.get_mut(&traj) else {
            return;
        };
        if !t.alive {
            return;
        }
        t.alive = false;
        let (key, wave) = (t.group, t.wave);
        let sample = (
            Sample {
                seq_tokens: t.context,
                response_tokens: t.response,
            },
            t.reward,
        );
        self.sched.forget_affinity(traj);
        self.leave_wave(wave, traj);
        let Some(g) = self.groups.get_mut(&key) else {
            return;
        };
        if end == MemberEnd::Usable {
            g.kept.push(sample);
        }
        if let GroupDecision::Done { .. } = g.progress.record(end) {
            self.finish_group(key);
        }
    }

    fn leave_wave(&mut self, wave: u64, traj: u64) {
        if let Some(w) = self.waves.get_mut(&wave) {
            w.alive = w.alive.saturating_sub(1);
            w.waiting.retain(|(t, _)| *t != traj);
            if w.alive == 0 && w.waiting.is_empty() {
                self.waves.remove(&wave);
            } else {
                self.release(wave);
            }
        }
    }

    /// The group is over: stop the surplus (in the environment and on the workers) and
    /// hand the outcome to the controller.
    fn finish_group(&mut self, key: GroupKey) {
        let Some(g) = self.groups.remove(&key) else {
            return;
        };
        for &m in &g.members {
            if let Some(t) = self.trajs.get_mut(&m) {
                if t.alive {
                    t.alive = false;
                    let wave = t.wave;
                    self.sched.forget_affinity(m);
                    self.leave_wave(wave, m);
                }
            }
        }
        for m in &g.members {
            self.trajs.remove(m);
        }
        self.proxy(ProxyEvent::AbortGroup {
            group: GroupId(key.0),
        });
        let outcome = GroupOutcome {
            samples: g.kept,
            aborted: g.progress.aborted() as u64,
            failed: g.progress.failed() as u64,
        };
        self.core_events
            .push_back(CoreEvent::GroupFinished { key, outcome });
    }

    // ---- Proxy actions and workers ----

    fn on_action(&mut self, a: ProxyAction) {
        match a {
            ProxyAction::Dispatch {
                id,
                backend,
                attempt,
            } => {
                let (Some(r), Some(&w)) = (self.reqs.get(&id), self.backend_of.get(&backend))
                else {
                    return;
                };
                let context = r.prompt + r.generated;
                let seq = Seq {
                    id,
                    attempt,
                    context,
                    generated: r.generated,
                    target: r.target,
                    prefill: context,
                };
                let wk = self.workers[w].dispatch(self.now, seq, &self.cfg.inference);
                self.wake(w, wk);
            }
            ProxyAction::Cancel { id, backend } => {
                if let Some(&w) = self.backend_of.get(&backend) {
                    let wk = self.workers[w].cancel(self.now, id, &self.cfg.inference);
                    self.wake(w, wk);
                }
            }
            ProxyAction::Complete { id, completion } => {
                let Some(r) = self.reqs.remove(&id) else {
                    return;
                };
                let traj = r.traj;
                match completion {
                    Completion::Done => {
                        let Some(t) = self.trajs.get_mut(&traj) else {
                            return;
                        };
                        if !t.alive {
                            return;
                        }
                        t.context += r.generated;
                        t.response += r.generated;
                        self.ready(traj, Phase::EnvStep);
                    }
                    Completion::Aborted => self.end_traj(traj, MemberEnd::Aborted),
                    Completion::Failed { .. } => self.end_traj(traj, MemberEnd::Failed),
                }
            }
        }
    }

    fn on_boundary(&mut self, worker: usize, epoch: u64) {
        let Some(w) = self.workers.get_mut(worker) else {
            return;
        };
        if w.epoch != epoch || w.boundary_at.is_none() {
            return;
        }
        let mut deps = std::mem::take(&mut self.departures);
        let span_start = w.segment_start();
        let (paused, wake) = w.boundary(self.now, &self.cfg.inference, &mut deps);
        if let Some(t0) = span_start {
            if self.now > t0 {
                self.gen_spans.push((t0, self.now));
            }
        }
        self.wake(worker, wake);
        let backend = BackendId(worker);
        for d in deps.drain(..) {
            if let Some(r) = self.reqs.get_mut(&d.id) {
                r.generated = d.generated;
            }
            let outcome = match d.left {
                Left::Done => Outcome::Done,
                Left::Aborted => Outcome::Aborted,
            };
            self.proxy(ProxyEvent::Finished {
                id: d.id,
                backend,
                attempt: d.attempt,
                outcome,
            });
        }
        self.departures = deps;
        if paused {
            self.worker_paused();
        }
    }

    // ---- Results ----

    fn report(&mut self) -> SimReport {
        let wall = self.now.max(1e-12);
        let workers = self.workers.len().max(1) as f64;
        let gen_busy: f64 = self.workers.iter().map(|w| w.busy_s).sum();
        let summary = match self.summary.take() {
            Some(s) => s,
            None => self.core.close(Duration::from_secs_f64(self.now)),
        };
        SimReport {
            accounting: summary.accounting,
            wall_s: self.now,
            trained_samples: self.steps.iter().map(|s| s.samples as u64).sum(),
            trained_response_tokens: self.steps.iter().map(|s| s.response_tokens).sum(),
            staleness: summary.staleness,
            rollout_util: gen_busy / (workers * wall),
            train_util: self.train_busy_s / wall,
            gen_train_overlap_s: overlap(&self.gen_spans, &self.train_spans),
            decode_tokens: self.workers.iter().map(|w| w.tokens).sum(),
            proxy: self.sched.counters().clone(),
            events: self.events,
            steps: self.steps.clone(),
        }
    }
}

/// Total time during which some span of `a` and some span of `b` both ran.
fn overlap(a: &[(f64, f64)], b: &[(f64, f64)]) -> f64 {
    let merge = |s: &[(f64, f64)]| {
        let mut v = s.to_vec();
        v.sort_by(|x, y| x.0.total_cmp(&y.0));
        let mut out: Vec<(f64, f64)> = Vec::new();
        for (s, e) in v {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        out
    };
    let (a, b) = (merge(a), merge(b));
    let (mut i, mut j, mut total) = (0, 0, 0.0);
    while i < a.len() && j < b.len() {
        let lo = a[i].0.max(b[j].0);
        let hi = a[i].1.min(b[j].1);
        if hi > lo {
            total += hi - lo;
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    total
}
