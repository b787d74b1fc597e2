//! The proxy's queueing and routing decisions as a plain state machine: events and a clock
//! value in, actions out, no I/O. The async `LLMProxy` drives it with real time and real
//! backends; `rollflash sim` drives the very same code with a virtual clock.
//!
//! What it decides:
//! - **Admission** (queue scheduling): each backend runs at most its `capacity` requests;
//!   the rest wait in one FIFO queue and are dispatched the moment a slot frees — never in
//!   batches.
//! - **Routing**: which backend gets a request, through a [`RoutingPolicy`].
//! - **Aborts**: by request and by group; queued requests leave at once, running ones are
//!   cancelled on their backend and complete as aborted when it answers.
//! - **Pause / resume**: nothing is dispatched while paused. In `Abort` mode the requests
//!   that were running come back aborted and are re-queued at the front (the driver keeps
//!   their partial output and resumes from it); in `Keep` mode they simply go on.
//! - **Failures**: a retryable failure, or its backend leaving rotation, re-queues a request
//!   (up to `max_retries`); a reply from an attempt that is no longer current is ignored, so
//!   no request completes twice.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::{PauseMode, RequestId};

/// Index of a backend in the order they were added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendId(pub usize);

/// The requests of one task (the `n` responses of one prompt, or one environment group).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupId(pub u64);

/// Where a request would like to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Affinity {
    /// Anywhere the policy picks.
    None,
    /// Prefer the backend earlier requests with this key ran on (a multi-turn trajectory
    /// keeps its prefix cache); go elsewhere only if that backend left rotation. Honoured by
    /// the `sticky` routing policy.
    Sticky(u64),
    /// Run on the same backend as every other live request with this key, whatever the
    /// policy: the `n` samples of one prompt served as one `n`-per-request call, the way
    /// a server with `n > 1` runs them (the alternative to prompt replication).
    Pinned(u64),
}

/// How a backend answered one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Finished (stop or length).
    Done,
    /// Aborted: by us (abort, pause in abort mode) or by the backend.
    Aborted,
    /// Failed. Retryable failures (connection, timeout) are tried again, elsewhere if need be.
    Failed { retryable: bool, reason: String },
}

/// How a request ended, as reported to its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    Done,
    /// Aborted by `Abort` / `AbortGroup`; the partial output is returned.
    Aborted,
    /// Failed for good (not retryable, or out of retries).
    Failed {
        reason: String,
    },
}

/// Inputs of the state machine.
#[derive(Debug, Clone, PartialEq)]
pub enum ProxyEvent {
    /// A new request.
    Submit {
        id: RequestId,
        group: Option<GroupId>,
        affinity: Affinity,
    },
    /// A backend answered attempt `attempt` of request `id`.
    Finished {
        id: RequestId,
        backend: BackendId,
        attempt: u32,
        outcome: Outcome,
    },
    /// Abort one request.
    Abort { id: RequestId },
    /// Abort every request of a group (its filter already decided, or redundancy is met).
    AbortGroup { group: GroupId },
    /// Stop dispatching (weight sync). The driver pauses the backends itself.
    Pause { mode: PauseMode },
    /// Dispatch again.
    Resume,
    /// A backend failed its health check: its running requests are re-queued.
    BackendDown { backend: BackendId },
    /// A backend is healthy (again).
    BackendUp { backend: BackendId },
}

/// Outputs of the state machine, to be carried out by the driver in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyAction {
    /// Send the request to the backend; its answer comes back as `Finished` with `attempt`.
    Dispatch {
        id: RequestId,
        backend: BackendId,
        attempt: u32,
    },
    /// Ask the backend to abort the request (it will still answer, as aborted).
    Cancel { id: RequestId, backend: BackendId },
    /// The request is over; answer its caller.
    Complete {
        id: RequestId,
        completion: Completion,
    },
}

/// What a routing policy sees of one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendView {
    pub id: BackendId,
    pub running: usize,
    pub capacity: usize,
    pub healthy: bool,
}

impl BackendView {
    /// Whether it can take one more request now.
    pub fn has_room(&self) -> bool {
        self.healthy && self.running < self.capacity
    }
}

/// Picks a backend for a request among `backends` (all of them, in id order; some may be
/// full or unhealthy). Returning `None` means "not now": the request keeps its place in the
/// queue and later requests may go first.
pub trait RoutingPolicy: Send {
    /// The policy's name in configs and metrics.
    fn name(&self) -> &'static str;
    /// Chooses a backend with room, or `None` to wait.
    fn select(&mut self, affinity: Affinity, backends: &[BackendView]) -> Option<BackendId>;
    /// The trajectory behind a sticky key ended; its next request may go anywhere.
    fn forget(&mut self, _key: u64) {}
}

/// Cycles through the backends with room.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RoutingPolicy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }
    fn select(&mut self, _affinity: Affinity, backends: &[BackendView]) -> Option<BackendId> {
        let n = backends.len();
        (0..n)
            .map(|k| (self.next + k) % n)
            .find(|&i| backends[i].has_room())
            .map(|i| {
                self.next = (i + 1) % n;
                backends[i].id
            })
    }
}

/// The backend with the lowest fraction of its capacity in use (ties: lowest id).
#[derive(Debug, Default)]
pub struct LeastLoaded;

fn least_loaded(backends: &[BackendView]) -> Option<BackendId> {
    backends
        .iter()
        .filter(|b| b.has_room())
        // running/capacity compared without division: a/b < c/d  <=>  a*d < c*b.
        .min_by(|a, b| (a.running * b.capacity).cmp(&(b.running * a.capacity)))
        .map(|b| b.id)
}

impl RoutingPolicy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least_loaded"
    }
    fn select(&mut self, _affinity: Affinity, backends: &[BackendView]) -> Option<BackendId> {
        least_loaded(backends)
    }
}

/// Sticky per trajectory: requests with the same `Affinity::Sticky` key go to the same
/// backend (least loaded for the first one), so a multi-turn episode reuses its prefix; a
/// request waits for its backend when that is full, and moves only if it became unhealthy.
/// Requests without a key are routed least-loaded. Keys are remembered until
/// [`RoutingPolicy::forget`] (the trajectory ended); at most `MAX_KEYS` are kept.
#[derive(Debug, Default)]
pub struct Sticky {
    homes: HashMap<u64, BackendId>,
}

impl Sticky {
    /// Bound on remembered keys, so a driver that never forgets cannot grow memory forever.
    pub const MAX_KEYS: usize = 1 << 20;

    /// Keys currently remembered.
    pub fn live_keys(&self) -> usize {
        self.homes.len()
    }
}

impl RoutingPolicy for Sticky {
    fn name(&self) -> &'static str {
        "sticky"
    }
    fn select(&mut self, affinity: Affinity, backends: &[BackendView]) -> Option<BackendId> {
        let Affinity::Sticky(key) = affinity else {
            return least_loaded(backends);
        };
        if let Some(home) = self.homes.get(&key) {
            if let Some(b) = backends.iter().find(|b| b.id == *home) {
                if b.healthy {
                    return b.has_room().then_some(*home);
                }
            }
        }
        let chosen = least_loaded(backends)?;
        if self.homes.len() >= Self::MAX_KEYS {
            self.homes.clear();
        }
        self.homes.insert(key, chosen);
        Some(chosen)
    }
    fn forget(&mut self, key: u64) {
        self.homes.remove(&key);
    }
}

/// Builds a routing policy by its config name.
pub fn routing_policy(name: &str) -> Option<Box<dyn RoutingPolicy>> {
    match name {
        "round_robin" => Some(Box::new(RoundRobin::default())),
        "least_loaded" => Some(Box::new(LeastLoaded)),
        "sticky" => Some(Box::new(Sticky::default())),
        _ => None,
    }
}

/// Settings of the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxySchedConfig {
    /// How many times a request is re-tried after retryable failures before failing.
    pub max_retries: u32,
    /// How far past the head of the queue to look for a request that can run when the head
    /// must wait (sticky requests whose backend is full). Bounds the work per dispatch.
    pub lookahead: usize,
}

impl Default for ProxySchedConfig {
    fn default() -> Self {
        ProxySchedConfig {
            max_retries: 3,
            lookahead: 64,
        }
    }
}

/// Counters the proxy exports as metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyCounters {
    pub submitted: u64,
    pub dispatched: u64,
    pub completed: u64,
    pub aborted: u64,
    pub failed: u64,
    pub retries: u64,
    /// Requests re-queued because a pause in abort mode interrupted them.
    pub preempted: u64,
    /// Replies ignored because their attempt was no longer current.
    pub stale_replies: u64,
}

#[derive(Debug)]
struct Entry {
    group: Option<GroupId>,
    affinity: Affinity,
    submitted_at: Duration,
    attempt: u32,
    retries: u32,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Queued,
    Running {
        backend: BackendId,
        /// Cancelled by the user: complete as aborted when the backend answers.
        cancelled: bool,
        /// Interrupted by a pause in abort mode: re-queue when the backend answers.
        preempted: bool,
    },
}

/// The proxy scheduler. See the module docs.
pub struct ProxyScheduler {
    cfg: ProxySchedConfig,
    policy: Box<dyn RoutingPolicy>,
    /// One view per backend, kept current: the policy reads these directly.
    views: Vec<BackendView>,
    queue: VecDeque<RequestId>,
    entries: HashMap<RequestId, Entry>,
    groups: HashMap<GroupId, Vec<RequestId>>,
    /// `Affinity::Pinned` keys with live requests: their backend once the first one was
    /// routed, and how many requests with the key are live (queued or running).
    pins: HashMap<u64, (Option<BackendId>, usize)>,
    paused: Option<PauseMode>,
    counters: ProxyCounters,
    latencies: LatencyWindow,
}

impl std::fmt::Debug for ProxyScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyScheduler")
            .field("policy", &self.policy.name())
            .field("backends", &self.views)
            .field("queued", &self.queue.len())
            .field("live", &self.entries.len())
            .field("paused", &self.paused)
            .finish()
    }
}

impl ProxyScheduler {
    /// A scheduler with no backends yet.
    pub fn new(cfg: ProxySchedConfig, policy: Box<dyn RoutingPolicy>) -> Self {
        ProxyScheduler {
            cfg,
            policy,
            views: Vec::new(),
            queue: VecDeque::new(),
            entries: HashMap::new(),
            groups: HashMap::new(),
            pins: HashMap::new(),
            paused: None,
            counters: ProxyCounters::default(),
            latencies: LatencyWindow::new(100_000),
        }
    }

    /// Adds a healthy backend that runs at most `capacity` requests at once.
    pub fn add_backend(&mut self, capacity: usize) -> BackendId {
        let id = BackendId(self.views.len());
        self.views.push(BackendView {
            id,
            running: 0,
            capacity: capacity.max(1),
            healthy: true,
        });
        id
    }

    /// Requests waiting for a slot.
    pub fn queue_depth(&self) -> usize {
        self.queue.len()
    }

    /// Requests running on each backend.
    pub fn running(&self) -> Vec<usize> {
        self.views.iter().map(|b| b.running).collect()
    }

    /// Requests submitted and not yet completed.
    pub fn live(&self) -> usize {
        self.entries.len()
    }

    /// Whether dispatching is paused, and how.
    pub fn paused(&self) -> Option<PauseMode> {
        self.paused
    }

    /// Whether a backend is in rotation.
    pub fn is_healthy(&self, backend: BackendId) -> bool {
        self.views.get(backend.0).is_some_and(|b| b.healthy)
    }

    /// Counters since the start.
    pub fn counters(&self) -> &ProxyCounters {
        &self.counters
    }

    /// Submit-to-completion latencies of recent requests.
    pub fn latencies(&self) -> &LatencyWindow {
        &self.latencies
    }

    /// The routing policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Feeds one event at time `now`; appends the resulting actions to `out`.
    pub fn handle(&mut self, now: Duration, event: ProxyEvent, out: &mut Vec<ProxyAction>) {
        match event {
            ProxyEvent::Submit {
                id,
                group,
                affinity,
            } => {
                if self.entries.contains_key(&id) {
                    // A duplicate id would alias two callers; refuse the newcomer.
                    out.push(ProxyAction::Complete {
                        id,
                        completion: Completion::Failed {
                            reason: format!("{id} is already live in the proxy"),
                        },
                    });
                    return;
                }
                self.counters.submitted += 1;
                self.entries.insert(
                    id,
                    Entry {
                        group,
                        affinity,
                        submitted_at: now,
                        attempt: 0,
                        retries: 0,
                        state: State::Queued,
                    },
                );
                if let Some(g) = group {
                    self.groups.entry(g).or_default().push(id);
                }
                if let Affinity::Pinned(key) = affinity {
                    self.pins.entry(key).or_insert((None, 0)).1 += 1;
                }
                self.queue.push_back(id);
                self.dispatch(out);
            }
            ProxyEvent::Finished {
                id,
                backend,
                attempt,
                outcome,
            } => self.on_finished(now, id, backend, attempt, outcome, out),
            ProxyEvent::Abort { id } => {
                self.abort(now, id, out);
                self.dispatch(out);
            }
            ProxyEvent::AbortGroup { group } => {
                let ids = self.groups.get(&group).cloned().unwrap_or_default();
                for id in ids {
                    self.abort(now, id, out);
                }
                self.dispatch(out);
            }
            ProxyEvent::Pause { mode } => {
                self.paused = Some(mode);
                if mode == PauseMode::Abort {
                    for e in self.entries.values_mut() {
                        if let State::Running { preempted, .. } = &mut e.state {
                            *preempted = true;
                        }
                    }
                }
            }
            ProxyEvent::Resume => {
                self.paused = None;
                self.dispatch(out);
            }
            ProxyEvent::BackendDown { backend } => {
                let Some(view) = self.views.get_mut(backend.0) else {
                    return;
                };
                view.healthy = false;
                // Everything running there is lost: re-queue it under a new attempt number
                // so a late reply from the dead backend is recognised and ignored.
                let mut requeue = Vec::new();
                for (&id, e) in self.entries.iter_mut() {
                    if let State::Running {
                        backend: b,
                        cancelled,
                        ..
                    } = e.state
                    {
                        if b == backend {
                            requeue.push((id, cancelled));
                        }
                    }
                }
                requeue.sort_by_key(|(id, _)| *id);
                for (id, cancelled) in requeue.into_iter().rev() {
                    self.release(backend);
                    if cancelled {
                        self.complete(now, id, Completion::Aborted, out);
                    } else if let Some(e) = self.entries.get_mut(&id) {
                        e.attempt += 1;
                        e.state = State::Queued;
                        self.counters.retries += 1;
                        self.queue.push_front(id);
                    }
                }
                self.dispatch(out);
            }
            ProxyEvent::BackendUp { backend } => {
                if let Some(view) = self.views.get_mut(backend.0) {
                    view.healthy = true;
                }
                self.dispatch(out);
            }
        }
    }

    fn on_finished(
        &mut self,
        now: Duration,
        id: RequestId,
        backend: BackendId,
        attempt: u32,
        outcome: Outcome,
        out: &mut Vec<ProxyAction>,
    ) {
        let Some(e) = self.entries.get_mut(&id) else {
            self.counters.stale_replies += 1;
            return;
        };
        let State::Running {
            backend: b,
            cancelled,
            preempted,
        } = e.state
        else {
            self.counters.stale_replies += 1;
            return;
        };
        if b != backend || e.attempt != attempt {
            self.counters.stale_replies += 1;
            return;
        }
        let retries = e.retries;
        self.release(backend);
        match outcome {
            Outcome::Done => self.complete(now, id, Completion::Done, out),
            Outcome::Aborted if cancelled => self.complete(now, id, Completion::Aborted, out),
            Outcome::Aborted => {
                // Interrupted by a pause (or by the backend itself): resume it later from
                // its partial output, first in line.
                if let Some(e) = self.entries.get_mut(&id) {
                    e.attempt += 1;
                    e.state = State::Queued;
                }
                if preempted {
                    self.counters.preempted += 1;
                } else {
                    self.counters.retries += 1;
                }
                self.queue.push_front(id);
            }
            Outcome::Failed { retryable, reason } => {
                if cancelled {
                    self.complete(now, id, Completion::Aborted, out);
                } else if retryable && retries < self.cfg.max_retries {
                    if let Some(e) = self.entries.get_mut(&id) {
                        e.attempt += 1;
                        e.retries += 1;
                        e.state = State::Queued;
                    }
                    self.counters.retries += 1;
                    self.queue.push_front(id);
                } else {
                    self.complete(now, id, Completion::Failed { reason }, out);
                }
            }
        }
        self.dispatch(out);
    }

    fn abort(&mut self, now: Duration, id: RequestId, out: &mut Vec<ProxyAction>) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        match &mut e.state {
            State::Queued => {
                if let Some(pos) = self.queue.iter().position(|&q| q == id) {
                    self.queue.remove(pos);
                }
                self.complete(now, id, Completion::Aborted, out);
            }
            State::Running {
                backend, cancelled, ..
            } => {
                if !*cancelled {
                    *cancelled = true;
                    out.push(ProxyAction::Cancel {
                        id,
                        backend: *backend,
                    });
                }
            }
        }
    }

    fn complete(
        &mut self,
        now: Duration,
        id: RequestId,
        completion: Completion,
        out: &mut Vec<ProxyAction>,
    ) {
        let Some(e) = self.entries.remove(&id) else {
            return;
        };
        if let Affinity::Pinned(key) = e.affinity {
            self.unpin(key);
        }
        if let Some(g) = e.group {
            if let Some(members) = self.groups.get_mut(&g) {
                members.retain(|&m| m != id);
                if members.is_empty() {
                    self.groups.remove(&g);
                }
            }
        }
        match &completion {
            Completion::Done => self.counters.completed += 1,
            Completion::Aborted => self.counters.aborted += 1,
            Completion::Failed { .. } => self.counters.failed += 1,
        }
        self.latencies.record(now.saturating_sub(e.submitted_at));
        out.push(ProxyAction::Complete { id, completion });
    }

    fn unpin(&mut self, key: u64) {
        if let Some((_, live)) = self.pins.get_mut(&key) {
            *live = live.saturating_sub(1);
            if *live == 0 {
                self.pins.remove(&key);
            }
        }
    }

    /// Where a request goes now, if anywhere.
    fn route(&mut self, affinity: Affinity) -> Option<BackendId> {
        if let Affinity::Pinned(key) = affinity {
            if let Some((Some(b), _)) = self.pins.get(&key) {
                let view = self.views.get(b.0)?;
                if view.healthy {
                    return view.has_room().then_some(*b);
                }
                // Its backend left rotation: the key is re-pinned wherever the policy says.
            }
        }
        let b = self.policy.select(affinity, &self.views)?;
        if !self.views.get(b.0).is_some_and(BackendView::has_room) {
            return None;
        }
        if let Affinity::Pinned(key) = affinity {
            if let Some((home, _)) = self.pins.get_mut(&key) {
                *home = Some(b);
            }
        }
        Some(b)
    }

    fn release(&mut self, backend: BackendId) {
        if let Some(view) = self.views.get_mut(backend.0) {
            view.running = view.running.saturating_sub(1);
        }
    }

    /// Dispatches queued requests while some backend has room.
    fn dispatch(&mut self, out: &mut Vec<ProxyAction>) {
        if self.paused.is_some() {
            return;
        }
        let mut i = 0;
        while i < self.queue.len() && i <= self.cfg.lookahead {
            if !self.views.iter().any(BackendView::has_room) {
                return;
            }
            let id = self.queue[i];
            let Some(e) = self.entries.get_mut(&id) else {
                self.queue.remove(i);
                continue;
            };
            let affinity = e.affinity;
            match self.route(affinity) {
                Some(b) => {
                    let Some(e) = self.entries.get_mut(&id) else {
                        continue;
                    };
                    self.queue.remove(i);
                    e.state = State::Running {
                        backend: b,
                        cancelled: false,
                        preempted: false,
                    };
                    self.views[b.0].running += 1;
                    self.counters.dispatched += 1;
                    out.push(ProxyAction::Dispatch {
                        id,
                        backend: b,
                        attempt: e.attempt,
                    });
                }
                None => i += 1,
            }
        }
    }

    /// Tells the routing policy a sticky key is no longer needed (its trajectory ended).
    pub fn forget_affinity(&mut self, key: u64) {
        self.policy.forget(key);
    }
}

/// The most recent latencies, for percentiles. A bounded ring, so memory stays flat however
/// long the run.
#[derive(Debug, Clone)]
pub struct LatencyWindow {
    samples: Vec<Duration>,
    next: usize,
    cap: usize,
}

impl LatencyWindow {
    /// A window of at most `cap` samples.
    pub fn new(cap: usize) -> Self {
        LatencyWindow {
            samples: Vec::new(),
            next: 0,
            cap: cap.max(1),
        }
    }

    /// Adds one latency.
    pub fn record(&mut self, d: Duration) {
        if self.samples.len() < self.cap {
            self.samples.push(d);
        } else {
            self.samples[self.next] = d;
        }
        self.next = (self.next + 1) % self.cap;
    }

    /// Number of samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether no latency was recorded.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `q`-quantile (0..=1) by nearest rank, or `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut s = self.samples.clone();
        s.sort_unstable();
        let rank = ((q.clamp(0.0, 1.0) * s.len() as f64).ceil() as usize).clamp(1, s.len());
        Some(s[rank - 1])
    }
}
