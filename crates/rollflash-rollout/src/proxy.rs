//! `LlmProxy`: the front door to all backends. A task owns the scheduler state machine
//! (`rollflash_core::proxy`) and the request payloads, and carries out its actions against
//! real backends; callers talk to it through a cloneable [`ProxyHandle`].
//!
//! Weights and rotation: a backend serves only while it holds the current weights. One whose
//! weight update fails, or that went down (a restarted server comes back with whatever it
//! loaded at start), is probed until healthy, given the latest published weights, and only
//! then rejoins. A reply whose new tokens carry a version older than the weights its backend
//! was known to hold when the attempt was dispatched is refused (the backend lost its
//! weights unnoticed) and the request runs again elsewhere, so stale tokens never reach a
//! caller.
//!
//! Deadlines: nothing waits forever on a backend. The scheduler decides which attempts are
//! overdue (`request_timeout`); this task sleeps until the scheduler's next deadline and
//! ticks it, so a backend that accepts a request and never answers has it cancelled, its
//! slot freed, and the request retried elsewhere or failed as timed out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rollflash_core::proxy::{
    Affinity, BackendId, Completion, GroupId, Outcome, ProxyAction, ProxyCounters, ProxyEvent,
    ProxySchedConfig, ProxyScheduler, RoutingPolicy,
};
use rollflash_core::timeline::{
    BusyCoalescer, EventKind, TimelineEvent, DEFAULT_MAX_SPAN_MS, DEFAULT_MERGE_GAP_MS,
};
use rollflash_core::{FinishReason, GenOutput, GenRequest, PauseMode, PolicyVersion, RequestId};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::backend::{Backend, BackendError, WeightUpdate};
use crate::publish::WeightRoute;
use crate::timeline::Timeline;

/// Why a proxied request produced no output.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The request failed for good (not retryable, or out of retries).
    #[error("request {id} failed: {reason}")]
    Failed { id: RequestId, reason: String },
    /// The proxy was shut down.
    #[error("the proxy is shut down")]
    Shutdown,
    /// A weight sync failed (or ran past its deadline) on some backends (they left
    /// rotation); `timings` are the sync's, per backend included (boxed: keeps every
    /// `Result<_, ProxyError>` small).
    #[error("weight sync to version {version} failed on {failed:?}")]
    Sync {
        version: rollflash_core::PolicyVersion,
        failed: Vec<String>,
        timings: Box<SyncTimings>,
    },
}

/// The default [`ProxySchedConfig::request_timeout`] of the proxy: how long one attempt may
/// stay on a backend without an answer. Finite, so a wedged backend can delay a group but
/// never stall the run; generous, because it must exceed the longest legitimate generation
/// (`max_new_tokens` at the slowest per-request decode rate, plus queueing inside the
/// backend and keep-mode pauses for weight syncs, which it keeps counting through) — an
/// attempt expired early loses its work and is retried. Longer than
/// `HttpBackendConfig`'s default per-call `timeout` (600 s), so an HTTP backend's own
/// timeout, which also takes the server out of rotation, fires first; this one is the
/// backstop for every backend.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(900);

/// The default [`ProxyConfig::update_timeout`]: how long one backend's weight update may
/// take before it is given up on (and leaves rotation). Loading a 7 B checkpoint from local
/// disk takes seconds to a minute on a GPU server; five minutes leaves room for a slow
/// network file system and still ends a sync that would otherwise hang.
pub const DEFAULT_UPDATE_TIMEOUT: Duration = Duration::from_secs(300);

/// Settings of the proxy.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Scheduler settings (retries, look-ahead, and the per-attempt deadline
    /// `request_timeout`, here [`DEFAULT_REQUEST_TIMEOUT`] by default; `None` lets a hung
    /// backend hold its requests forever, and a zero one expires every attempt).
    pub sched: ProxySchedConfig,
    /// How often an out-of-rotation backend is probed with `health`.
    pub health_probe_interval: Duration,
    /// Bound on one backend's `update_weights` (a sync's and a catch-up's alike): past it the
    /// update counts as failed, the backend leaves rotation and is probed back in, and the
    /// sync goes on with the others. A backend's own tighter bound (an HTTP client's
    /// timeout) fires first. The default for backends without their own
    /// ([`BackendEntry::update_timeout`]).
    pub update_timeout: Duration,
    /// Where the proxy reports what its backends do (busy intervals, pauses, weight
    /// loads); `None` reports nothing.
    pub timeline: Option<Timeline>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            sched: ProxySchedConfig {
                request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
                ..ProxySchedConfig::default()
            },
            health_probe_interval: Duration::from_millis(500),
            update_timeout: DEFAULT_UPDATE_TIMEOUT,
            timeline: None,
        }
    }
}

impl ProxyConfig {
    /// The defaults with generation attempts bounded by `timeout`.
    pub fn with_request_timeout(timeout: Duration) -> Self {
        let mut cfg = ProxyConfig::default();
        cfg.sched.request_timeout = Some(timeout);
        cfg
    }
}

/// One backend with its admission limit and the route its weight updates take.
pub struct BackendEntry {
    pub backend: Arc<dyn Backend>,
    /// How weight updates reach it: as they are, written to disk for a server, or not at
    /// all for a server that keeps its own weights.
    pub route: WeightRoute,
    /// At most this many requests run on it at once; the rest wait in the proxy's queue.
    pub max_running_requests: usize,
    /// Bound on one weight update of this backend (and on its pause and resume around it);
    /// `None` = [`ProxyConfig::update_timeout`]. A server whose reload is known to be slow
    /// gets a longer one without delaying how fast a hung fast one is given up on.
    pub update_timeout: Option<Duration>,
}

/// How the `n` responses of one prompt are requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Replication {
    /// Prompt replication (ROLL's `is_num_return_sequences_expand`): `n` independent
    /// requests that may run on different backends and finish independently.
    #[default]
    Expand,
    /// One `n`-per-request call: all `n` run together on one backend.
    PerRequest,
}

/// A snapshot of the proxy's metrics.
#[derive(Debug, Clone, Default)]
pub struct ProxyMetrics {
    pub queue_depth: usize,
    /// Per backend: name, running requests, in rotation.
    pub backends: Vec<(String, usize, bool)>,
    pub counters: ProxyCounters,
    /// Generated tokens returned to callers (finished and aborted requests).
    pub tokens: u64,
    /// `tokens` divided by the proxy's age.
    pub tokens_per_sec: f64,
    pub latency_p50: Option<Duration>,
    pub latency_p90: Option<Duration>,
    pub latency_p99: Option<Duration>,
    pub paused: Option<PauseMode>,
}

/// Time spent in each phase of one weight sync.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncTimings {
    pub pause: Duration,
    pub update: Duration,
    pub resume: Duration,
    /// Each backend's own update, in backend order (the update phase is the longest).
    pub backends: Vec<BackendSync>,
}

/// One backend's part of a weight sync.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendSync {
    /// The backend's name.
    pub name: String,
    /// How long its `update_weights` took (up to the deadline when it ran past it).
    pub took: Duration,
    /// Whether it loaded the weights.
    pub loaded: bool,
}

impl SyncTimings {
    /// Pause + update + resume.
    pub fn total(&self) -> Duration {
        self.pause + self.update + self.resume
    }
}

type Reply = oneshot::Sender<Result<GenOutput, ProxyError>>;

/// The closed set of messages the proxy task handles.
enum Msg {
    Generate {
        req: Box<GenRequest>,
        group: Option<GroupId>,
        affinity: Affinity,
        reply: Reply,
    },
    Abort(RequestId),
    AbortGroup(GroupId),
    Forget(u64),
    Reply {
        id: RequestId,
        backend: BackendId,
        attempt: u32,
        result: Result<GenOutput, BackendError>,
    },
    Pause(PauseMode, oneshot::Sender<()>),
    Resume(oneshot::Sender<()>),
    /// Every backend resumed: dispatch again, then acknowledge.
    Resumed(oneshot::Sender<()>),
    /// A weight update on a backend ended: it holds `version` now, or failed to load it.
    Weights {
        backend: BackendId,
        version: PolicyVersion,
        loaded: bool,
    },
    /// A probed backend is healthy again and holds the latest published weights.
    Rejoined(BackendId),
    Metrics(oneshot::Sender<ProxyMetrics>),
    Shutdown(oneshot::Sender<ProxyCounters>),
}

/// A cloneable handle to the proxy task.
#[derive(Clone)]
pub struct ProxyHandle {
    tx: mpsc::UnboundedSender<Msg>,
    ids: Arc<AtomicU64>,
    groups: Arc<AtomicU64>,
    backends: Arc<Vec<Arc<dyn Backend>>>,
    weights: Arc<Publication>,
    /// Whether some backend is in rotation (up, at the newest weights), kept by the task.
    serving: watch::Receiver<bool>,
    /// Where each backend's weight load is reported.
    timeline: Option<Timeline>,
}

/// The latest published weights, and one lock per backend that every weight update to it
/// holds (syncs and catch-ups alike), so updates reach a backend in publication order and a
/// slow catch-up can never overwrite newer weights with older ones.
struct Publication {
    /// A std `Mutex`: read and replaced, never held across an `.await`.
    latest: std::sync::Mutex<Option<WeightUpdate>>,
    locks: Vec<tokio::sync::Mutex<()>>,
    /// Per backend: the route its updates take ([`BackendEntry::route`]).
    routes: Vec<WeightRoute>,
    /// Per backend: bound on one update ([`BackendEntry::update_timeout`], else
    /// [`ProxyConfig::update_timeout`]).
    timeouts: Vec<Duration>,
    /// Per backend: it failed a call and is being probed back in. A sync skips it (its
    /// probe gives it the latest weights before it rejoins), so a dead server costs a sync
    /// nothing rather than its connection retries every time.
    down: Vec<std::sync::atomic::AtomicBool>,
}

impl Publication {
    fn latest(&self) -> Option<WeightUpdate> {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Backend `i`'s update deadline.
    fn timeout(&self, i: usize) -> Duration {
        self.timeouts
            .get(i)
            .copied()
            .unwrap_or(DEFAULT_UPDATE_TIMEOUT)
    }

    fn is_down(&self, i: usize) -> bool {
        self.down.get(i).is_some_and(|d| d.load(Ordering::SeqCst))
    }

    fn set_down(&self, i: usize, down: bool) {
        if let Some(d) = self.down.get(i) {
            d.store(down, Ordering::SeqCst);
        }
    }

    fn publish(&self, update: &WeightUpdate) {
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(update.clone());
    }

    /// Updates backend `i` under its lock and reports the result to the proxy task while
    /// still holding it, so the task sees a backend's updates in the order they happened.
    async fn update(
        &self,
        i: usize,
        backend: &dyn Backend,
        update: &WeightUpdate,
        tx: &mpsc::UnboundedSender<Msg>,
    ) -> Result<(), BackendError> {
        let (Some(lock), Some(route)) = (self.locks.get(i), self.routes.get(i)) else {
            return Ok(());
        };
        // One deadline for the wait on the lock and the update: a catch-up stuck on a dead
        // server must not hold a sync past it.
        let limit = self.timeout(i);
        let deadline = Instant::now() + limit;
        let timed_out = || BackendError::Timeout {
            backend: backend.name().to_string(),
            secs: limit.as_secs_f64(),
        };
        let (r, _held) = match tokio::time::timeout_at(deadline, lock.lock()).await {
            Ok(held) => {
                let r = tokio::time::timeout_at(deadline, route.send(backend, update))
                    .await
                    .unwrap_or_else(|_| Err(timed_out()));
                (r, Some(held))
            }
            Err(_) => (Err(timed_out()), None),
        };
        let _ = tx.send(Msg::Weights {
            backend: BackendId(i),
            version: update.version(),
            loaded: r.is_ok(),
        });
        r
    }
}

impl std::fmt::Debug for ProxyHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyHandle")
            .field("backends", &self.backends.len())
            .finish()
    }
}

/// The proxy: owns its task. Dropping it (and every handle) stops the task.
pub struct LlmProxy {
    handle: ProxyHandle,
    /// `None` once [`LlmProxy::shutdown`] has joined it.
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for LlmProxy {
    /// A proxy dropped without [`LlmProxy::shutdown`] (an error path, a panic) is aborted: its
    /// task, and with it every backend it owns, does not outlive it even while handles to it
    /// remain.
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl std::fmt::Debug for LlmProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmProxy")
            .field("handle", &self.handle)
            .finish()
    }
}

impl LlmProxy {
    /// Starts the proxy task over `backends`, routed by `policy`. Must be called inside a
    /// tokio runtime.
    pub fn start(
        backends: Vec<BackendEntry>,
        policy: Box<dyn RoutingPolicy>,
        cfg: ProxyConfig,
    ) -> LlmProxy {
        let mut sched = ProxyScheduler::new(cfg.sched.clone(), policy);
        let mut list: Vec<Arc<dyn Backend>> = Vec::with_capacity(backends.len());
        let mut routes = Vec::with_capacity(backends.len());
        let mut timeouts = Vec::with_capacity(backends.len());
        for b in backends {
            sched.add_backend(b.max_running_requests);
            list.push(b.backend);
            routes.push(b.route);
            timeouts.push(b.update_timeout.unwrap_or(cfg.update_timeout));
        }
        let list = Arc::new(list);
        let weights = Arc::new(Publication {
            latest: std::sync::Mutex::new(None),
            locks: list.iter().map(|_| tokio::sync::Mutex::new(())).collect(),
            routes,
            timeouts,
            down: list
                .iter()
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let (serving_tx, serving_rx) = watch::channel(!list.is_empty());
        let busy = cfg.timeline.clone().map(|t| {
            let lanes = list.iter().map(|b| b.name().to_string()).collect();
            let c = BusyCoalescer::new(lanes, DEFAULT_MERGE_GAP_MS, DEFAULT_MAX_SPAN_MS);
            BusyLog {
                timeline: t,
                coalescer: c,
                paused_at: None,
                events: Vec::new(),
            }
        });
        let state = ProxyTask {
            busy,
            serving: serving_tx,
            weights: Arc::clone(&weights),
            sched,
            backends: Arc::clone(&list),
            pending: HashMap::new(),
            tx: tx.clone(),
            start: Instant::now(),
            tokens: 0,
            tasks: JoinSet::new(),
            probing: vec![false; list.len()],
            probe_interval: cfg.health_probe_interval,
            actions: Vec::new(),
            paused_backends: None,
        };
        let task = tokio::spawn(state.run(rx));
        LlmProxy {
            handle: ProxyHandle {
                tx,
                ids: Arc::new(AtomicU64::new(1)),
                groups: Arc::new(AtomicU64::new(1)),
                backends: list,
                weights,
                serving: serving_rx,
                timeline: cfg.timeline.clone(),
            },
            task: Some(task),
        }
    }

    /// A handle for callers.
    pub fn handle(&self) -> ProxyHandle {
        self.handle.clone()
    }

    /// Aborts everything in flight (callers get their partial outputs), stops the task and
    /// returns the final counters.
    pub async fn shutdown(mut self) -> Result<ProxyCounters, ProxyError> {
        let (tx, rx) = oneshot::channel();
        self.handle
            .tx
            .send(Msg::Shutdown(tx))
            .map_err(|_| ProxyError::Shutdown)?;
        let counters = rx.await.map_err(|_| ProxyError::Shutdown)?;
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        Ok(counters)
    }
}

impl ProxyHandle {
    /// A fresh request id, unique within this proxy.
    pub fn next_id(&self) -> RequestId {
        RequestId(self.ids.fetch_add(1, Ordering::Relaxed))
    }

    /// A fresh group id.
    pub fn next_group(&self) -> GroupId {
        GroupId(self.groups.fetch_add(1, Ordering::Relaxed))
    }

    /// The backends behind the proxy, in id order.
    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    /// Whether some backend is in rotation — up and holding the newest weights — as it
    /// changes: `false` when every server went down or failed its last update (nothing can
    /// generate until one is caught up), `true` again when one rejoins.
    pub fn serving(&self) -> watch::Receiver<bool> {
        self.serving.clone()
    }

    /// Generates one request (its `id` must be unique among live requests: use
    /// [`ProxyHandle::next_id`]). An aborted request returns its partial output with
    /// `FinishReason::Aborted`.
    pub async fn generate(&self, req: GenRequest) -> Result<GenOutput, ProxyError> {
        self.generate_with(req, None, Affinity::None).await
    }

    /// Generates one request as a member of `group` and with a routing affinity.
    pub async fn generate_with(
        &self,
        req: GenRequest,
        group: Option<GroupId>,
        affinity: Affinity,
    ) -> Result<GenOutput, ProxyError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Msg::Generate {
                req: Box::new(req),
                group,
                affinity,
                reply: tx,
            })
            .map_err(|_| ProxyError::Shutdown)?;
        rx.await.map_err(|_| ProxyError::Shutdown)?
    }

    /// Generates `n` responses to one prompt. With [`Replication::Expand`] they are `n`
    /// independent requests (seeds `seed + i` when the params carry a seed); with
    /// `PerRequest` they run together on one backend. Results are in index order.
    pub async fn generate_n(
        &self,
        prompt: Vec<u32>,
        params: rollflash_core::SamplingParams,
        start_version: rollflash_core::PolicyVersion,
        n: usize,
        replication: Replication,
    ) -> (GroupId, Vec<Result<GenOutput, ProxyError>>) {
        let group = self.next_group();
        let affinity = match replication {
            Replication::Expand => Affinity::None,
            Replication::PerRequest => Affinity::Pinned(group.0),
        };
        let futs = (0..n).map(|i| {
            let mut params = params.clone();
            params.seed = params.seed.map(|s| s.wrapping_add(i as u64));
            let req = GenRequest {
                id: self.next_id(),
                prompt: prompt.clone(),
                params,
                start_version,
                resume: None,
            };
            self.generate_with(req, Some(group), affinity)
        });
        (group, futures::future::join_all(futs).await)
    }

    /// Aborts one request.
    pub fn abort(&self, id: RequestId) {
        let _ = self.tx.send(Msg::Abort(id));
    }

    /// Aborts every live request of a group.
    pub fn abort_group(&self, group: GroupId) {
        let _ = self.tx.send(Msg::AbortGroup(group));
    }

    /// The trajectory behind a sticky key ended.
    pub fn forget_affinity(&self, key: u64) {
        let _ = self.tx.send(Msg::Forget(key));
    }

    /// Stops dispatching and pauses every backend. In `Abort` mode in-flight requests
    /// come back with their partial output and are resumed after `resume`, from those
    /// tokens and under the then-current weights; their callers see one finished output.
    pub async fn pause(&self, mode: PauseMode) -> Result<(), ProxyError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Msg::Pause(mode, tx))
            .map_err(|_| ProxyError::Shutdown)?;
        rx.await.map_err(|_| ProxyError::Shutdown)
    }

    /// Resumes every backend and dispatching.
    pub async fn resume(&self) -> Result<(), ProxyError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Msg::Resume(tx))
            .map_err(|_| ProxyError::Shutdown)?;
        rx.await.map_err(|_| ProxyError::Shutdown)
    }

    /// Replaces the latest published weights with the same version found elsewhere (a
    /// remote trainer that lost its model rebuilt it and saved its weights again, under a
    /// new path): what a backend's catch-up loads from now on. Nothing is paused and no
    /// backend is sent anything: those in rotation already hold these weights, and those
    /// out of rotation (which could not load the lost copy) get them from their probe.
    pub fn republish_weights(&self, update: &WeightUpdate) {
        self.weights.publish(update);
    }

    /// Publishes new weights: pause (in `mode`), update every backend (each within
    /// [`ProxyConfig::update_timeout`]), resume. A backend whose update fails or runs past
    /// its deadline leaves rotation (it does not serve stale weights): it is probed
    /// and given the latest weights until that succeeds, and only then rejoins. The error
    /// names it.
    pub async fn sync_weights(
        &self,
        update: &WeightUpdate,
        mode: PauseMode,
    ) -> Result<SyncTimings, ProxyError> {
        let t0 = Instant::now();
        self.pause(mode).await?;
        let t1 = Instant::now();
        self.weights.publish(update);
        let results = futures::future::join_all(self.backends.iter().enumerate().map(|(i, b)| {
            let started = Instant::now();
            async move {
                if self.weights.is_down(i) {
                    let skipped = Err(BackendError::Unavailable {
                        backend: b.name().to_string(),
                        reason: "down (being probed); it is given these weights when it is \
                                 back"
                            .into(),
                        source: None,
                    });
                    return (skipped, Duration::ZERO);
                }
                let r = self.weights.update(i, b.as_ref(), update, &self.tx).await;
                (r, started.elapsed())
            }
        }))
        .await;
        let mut failed = Vec::new();
        let mut backends = Vec::with_capacity(results.len());
        for (i, (r, took)) in results.into_iter().enumerate() {
            let name = self.backends[i].name().to_string();
            if let Err(e) = &r {
                tracing::warn!(backend = %name, error = %rollflash_core::error_chain(&e), "weight sync failed; the backend leaves rotation");
                failed.push(name.clone());
            }
            backends.push(BackendSync {
                name,
                took,
                loaded: r.is_ok(),
            });
        }
        let t2 = Instant::now();
        if let Some(tl) = &self.timeline {
            let start_ms = tl.ms_at(t1);
            for b in &backends {
                tl.record(TimelineEvent {
                    lane: b.name.clone(),
                    kind: EventKind::Sync,
                    start_ms,
                    end_ms: start_ms + b.took.as_millis() as u64,
                    version: update.version().0,
                    count: u64::from(b.loaded),
                    tokens: 0,
                });
            }
        }
        self.resume().await?;
        let timings = SyncTimings {
            pause: t1 - t0,
            update: t2 - t1,
            resume: t2.elapsed(),
            backends,
        };
        if failed.is_empty() {
            Ok(timings)
        } else {
            if failed.len() == self.backends.len() {
                tracing::error!(
                    version = %update.version(),
                    ?failed,
                    "no backend loaded the new weights: nothing serves the current policy"
                );
            }
            Err(ProxyError::Sync {
                version: update.version(),
                failed,
                timings: Box::new(timings),
            })
        }
    }

    /// A metrics snapshot.
    pub async fn metrics(&self) -> Result<ProxyMetrics, ProxyError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Msg::Metrics(tx))
            .map_err(|_| ProxyError::Shutdown)?;
        rx.await.map_err(|_| ProxyError::Shutdown)
    }
}

struct Pending {
    /// The request, with `resume` holding everything generated so far.
    req: GenRequest,
    reply: Reply,
    /// The weights version its backend held when the attempt was dispatched: no newly
    /// generated token of the attempt may carry an older one.
    floor: PolicyVersion,
    /// How the last finished attempt ended.
    finish: FinishReason,
    /// Which backends generated `req.resume`'s tokens, in order.
    served: Vec<rollflash_core::ServedRun>,
}

/// The proxy's timeline: busy intervals per backend and pauses (see
/// `rollflash_core::timeline`).
struct BusyLog {
    timeline: Timeline,
    coalescer: BusyCoalescer,
    /// When the current pause began (Unix ms).
    paused_at: Option<u64>,
    events: Vec<TimelineEvent>,
}

impl BusyLog {
    fn flush(&mut self) {
        for e in self.events.drain(..) {
            self.timeline.record(e);
        }
    }
}

/// The proxy task's state.
struct ProxyTask {
    /// Reports what the backends do, when the proxy has a timeline.
    busy: Option<BusyLog>,
    sched: ProxyScheduler,
    /// The latest published weights, for catching up backends that rejoin.
    weights: Arc<Publication>,
    backends: Arc<Vec<Arc<dyn Backend>>>,
    pending: HashMap<RequestId, Pending>,
    tx: mpsc::UnboundedSender<Msg>,
    start: Instant,
    tokens: u64,
    /// Every backend call in flight; aborted on shutdown so nothing outlives the proxy.
    tasks: JoinSet<()>,
    /// Backends being probed back into rotation.
    probing: Vec<bool>,
    /// The backends the last pause was sent to (those not down then): the resume goes to
    /// them, so a server that is down costs a sync no pause and resume deadlines.
    paused_backends: Option<Vec<usize>>,
    probe_interval: Duration,
    actions: Vec<ProxyAction>,
    /// Published after every message: whether some backend is in rotation.
    serving: watch::Sender<bool>,
}

impl ProxyTask {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        // One timer, re-armed only when the scheduler's earliest deadline changes, rather
        // than a fresh one per message.
        let timer = tokio::time::sleep_until(self.start);
        tokio::pin!(timer);
        let mut armed: Option<Duration> = None;
        loop {
            let next = self.sched.next_deadline();
            if next != armed {
                if let Some(d) = next {
                    timer.as_mut().reset(self.start + d);
                }
                armed = next;
            }
            let msg = tokio::select! {
                msg = rx.recv() => msg,
                () = &mut timer, if armed.is_some() => {
                    self.tick();
                    self.observe_busy();
                    self.publish_serving();
                    // Re-arm even if the earliest deadline did not move: the timer has fired.
                    armed = None;
                    continue;
                }
            };
            // Every handle dropped: nobody is waiting for anything.
            let Some(msg) = msg else { break };
            while self.tasks.try_join_next().is_some() {}
            if let Msg::Shutdown(reply) = msg {
                self.shutdown(&mut rx).await;
                let _ = reply.send(self.sched.counters().clone());
                return;
            }
            self.handle(msg);
            self.observe_busy();
            self.publish_serving();
        }
        self.cut_busy();
        self.tasks.shutdown().await;
    }

    /// Tells the timeline how many requests each backend runs now.
    fn observe_busy(&mut self) {
        let Some(log) = self.busy.as_mut() else {
            return;
        };
        let now = log.timeline.now_ms();
        for (b, running) in self.sched.running().into_iter().enumerate() {
            let version = self.sched.weights_of(BackendId(b)).unwrap_or_default();
            log.coalescer
                .observe(now, b, running, version, &mut log.events);
        }
        log.flush();
    }

    /// Ends every open busy interval now (a pause, shutdown).
    fn cut_busy(&mut self) {
        if let Some(log) = self.busy.as_mut() {
            let now = log.timeline.now_ms();
            log.coalescer.cut(now, &mut log.events);
            log.flush();
        }
    }

    /// Tells watchers whether some backend is in rotation, when that changed.
    fn publish_serving(&self) {
        let now = (0..self.backends.len()).any(|i| self.sched.is_healthy(BackendId(i)));
        self.serving.send_if_modified(|s| {
            let changed = *s != now;
            *s = now;
            changed
        });
    }

    /// The earliest deadline passed: the scheduler expires what is overdue. Its cancels are
    /// carried out like any other (the backend may still answer; that reply is stale and
    /// ignored), and each is logged, since a backend that never answers is worth knowing.
    fn tick(&mut self) {
        let now = self.now();
        let mut actions = std::mem::take(&mut self.actions);
        self.sched.handle(now, ProxyEvent::Tick, &mut actions);
        let mut wedged = Vec::new();
        for a in actions.drain(..) {
            // A tick cancels nothing but expired attempts.
            if let ProxyAction::Cancel { id, backend } = &a {
                tracing::warn!(
                    backend = self.backends[backend.0].name(),
                    %id,
                    "no answer within the request timeout; cancelled, retrying or failing"
                );
                if !wedged.contains(backend) {
                    wedged.push(*backend);
                }
            }
            self.act(a);
        }
        self.actions = actions;
        // A backend that let an attempt run past the deadline is wedged (or far too slow):
        // it leaves rotation, its other attempts are retried elsewhere now rather than each
        // waiting out its own deadline, syncs skip it, and the probe brings it back (healthy
        // and holding the latest weights) when it answers again. Only while another backend
        // is in rotation: the last one stays (its retries are already bounded) rather than
        // leave the requests nowhere to go.
        for backend in wedged {
            let others = (0..self.backends.len())
                .any(|i| i != backend.0 && self.sched.is_healthy(BackendId(i)));
            if others && self.sched.is_healthy(backend) {
                tracing::warn!(
                    backend = self.backends[backend.0].name(),
                    "backend leaves rotation after a request deadline; probing it back in"
                );
                self.weights.set_down(backend.0, true);
                self.feed(ProxyEvent::BackendDown { backend });
                self.start_probe(backend);
            }
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn feed(&mut self, event: ProxyEvent) {
        let now = self.now();
        let mut actions = std::mem::take(&mut self.actions);
        self.sched.handle(now, event, &mut actions);
        for a in actions.drain(..) {
            self.act(a);
        }
        self.actions = actions;
    }

    // One match over the task's closed message enum, kept whole so every message the proxy
    // accepts is read in one place; each arm hands its work to the scheduler or a helper.
    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Generate {
                req,
                group,
                affinity,
                reply,
            } => {
                let id = req.id;
                if self.pending.contains_key(&id) {
                    let _ = reply.send(Err(ProxyError::Failed {
                        id,
                        reason: format!("{id} is already live in the proxy"),
                    }));
                    return;
                }
                self.pending.insert(
                    id,
                    Pending {
                        req: *req,
                        reply,
                        floor: PolicyVersion::default(),
                        finish: FinishReason::Stop,
                        served: Vec::new(),
                    },
                );
                self.feed(ProxyEvent::Submit {
                    id,
                    group,
                    affinity,
                });
            }
            Msg::Abort(id) => self.feed(ProxyEvent::Abort { id }),
            Msg::AbortGroup(group) => self.feed(ProxyEvent::AbortGroup { group }),
            Msg::Forget(key) => self.sched.forget_affinity(key),
            Msg::Reply {
                id,
                backend,
                attempt,
                result,
            } => self.on_reply(id, backend, attempt, result),
            Msg::Pause(mode, ack) => {
                self.cut_busy();
                if let Some(log) = self.busy.as_mut() {
                    log.paused_at = Some(log.timeline.now_ms());
                }
                self.feed(ProxyEvent::Pause { mode });
                let backends = Arc::clone(&self.backends);
                // A backend that is down (being probed) runs none of our requests: it is not
                // paused, and its probe resumes it before it rejoins.
                let targets: Vec<usize> = (0..backends.len())
                    .filter(|&i| !self.weights.is_down(i))
                    .collect();
                self.paused_backends = Some(targets.clone());
                // Bounded like an update: a server that never answers its pause must not
                // hold the sync (its requests are bounded by their own deadlines).
                let weights = Arc::clone(&self.weights);
                self.tasks.spawn(async move {
                    let _ = futures::future::join_all(targets.iter().map(|&i| {
                        tokio::time::timeout(weights.timeout(i), backends[i].pause(mode))
                    }))
                    .await;
                    let _ = ack.send(());
                });
            }
            Msg::Resume(ack) => {
                let backends = Arc::clone(&self.backends);
                let targets = self
                    .paused_backends
                    .take()
                    .unwrap_or_else(|| (0..backends.len()).collect());
                let tx = self.tx.clone();
                let weights = Arc::clone(&self.weights);
                self.tasks.spawn(async move {
                    let _ =
                        futures::future::join_all(targets.iter().map(|&i| {
                            tokio::time::timeout(weights.timeout(i), backends[i].resume())
                        }))
                        .await;
                    // Dispatch only once the backends generate again.
                    let _ = tx.send(Msg::Resumed(ack));
                });
            }
            Msg::Resumed(ack) => {
                if let Some(log) = self.busy.as_mut() {
                    if let Some(start_ms) = log.paused_at.take() {
                        let end_ms = log.timeline.now_ms();
                        let version = self.sched.current_weights().0;
                        for b in self.backends.iter() {
                            log.events.push(TimelineEvent {
                                lane: b.name().to_string(),
                                kind: EventKind::Pause,
                                start_ms,
                                end_ms,
                                version,
                                count: 0,
                                tokens: 0,
                            });
                        }
                        log.flush();
                    }
                }
                self.feed(ProxyEvent::Resume);
                let _ = ack.send(());
            }
            Msg::Weights {
                backend,
                version,
                loaded: true,
            } => self.feed(ProxyEvent::WeightsLoaded { backend, version }),
            Msg::Weights {
                backend,
                version,
                loaded: false,
            } => {
                self.feed(ProxyEvent::WeightsFailed { backend, version });
                // Later syncs skip it while the probe catches it up: a server wedged in a
                // load would otherwise cost every sync its full update deadline.
                self.weights.set_down(backend.0, true);
                self.start_probe(backend);
            }
            Msg::Rejoined(b) => {
                if let Some(p) = self.probing.get_mut(b.0) {
                    *p = false;
                }
                // Clear `down` before looking at the latest version: a sync that skipped
                // this backend published before it read `down`, so it is seen below; a
                // later one does not skip it.
                self.weights.set_down(b.0, false);
                self.feed(ProxyEvent::BackendUp { backend: b });
                let latest = self.weights.latest().map(|u| u.version());
                if latest.is_some() && self.sched.weights_of(b) < latest {
                    // It came back during a sync that skipped it: catch it up again
                    // rather than leave it out of rotation (it holds older weights than
                    // the current ones, so the scheduler keeps it out) until the next sync.
                    self.start_probe(b);
                }
            }
            Msg::Metrics(reply) => {
                let _ = reply.send(self.metrics());
            }
            Msg::Shutdown(_) => {}
        }
    }

    fn on_reply(
        &mut self,
        id: RequestId,
        backend: BackendId,
        attempt: u32,
        result: Result<GenOutput, BackendError>,
    ) {
        let outcome = match result {
            Ok(out) => {
                let aborted = out.finish_reason == FinishReason::Aborted;
                if let Some(stale) = self.stale_tokens(id, backend, attempt, &out) {
                    // The backend lost the weights it was known to hold (a restarted
                    // server loads its initial weights): drop this answer, take the backend
                    // out of rotation (which re-queues the request) and catch it up.
                    tracing::warn!(
                        backend = self.backends[backend.0].name(),
                        %id,
                        token_version = %stale,
                        expected = %self.sched.weights_of(backend).unwrap_or_default(),
                        "backend generated with stale weights; refusing the reply"
                    );
                    let version = self.sched.current_weights();
                    self.feed(ProxyEvent::WeightsFailed { backend, version });
                    self.start_probe(backend);
                    return;
                }
                // Keep everything generated so far: a resume continues from it, an abort
                // returns it. A stale attempt's reply (its backend was declared dead, or the
                // attempt expired, meanwhile — even if no newer attempt started yet) must
                // not overwrite the request's tokens; the scheduler ignores it too.
                if self.sched.running_attempt(id) == Some((backend, attempt)) {
                    if let Some(p) = self.pending.get_mut(&id) {
                        let new = out.output.len().saturating_sub(p.req.resumed_len());
                        if let Some(log) = self.busy.as_mut() {
                            log.coalescer.completed(backend.0, new as u64);
                        }
                        rollflash_core::gen::push_served(
                            &mut p.served,
                            self.backends[backend.0].name(),
                            new,
                        );
                        p.req.resume = Some(out.output);
                        p.finish = out.finish_reason;
                    }
                }
                if aborted {
                    Outcome::Aborted
                } else {
                    Outcome::Done
                }
            }
            Err(e) => {
                let retryable = e.is_retryable();
                if retryable {
                    // The backend itself is in trouble: take it out of rotation and
                    // probe it back in, rather than feeding it more requests.
                    self.feed(ProxyEvent::Finished {
                        id,
                        backend,
                        attempt,
                        outcome: Outcome::Failed {
                            retryable,
                            reason: rollflash_core::error_chain(&e),
                        },
                    });
                    self.weights.set_down(backend.0, true);
                    self.feed(ProxyEvent::BackendDown { backend });
                    self.start_probe(backend);
                    return;
                }
                Outcome::Failed {
                    retryable,
                    reason: rollflash_core::error_chain(&e),
                }
            }
        };
        self.feed(ProxyEvent::Finished {
            id,
            backend,
            attempt,
            outcome,
        });
    }

    /// For the current attempt of `id`: the oldest version among its newly generated tokens,
    /// when that is older than the weights its backend held at dispatch.
    fn stale_tokens(
        &self,
        id: RequestId,
        backend: BackendId,
        attempt: u32,
        out: &GenOutput,
    ) -> Option<PolicyVersion> {
        if self.sched.running_attempt(id) != Some((backend, attempt)) {
            return None;
        }
        let p = self.pending.get(&id)?;
        let resumed = p.req.resumed_len().min(out.output.versions.len());
        let oldest = out.output.versions[resumed..].iter().min().copied()?;
        (oldest < p.floor).then_some(oldest)
    }

    fn act(&mut self, action: ProxyAction) {
        match action {
            ProxyAction::Dispatch {
                id,
                backend,
                attempt,
            } => {
                let floor = self.sched.weights_of(backend).unwrap_or_default();
                let Some(p) = self.pending.get_mut(&id) else {
                    return;
                };
                p.floor = floor;
                let req = p.req.clone();
                let b = Arc::clone(&self.backends[backend.0]);
                let tx = self.tx.clone();
                self.tasks.spawn(async move {
                    let result = b.generate(req).await;
                    let _ = tx.send(Msg::Reply {
                        id,
                        backend,
                        attempt,
                        result,
                    });
                });
            }
            ProxyAction::Cancel { id, backend } => {
                let b = Arc::clone(&self.backends[backend.0]);
                self.tasks.spawn(async move {
                    let _ = b.abort(id).await;
                });
            }
            ProxyAction::Complete { id, completion } => {
                let Some(p) = self.pending.remove(&id) else {
                    return;
                };
                let result = match completion {
                    Completion::Done | Completion::Aborted => {
                        let output = p.req.resume.unwrap_or_default();
                        self.tokens += output.len() as u64;
                        Ok(GenOutput {
                            id,
                            prompt_len: p.req.prompt.len(),
                            finish_reason: match completion {
                                Completion::Aborted => FinishReason::Aborted,
                                _ => p.finish,
                            },
                            output,
                            start_version: p.req.start_version,
                            served_by: p.served,
                        })
                    }
                    Completion::Failed { reason } => Err(ProxyError::Failed { id, reason }),
                };
                let _ = p.reply.send(result);
            }
        }
    }

    /// Probes an out-of-rotation backend until it is healthy and holds the latest published
    /// weights (given to it here: a backend that failed a sync, or a server that restarted,
    /// would otherwise serve old ones), then lets it rejoin. One probe per backend at a time.
    fn start_probe(&mut self, b: BackendId) {
        if self.probing.get(b.0).copied().unwrap_or(true) {
            return;
        }
        self.probing[b.0] = true;
        let backend = Arc::clone(&self.backends[b.0]);
        let weights = Arc::clone(&self.weights);
        let tx = self.tx.clone();
        let interval = self.probe_interval;
        self.tasks.spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                if backend.health().await.is_err() {
                    continue;
                }
                if let Some(update) = weights.latest() {
                    if let Err(e) = weights.update(b.0, backend.as_ref(), &update, &tx).await {
                        tracing::debug!(backend = backend.name(), error = %rollflash_core::error_chain(&e), "catch-up weight update failed");
                        continue;
                    }
                }
                // A pause may have reached it before it went down, and the resume skipped
                // it: it must generate again before it rejoins.
                if tokio::time::timeout(weights.timeout(b.0), backend.resume())
                    .await
                    .map_or(true, |r| r.is_err())
                {
                    continue;
                }
                let _ = tx.send(Msg::Rejoined(b));
                return;
            }
        });
    }

    fn metrics(&self) -> ProxyMetrics {
        let running = self.sched.running();
        let lat = self.sched.latencies();
        let age = self.now().as_secs_f64();
        ProxyMetrics {
            queue_depth: self.sched.queue_depth(),
            backends: self
                .backends
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    (
                        b.name().to_string(),
                        running[i],
                        self.sched.is_healthy(BackendId(i)),
                    )
                })
                .collect(),
            counters: self.sched.counters().clone(),
            tokens: self.tokens,
            tokens_per_sec: if age > 0.0 {
                self.tokens as f64 / age
            } else {
                0.0
            },
            latency_p50: lat.quantile(0.5),
            latency_p90: lat.quantile(0.9),
            latency_p99: lat.quantile(0.99),
            paused: self.sched.paused(),
        }
    }

    async fn shutdown(&mut self, rx: &mut mpsc::UnboundedReceiver<Msg>) {
        let ids: Vec<RequestId> = self.pending.keys().copied().collect();
        for id in ids {
            self.feed(ProxyEvent::Abort { id });
        }
        // Wait (boundedly: a hung backend must not hang shutdown) for the cancelled
        // requests' backends to answer, so callers get partial outputs; anything else that
        // arrives meanwhile is refused.
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while !self.pending.is_empty() {
            let Ok(Some(msg)) = tokio::time::timeout_at(deadline, rx.recv()).await else {
                break;
            };
            match msg {
                Msg::Reply { .. } | Msg::Weights { .. } | Msg::Rejoined(_) => self.handle(msg),
                Msg::Generate { reply, .. } => {
                    let _ = reply.send(Err(ProxyError::Shutdown));
                }
                Msg::Pause(_, ack) | Msg::Resume(ack) | Msg::Resumed(ack) => {
                    let _ = ack.send(());
                }
                Msg::Metrics(reply) => {
                    let _ = reply.send(self.metrics());
                }
                Msg::Shutdown(reply) => {
                    let _ = reply.send(self.sched.counters().clone());
                }
                Msg::Abort(_) | Msg::AbortGroup(_) | Msg::Forget(_) => {}
            }
        }
        for (_, p) in self.pending.drain() {
            let _ = p.reply.send(Err(ProxyError::Shutdown));
        }
        self.tasks.shutdown().await;
    }
}

/// How long shutdown waits for backends to answer their cancellations.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
