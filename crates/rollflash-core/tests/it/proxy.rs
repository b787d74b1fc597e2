//! The proxy scheduler: admission, routing, aborts, pause/resume, failures, weight updates,
//! deadlines — and, under a seeded random event storm, the invariants (every request
//! completes exactly once, no backend over capacity, nothing dispatched to a backend behind
//! the current weights, no attempt left running past its deadline after a tick).

use std::collections::HashMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollflash_core::proxy::{
    Affinity, BackendId, Completion, GroupId, Outcome, ProxyAction, ProxyEvent, ProxySchedConfig,
    ProxyScheduler, Routing,
};
use rollflash_core::{PauseMode, PolicyVersion, RequestId};

/// A scheduler plus the bookkeeping a driver would do, so tests read as scripts.
struct Harness {
    s: ProxyScheduler,
    now: Duration,
    /// id -> (backend, attempt) of the current dispatch.
    running: HashMap<RequestId, (BackendId, u32)>,
    completed: Vec<(RequestId, Completion)>,
    cancels: Vec<(RequestId, BackendId)>,
    dispatch_log: Vec<(RequestId, BackendId)>,
}

impl Harness {
    fn new(policy: &str, capacities: &[usize]) -> Self {
        Harness::with_config(ProxySchedConfig::default(), policy, capacities)
    }

    fn with_config(cfg: ProxySchedConfig, policy: &str, capacities: &[usize]) -> Self {
        let mut s = ProxyScheduler::new(cfg, Routing::from_name(policy).unwrap().policy());
        for &c in capacities {
            s.add_backend(c);
        }
        Harness {
            s,
            now: Duration::ZERO,
            running: HashMap::new(),
            completed: Vec::new(),
            cancels: Vec::new(),
            dispatch_log: Vec::new(),
        }
    }

    fn ev(&mut self, e: ProxyEvent) {
        self.now += Duration::from_millis(1);
        let mut out = Vec::new();
        self.s.handle(self.now, e, &mut out);
        for a in out {
            match a {
                ProxyAction::Dispatch {
                    id,
                    backend,
                    attempt,
                } => {
                    assert!(
                        self.running.insert(id, (backend, attempt)).is_none()
                            || self.completed.iter().all(|(c, _)| *c != id),
                    );
                    assert!(
                        self.s.weights_of(backend) >= Some(self.s.current_weights()),
                        "{id} dispatched to {backend:?}, which holds {:?} < {:?}",
                        self.s.weights_of(backend),
                        self.s.current_weights()
                    );
                    self.dispatch_log.push((id, backend));
                }
                ProxyAction::Cancel { id, backend } => self.cancels.push((id, backend)),
                ProxyAction::Complete { id, completion } => {
                    assert!(
                        self.completed.iter().all(|(c, _)| *c != id),
                        "{id} completed twice"
                    );
                    self.running.remove(&id);
                    self.completed.push((id, completion));
                }
            }
        }
    }

    fn submit(&mut self, id: u64) {
        self.submit_with(id, None, Affinity::None);
    }

    fn submit_with(&mut self, id: u64, group: Option<u64>, affinity: Affinity) {
        self.ev(ProxyEvent::Submit {
            id: RequestId(id),
            group: group.map(GroupId),
            affinity,
        });
    }

    /// The backend answers the current attempt of `id`.
    fn finish(&mut self, id: u64, outcome: Outcome) {
        let (backend, attempt) = self.running.remove(&RequestId(id)).unwrap();
        self.ev(ProxyEvent::Finished {
            id: RequestId(id),
            backend,
            attempt,
            outcome,
        });
    }

    /// Lets `by` pass, then ticks: attempts past their deadline expire.
    fn tick_after(&mut self, by: Duration) {
        self.now += by;
        self.ev(ProxyEvent::Tick);
        assert!(
            self.s.next_deadline().is_none_or(|d| d > self.now),
            "an attempt is still running past its deadline after a tick"
        );
    }

    /// Each backend's load is exactly its running attempts among ids `0..n`: no slot leaks
    /// (an expired attempt's included).
    fn check_slots(&self, n: u64) {
        let mut load = vec![0; self.s.running().len()];
        for id in 0..n {
            if let Some((b, _)) = self.s.running_attempt(RequestId(id)) {
                load[b.0] += 1;
            }
        }
        assert_eq!(
            load,
            self.s.running(),
            "backend load out of step with its attempts"
        );
    }

    fn backend_of(&self, id: u64) -> Option<BackendId> {
        self.running.get(&RequestId(id)).map(|(b, _)| *b)
    }

    fn completion(&self, id: u64) -> Option<&Completion> {
        self.completed
            .iter()
            .find(|(c, _)| *c == RequestId(id))
            .map(|(_, c)| c)
    }
}

#[test]
fn admits_up_to_capacity_and_dispatches_as_slots_free() {
    let mut h = Harness::new("least_loaded", &[2]);
    for id in 0..5 {
        h.submit(id);
    }
    assert_eq!(h.s.running(), vec![2]);
    assert_eq!(h.s.queue_depth(), 3);
    // Queue scheduling: one finished request lets exactly one more start, in FIFO order.
    h.finish(1, Outcome::Done);
    assert_eq!(h.s.running(), vec![2]);
    assert_eq!(h.backend_of(2), Some(BackendId(0)));
    assert!(h.backend_of(3).is_none());
    h.finish(0, Outcome::Done);
    h.finish(2, Outcome::Done);
    h.finish(3, Outcome::Done);
    h.finish(4, Outcome::Done);
    assert_eq!(h.completed.len(), 5);
    assert_eq!(h.s.live(), 0);
    assert_eq!(h.s.counters().completed, 5);
    assert_eq!(h.s.latencies().len(), 5);
}

#[test]
fn round_robin_and_least_loaded_spread_requests() {
    let mut h = Harness::new("round_robin", &[4, 4, 4]);
    for id in 0..6 {
        h.submit(id);
    }
    let order: Vec<usize> = h.dispatch_log.iter().map(|(_, b)| b.0).collect();
    assert_eq!(order, vec![0, 1, 2, 0, 1, 2]);

    // Least loaded weighs by capacity: a backend twice as large gets twice the requests.
    let mut h = Harness::new("least_loaded", &[2, 4]);
    for id in 0..6 {
        h.submit(id);
    }
    assert_eq!(h.s.running(), vec![2, 4]);
}

#[test]
fn sticky_keeps_a_trajectory_on_its_backend_without_blocking_others() {
    let mut h = Harness::new("sticky", &[1, 2]);
    h.submit_with(0, None, Affinity::Sticky(7));
    // Both empty: least-loaded picks the lowest id.
    let home = BackendId(0);
    assert_eq!(h.backend_of(0), Some(home));
    h.finish(0, Outcome::Done);
    // Another request fills the home (0/1 ties 0/2; lowest id wins), then the trajectory's
    // next turn must wait for its home while a request without affinity still runs.
    h.submit(100);
    assert_eq!(h.backend_of(100), Some(home));
    h.submit_with(1, None, Affinity::Sticky(7));
    assert!(h.backend_of(1).is_none(), "turn 2 waits for its home");
    h.submit(2);
    assert_eq!(
        h.backend_of(2),
        Some(BackendId(1)),
        "others are not blocked behind it"
    );
    h.finish(100, Outcome::Done);
    assert_eq!(h.backend_of(1), Some(home));
}

#[test]
fn sticky_moves_when_its_backend_leaves_rotation() {
    let mut h = Harness::new("sticky", &[4, 4]);
    h.submit_with(0, None, Affinity::Sticky(9));
    let home = h.backend_of(0).unwrap();
    h.finish(0, Outcome::Done);
    h.ev(ProxyEvent::BackendDown { backend: home });
    h.submit_with(1, None, Affinity::Sticky(9));
    let now = h.backend_of(1).unwrap();
    assert_ne!(now, home);
}

#[test]
fn pinned_requests_share_one_backend_whatever_the_policy() {
    let mut h = Harness::new("round_robin", &[4, 4]);
    for id in 0..6 {
        h.submit_with(id, Some(1), Affinity::Pinned(1));
    }
    // All on the first backend chosen; the two that do not fit wait for it.
    let b = h.backend_of(0).unwrap();
    assert_eq!((0..4).filter(|&id| h.backend_of(id) == Some(b)).count(), 4);
    assert_eq!(h.s.queue_depth(), 2);
    // Unpinned work still uses the other backend.
    h.submit(10);
    assert!(h.backend_of(10).is_some_and(|x| x != b));
    h.finish(0, Outcome::Done);
    assert_eq!(h.backend_of(4), Some(b));
}

#[test]
fn abort_queued_completes_at_once_and_abort_running_waits_for_the_backend() {
    let mut h = Harness::new("least_loaded", &[1]);
    h.submit(0);
    h.submit(1);
    h.ev(ProxyEvent::Abort { id: RequestId(1) });
    assert_eq!(h.completion(1), Some(&Completion::Aborted));
    h.ev(ProxyEvent::Abort { id: RequestId(0) });
    assert_eq!(h.cancels, vec![(RequestId(0), BackendId(0))]);
    assert!(h.completion(0).is_none());
    h.finish(0, Outcome::Aborted);
    assert_eq!(h.completion(0), Some(&Completion::Aborted));
    assert_eq!(h.s.counters().aborted, 2);
}

#[test]
fn abort_group_reaches_queued_and_running_members_only() {
    let mut h = Harness::new("least_loaded", &[2]);
    h.submit_with(0, Some(1), Affinity::None);
    h.submit_with(1, Some(2), Affinity::None);
    h.submit_with(2, Some(1), Affinity::None);
    h.submit_with(3, Some(2), Affinity::None);
    h.ev(ProxyEvent::AbortGroup { group: GroupId(1) });
    // 0 was running: cancelled; 2 was queued: aborted now; group 2 untouched.
    assert_eq!(h.cancels, vec![(RequestId(0), BackendId(0))]);
    assert_eq!(h.completion(2), Some(&Completion::Aborted));
    h.finish(0, Outcome::Done);
    // A request that finished before the cancel landed is done, not aborted.
    assert_eq!(h.completion(0), Some(&Completion::Done));
    assert_eq!(h.backend_of(3), Some(BackendId(0)));
}

#[test]
fn pause_in_abort_mode_requeues_interrupted_requests_first() {
    let mut h = Harness::new("least_loaded", &[2]);
    for id in 0..4 {
        h.submit(id);
    }
    h.ev(ProxyEvent::Pause {
        mode: PauseMode::Abort,
    });
    // The backends were told to abort everything; both running requests come back aborted.
    h.finish(0, Outcome::Aborted);
    h.finish(1, Outcome::Done); // finished just before the abort landed
    assert!(h.completion(0).is_none(), "interrupted, not aborted");
    assert_eq!(h.completion(1), Some(&Completion::Done));
    assert!(h.running.is_empty(), "nothing dispatched while paused");
    h.ev(ProxyEvent::Resume);
    // The interrupted request resumes first, then the queue continues in order.
    let after: Vec<u64> = h.dispatch_log[2..].iter().map(|(id, _)| id.0).collect();
    assert_eq!(after, vec![0, 2]);
    assert_eq!(h.s.counters().preempted, 1);
}

#[test]
fn pause_in_keep_mode_lets_running_requests_finish() {
    let mut h = Harness::new("least_loaded", &[1]);
    h.submit(0);
    h.submit(1);
    h.ev(ProxyEvent::Pause {
        mode: PauseMode::Keep,
    });
    h.finish(0, Outcome::Done);
    assert_eq!(h.completion(0), Some(&Completion::Done));
    assert!(h.backend_of(1).is_none());
    h.ev(ProxyEvent::Resume);
    assert_eq!(h.backend_of(1), Some(BackendId(0)));
}

#[test]
fn a_dead_backend_requeues_its_requests_and_late_replies_are_ignored() {
    let mut h = Harness::new("round_robin", &[1, 1]);
    h.submit(0);
    h.submit(1);
    let (b0, a0) = h.running[&RequestId(0)];
    h.ev(ProxyEvent::BackendDown { backend: b0 });
    // Request 0 waits for the only healthy backend, which is busy with 1.
    assert_eq!(h.s.queue_depth(), 1);
    // The dead backend answers late: ignored, not completed.
    h.running.remove(&RequestId(0));
    h.ev(ProxyEvent::Finished {
        id: RequestId(0),
        backend: b0,
        attempt: a0,
        outcome: Outcome::Done,
    });
    assert!(h.completion(0).is_none());
    assert_eq!(h.s.counters().stale_replies, 1);
    h.finish(1, Outcome::Done);
    assert_ne!(h.backend_of(0), Some(b0));
    h.finish(0, Outcome::Done);
    assert_eq!(h.completion(0), Some(&Completion::Done));
    // The backend rejoins and gets work again.
    h.ev(ProxyEvent::BackendUp { backend: b0 });
    h.submit(2);
    h.submit(3);
    assert_eq!(h.s.running(), vec![1, 1]);
}

#[test]
fn retryable_failures_retry_then_fail() {
    let mut h = Harness::new("least_loaded", &[1]);
    h.submit(0);
    for _ in 0..3 {
        h.finish(
            0,
            Outcome::Failed {
                retryable: true,
                reason: "connection reset".into(),
            },
        );
        assert!(h.completion(0).is_none());
    }
    h.finish(
        0,
        Outcome::Failed {
            retryable: true,
            reason: "connection reset".into(),
        },
    );
    assert_eq!(
        h.completion(0),
        Some(&Completion::Failed {
            reason: "connection reset".into()
        })
    );
    h.submit(1);
    h.finish(
        1,
        Outcome::Failed {
            retryable: false,
            reason: "bad prompt".into(),
        },
    );
    assert!(matches!(h.completion(1), Some(Completion::Failed { .. })));
    assert_eq!(h.s.counters().retries, 3);
}

#[test]
fn duplicate_ids_are_refused() {
    let mut h = Harness::new("least_loaded", &[4]);
    h.submit(0);
    h.ev(ProxyEvent::Submit {
        id: RequestId(0),
        group: None,
        affinity: Affinity::None,
    });
    assert!(matches!(h.completion(0), Some(Completion::Failed { .. })));
    // The original is still running and completes normally... but the harness saw id 0
    // complete once already; the scheduler itself still tracks the original.
    assert_eq!(h.s.live(), 1);
}

/// A sync that fails on one backend: it leaves rotation at once (its running request is
/// re-queued, and the late reply ignored), health probes alone do not bring it back, and it
/// rejoins when it reports the current weights — not older ones.
#[test]
fn a_failed_weight_update_keeps_the_backend_out_until_it_holds_the_current_weights() {
    let mut h = Harness::new("round_robin", &[2, 2]);
    let (b0, b1) = (BackendId(0), BackendId(1));
    for id in 0..4 {
        h.submit(id);
    }
    assert_eq!(h.s.running(), vec![2, 2]);
    let on_b1: Vec<u64> = (0..4).filter(|&i| h.backend_of(i) == Some(b1)).collect();
    // Keep-mode sync to v1: b0 loads it, b1 fails.
    h.ev(ProxyEvent::Pause {
        mode: PauseMode::Keep,
    });
    h.ev(ProxyEvent::WeightsLoaded {
        backend: b0,
        version: PolicyVersion(1),
    });
    assert!(
        !h.s.is_healthy(b1),
        "behind the current weights: no new work"
    );
    assert_eq!(
        h.s.running(),
        vec![2, 2],
        "keep mode: b1's requests still run"
    );
    let stale: Vec<(RequestId, (BackendId, u32))> = on_b1
        .iter()
        .map(|&i| (RequestId(i), h.running[&RequestId(i)]))
        .collect();
    h.running.retain(|_, (b, _)| *b != b1);
    h.ev(ProxyEvent::WeightsFailed {
        backend: b1,
        version: PolicyVersion(1),
    });
    assert_eq!(h.s.running(), vec![2, 0], "its requests were taken back");
    assert_eq!(h.s.queue_depth(), 2);
    h.ev(ProxyEvent::Resume);
    // Late replies from b1's old attempts are ignored.
    for (id, (backend, attempt)) in stale {
        h.ev(ProxyEvent::Finished {
            id,
            backend,
            attempt,
            outcome: Outcome::Done,
        });
        assert!(h.completion(id.0).is_none());
    }
    // Healthy again, but still on old weights: stays out.
    h.ev(ProxyEvent::BackendUp { backend: b1 });
    h.ev(ProxyEvent::WeightsLoaded {
        backend: b1,
        version: PolicyVersion(0),
    });
    assert!(!h.s.is_healthy(b1));
    for id in 0..2 {
        h.finish(id, Outcome::Done);
    }
    assert!(h.running.values().all(|(b, _)| *b == b0));
    // Caught up: rejoins and takes the queue.
    h.ev(ProxyEvent::WeightsLoaded {
        backend: b1,
        version: PolicyVersion(1),
    });
    assert!(h.s.is_healthy(b1));
    for id in 4..8 {
        h.submit(id);
    }
    assert!(h.running.values().any(|(b, _)| *b == b1));
    assert_eq!(h.s.weights_of(b1), Some(PolicyVersion(1)));
    assert_eq!(h.s.current_weights(), PolicyVersion(1));
}

fn with_timeout(t: Duration) -> ProxySchedConfig {
    ProxySchedConfig {
        request_timeout: Some(t),
        ..ProxySchedConfig::default()
    }
}

/// A backend that took a request and never answers: at the deadline the attempt is cancelled
/// on it, its slot freed, and the request retried on the other backend; the hung backend's
/// late reply is ignored.
#[test]
fn an_attempt_past_its_deadline_is_cancelled_and_retried_elsewhere() {
    let t = Duration::from_secs(10);
    let mut h = Harness::with_config(with_timeout(t), "least_loaded", &[1, 1]);
    let (b0, b1) = (BackendId(0), BackendId(1));
    h.submit(0);
    let (first, a0) = h.running[&RequestId(0)];
    assert_eq!(first, b0);
    let deadline = h.s.next_deadline().unwrap();
    assert_eq!(deadline, h.now + t, "counted from the dispatch");
    // Not yet due: a tick changes nothing.
    h.tick_after(t / 2);
    assert_eq!(h.s.running_attempt(RequestId(0)), Some((b0, a0)));
    assert!(h.cancels.is_empty());
    h.tick_after(deadline - h.now);
    assert_eq!(h.cancels, vec![(RequestId(0), b0)]);
    assert_eq!(
        h.s.running_attempt(RequestId(0)),
        Some((b1, a0 + 1)),
        "retried on the other backend"
    );
    assert_eq!(h.s.running(), vec![0, 1], "the hung backend's slot is free");
    assert_eq!((h.s.counters().timeouts, h.s.counters().retries), (1, 1));
    // The hung backend wakes up and answers the expired attempt: stale, ignored.
    h.ev(ProxyEvent::Finished {
        id: RequestId(0),
        backend: b0,
        attempt: a0,
        outcome: Outcome::Done,
    });
    assert!(h.completion(0).is_none());
    assert_eq!(h.s.counters().stale_replies, 1);
    h.finish(0, Outcome::Done);
    assert_eq!(h.completion(0), Some(&Completion::Done));
    assert_eq!(h.s.next_deadline(), None);
}

/// With one backend the retries go back to it (waiting for another would be waiting
/// forever); once they are spent the request fails with a reason saying it timed out.
#[test]
fn a_request_that_keeps_timing_out_fails_as_timed_out_after_its_retries() {
    let t = Duration::from_secs(10);
    let mut h = Harness::with_config(with_timeout(t), "round_robin", &[2]);
    h.submit(0);
    h.submit(1);
    for k in 1..=3 {
        h.tick_after(t);
        assert!(h.completion(0).is_none() && h.completion(1).is_none());
        assert_eq!(h.s.running(), vec![2], "retry {k} dispatched again");
    }
    h.tick_after(t);
    for id in [0, 1] {
        let Some(Completion::Failed { reason }) = h.completion(id) else {
            panic!("{id}: {:?}", h.completion(id));
        };
        assert!(reason.starts_with("timed out"), "{reason}");
    }
    let c = h.s.counters();
    assert_eq!((c.timeouts, c.retries, c.failed), (8, 6, 2));
    assert_eq!(h.cancels.len(), 8, "every expired attempt was cancelled");
    assert_eq!(h.s.running(), vec![0]);
    assert_eq!((h.s.live(), h.s.next_deadline()), (0, None));
}

/// Queued requests have no deadline (waiting for a slot is not the backend's fault); a
/// request the caller aborted whose backend never confirms completes as aborted at its
/// deadline, without a second cancel; without a `request_timeout` nothing ever expires.
#[test]
fn deadlines_cover_running_attempts_only_and_an_unconfirmed_abort_ends_at_its_deadline() {
    let t = Duration::from_secs(10);
    let mut h = Harness::with_config(with_timeout(t), "least_loaded", &[1]);
    h.submit(0);
    let d0 = h.s.next_deadline().unwrap();
    h.submit(1);
    assert_eq!(h.s.next_deadline(), Some(d0), "the queued request has none");
    h.ev(ProxyEvent::Abort { id: RequestId(0) });
    assert_eq!(h.cancels.len(), 1);
    h.tick_after(d0 - h.now);
    assert_eq!(h.completion(0), Some(&Completion::Aborted));
    assert_eq!(h.cancels.len(), 1, "no second cancel");
    assert_eq!(
        h.backend_of(1),
        Some(BackendId(0)),
        "its slot went to the next"
    );
    let d1 = h.s.next_deadline().unwrap();
    assert_eq!(
        d1,
        h.now + t,
        "counted from its own dispatch, not its submit"
    );

    let mut h = Harness::new("least_loaded", &[1]);
    h.submit(0);
    assert_eq!(h.s.next_deadline(), None);
    h.tick_after(Duration::from_secs(1 << 40));
    assert!(h.completion(0).is_none() && h.cancels.is_empty());
    assert_eq!(h.s.counters().timeouts, 0);
}

/// A sticky trajectory and a pinned group move off the backend they timed out on, like
/// they do off a dead one; a timed-out request waits for a full healthy backend rather
/// than going back to the one that hung.
#[test]
fn a_timed_out_request_moves_its_affinity_and_waits_for_room_elsewhere() {
    let t = Duration::from_secs(10);
    for affinity in [Affinity::Sticky(3), Affinity::Pinned(3)] {
        let mut h = Harness::with_config(with_timeout(t), "sticky", &[1, 1]);
        h.submit_with(0, None, affinity);
        let home = h.backend_of(0).unwrap();
        // Half a deadline later, 1 fills the other backend and 2 waits.
        h.now += t / 2;
        h.submit(1);
        let other = h.backend_of(1).unwrap();
        assert_ne!(home, other);
        h.submit(2);
        assert_eq!(h.s.queue_depth(), 1);
        // 0 never answers: at its deadline (1's is later) it expires.
        h.tick_after(t / 2);
        assert_eq!(h.cancels, vec![(RequestId(0), home)]);
        // 0 is first in line but must not go back to `home`, whose freed slot goes to 2.
        assert_eq!(h.backend_of(2), Some(home));
        assert_eq!(h.s.running_attempt(RequestId(0)), None);
        h.finish(1, Outcome::Done);
        assert_eq!(
            h.s.running_attempt(RequestId(0)).map(|(b, _)| b),
            Some(other),
            "{affinity:?}"
        );
        // The trajectory's next turn follows it there.
        h.finish(0, Outcome::Done);
        h.submit_with(3, None, affinity);
        assert_eq!(h.backend_of(3), Some(other), "{affinity:?}");
    }
}

/// A seeded storm of submits, finishes, aborts, group aborts, pauses, backend failures,
/// weight updates that fail on random backends and — on even seeds, which set a
/// `request_timeout` — time jumps with ticks that expire attempts (whose late replies then
/// come in as stale ones).
/// Whatever happens: every request completes exactly once, no backend runs past capacity,
/// no slot leaks, nothing runs past its deadline after a tick, and the counters add up.
/// Every fourth seed ends with every backend hanging: ticks alone must then end every
/// request.
#[test]
fn random_event_storm_keeps_the_invariants() {
    for policy in ["round_robin", "least_loaded", "sticky"] {
        for seed in 0..20u64 {
            storm(policy, seed);
        }
    }
}

fn storm(policy: &str, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let caps = [1 + rng.random_range(0..4), 1 + rng.random_range(0..4), 2];
    let timeout = seed
        .is_multiple_of(2)
        .then(|| Duration::from_millis(rng.random_range(20..200)));
    let cfg = ProxySchedConfig {
        request_timeout: timeout,
        ..ProxySchedConfig::default()
    };
    let mut h = Harness::with_config(cfg, policy, &caps);
    let mut next_id = 0u64;
    let mut down = [false; 3];
    let mut version = 0u64;
    for _ in 0..2000 {
        match rng.random_range(0..108) {
            104..=107 => {
                // Time passes (each event is 1 ms) and the driver's timer fires.
                let by = Duration::from_millis(rng.random_range(0..100));
                h.tick_after(by);
                h.check_slots(next_id);
            }
            100..=101 => {
                // A sync of a new version: each backend loads it or fails.
                version += 1;
                for b in 0..3 {
                    let backend = BackendId(b);
                    let v = PolicyVersion(version);
                    if rng.random_bool(0.3) {
                        h.running.retain(|_, (bk, _)| bk.0 != b);
                        h.ev(ProxyEvent::WeightsFailed {
                            backend,
                            version: v,
                        });
                    } else {
                        h.ev(ProxyEvent::WeightsLoaded {
                            backend,
                            version: v,
                        });
                    }
                }
            }
            102..=103 => {
                // A catch-up: one backend loads the current version.
                let b = rng.random_range(0..3);
                h.ev(ProxyEvent::WeightsLoaded {
                    backend: BackendId(b),
                    version: PolicyVersion(version),
                });
            }
            0..=34 => {
                let group = Some(rng.random_range(0..8));
                let affinity = match rng.random_range(0..3) {
                    0 => Affinity::Sticky(rng.random_range(0..16)),
                    1 => Affinity::Pinned(rng.random_range(0..16)),
                    _ => Affinity::None,
                };
                h.submit_with(next_id, group, affinity);
                next_id += 1;
            }
            35..=69 => {
                if let Some(&id) = pick(&mut rng, &h.running.keys().copied().collect::<Vec<_>>()) {
                    let outcome = match rng.random_range(0..10) {
                        0 => Outcome::Aborted,
                        1 => Outcome::Failed {
                            retryable: rng.random_bool(0.7),
                            reason: "x".into(),
                        },
                        _ => Outcome::Done,
                    };
                    h.finish(id.0, outcome);
                }
            }
            70..=74 => {
                let id = RequestId(rng.random_range(0..next_id.max(1)));
                h.ev(ProxyEvent::Abort { id });
            }
            75..=77 => {
                let group = GroupId(rng.random_range(0..8));
                h.ev(ProxyEvent::AbortGroup { group });
            }
            78..=81 => {
                let mode = if rng.random_bool(0.5) {
                    PauseMode::Abort
                } else {
                    PauseMode::Keep
                };
                h.ev(ProxyEvent::Pause { mode });
            }
            82..=89 => h.ev(ProxyEvent::Resume),
            90..=94 => {
                let b = rng.random_range(0..3);
                if !down[b] && down.iter().filter(|d| !**d).count() > 1 {
                    down[b] = true;
                    // Requests on it are lost: the driver forgets them.
                    h.running.retain(|_, (bk, _)| bk.0 != b);
                    h.ev(ProxyEvent::BackendDown {
                        backend: BackendId(b),
                    });
                }
            }
            _ => {
                let b = rng.random_range(0..3);
                if down[b] {
                    down[b] = false;
                    h.ev(ProxyEvent::BackendUp {
                        backend: BackendId(b),
                    });
                }
            }
        }
        for (b, &cap) in h.s.running().iter().zip(&caps) {
            assert!(*b <= cap, "seed {seed}: over capacity");
        }
    }
    // Drain: resume, bring everything up and current, finish whatever runs until nothing is
    // live.
    h.ev(ProxyEvent::Resume);
    for b in 0..3 {
        h.ev(ProxyEvent::WeightsLoaded {
            backend: BackendId(b),
            version: PolicyVersion(version),
        });
    }
    for (b, _) in down.iter().enumerate().filter(|(_, d)| **d) {
        h.ev(ProxyEvent::BackendUp {
            backend: BackendId(b),
        });
    }
    let mut guard = 0;
    match timeout {
        Some(t) if seed.is_multiple_of(4) => {
            // Every backend hangs: nothing answers any more, yet every request ends.
            while h.s.live() > 0 {
                h.tick_after(t);
                guard += 1;
                assert!(
                    guard < 100_000,
                    "seed {seed}: hung drain does not terminate"
                );
            }
        }
        _ => {
            while let Some(&id) = h.running.keys().next() {
                h.finish(id.0, Outcome::Done);
                guard += 1;
                assert!(guard < 100_000, "seed {seed}: drain does not terminate");
            }
        }
    }
    assert_eq!(h.s.live(), 0, "seed {seed}: requests left behind");
    h.check_slots(next_id);
    assert_eq!(h.s.running(), vec![0; 3], "seed {seed}: slots leaked");
    assert_eq!(h.s.next_deadline(), None, "seed {seed}");
    assert_eq!(h.completed.len() as u64, next_id, "seed {seed}");
    let c = h.s.counters();
    assert_eq!(c.submitted, next_id);
    assert_eq!(
        c.completed + c.aborted + c.failed,
        next_id,
        "seed {seed}: {c:?}"
    );
    if timeout.is_some() {
        assert!(c.timeouts > 0, "seed {seed}: the storm expired nothing");
    } else {
        assert_eq!(c.timeouts, 0, "seed {seed}");
    }
}

fn pick<'a, T>(rng: &mut ChaCha8Rng, v: &'a [T]) -> Option<&'a T> {
    if v.is_empty() {
        None
    } else {
        v.get(rng.random_range(0..v.len()))
    }
}
