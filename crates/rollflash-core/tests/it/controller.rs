//! The controller state machine: scripted runs (a lost group counts as failed and frees its
//! admission slot, a sync nobody serves stalls the run after the timeout, a stop publishes
//! the running step) and, under seeded random storms of finishing groups, lost groups,
//! failed syncs and stops, the invariants: staleness ≤ ⌈α⌉, the accounting balanced after
//! every event, at most one step in flight, the synchronous baseline never generating while
//! it trains, and every run ending with nothing running or buffered.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollflash_core::buffer::{BufferConfig, GroupFilter, GroupKey, GroupOutcome};
use rollflash_core::controller::{
    ControllerCore, CoreAction, CoreConfig, CoreEvent, Cursor, ResumeFrom, RunEnd,
};
use rollflash_core::PolicyVersion;

fn cfg(groups: usize, size: usize, alpha: f64, steps: usize) -> CoreConfig {
    CoreConfig {
        buffer: BufferConfig {
            groups_per_batch: groups,
            group_size: size,
            alpha,
            ..Default::default()
        },
        redundancy: 0,
        steps,
        seed: 100,
        serve_timeout: Duration::from_secs(60),
        progress_timeout: Duration::from_secs(600),
    }
}

fn complete(size: usize) -> GroupOutcome<u32> {
    GroupOutcome {
        samples: (0..size).map(|i| (i as u32, (i % 2) as f64)).collect(),
        aborted: 0,
        failed: 0,
    }
}

fn starts(out: &[CoreAction<u32>]) -> Vec<(GroupKey, u64)> {
    out.iter()
        .filter_map(|a| match a {
            CoreAction::StartGroup { key, seed, .. } => Some((*key, *seed)),
            _ => None,
        })
        .collect()
}

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

#[test]
fn a_synchronous_step_in_order_admit_train_sync_publish() {
    let mut c = cfg(2, 2, 0.0, 1);
    c.buffer.barrier = true;
    let mut core = ControllerCore::<u32>::new(c, None, s(0)).unwrap();
    let mut out = Vec::new();
    core.handle(s(0), CoreEvent::Tick, &mut out);
    let started = starts(&out);
    assert_eq!(started.len(), 2);
    assert_eq!(started[0].1, 100, "group k uses seed + k");
    assert_eq!(started[1].1, 101);
    out.clear();
    core.handle(
        s(1),
        CoreEvent::GroupFinished {
            key: started[0].0,
            outcome: complete(2),
        },
        &mut out,
    );
    assert!(out.is_empty());
    core.handle(
        s(3),
        CoreEvent::GroupFinished {
            key: started[1].0,
            outcome: complete(2),
        },
        &mut out,
    );
    assert!(matches!(&out[..], [CoreAction::Train { batch }] if batch.len() == 4));
    out.clear();
    core.handle(s(7), CoreEvent::TrainFinished, &mut out);
    assert!(matches!(
        &out[..],
        [CoreAction::Sync {
            version: PolicyVersion(1)
        }]
    ));
    out.clear();
    core.handle(s(8), CoreEvent::SyncFinished { serving: true }, &mut out);
    let [CoreAction::Published(p), CoreAction::Done(RunEnd::Completed)] = &out[..] else {
        panic!("{out:?}");
    };
    assert_eq!(p.step, 0);
    assert_eq!(p.version, PolicyVersion(0));
    assert_eq!((p.wait, p.train, p.sync, p.wall), (s(3), s(4), s(1), s(8)));
    // Idle: from the last group's end (3 s) to the publication, training included.
    assert_eq!(p.rollout_idle, s(5));
    assert_eq!(
        p.cursor,
        Cursor {
            steps_done: 1,
            version: PolicyVersion(1),
            next_seed: 102
        }
    );
    let sum = core.close(s(8));
    assert!(sum.accounting.balanced());
    assert_eq!(sum.accounting.trained, 4);
}

/// A group whose task panicked counts as failed (all its samples), and a replacement group
/// is admitted: under the synchronous barrier the run would otherwise wait forever.
#[test]
fn a_lost_group_counts_as_failed_and_another_is_admitted() {
    let mut c = cfg(2, 2, 0.0, 1);
    c.buffer.barrier = true;
    c.redundancy = 1;
    let mut core = ControllerCore::<u32>::new(c, None, s(0)).unwrap();
    let mut out = Vec::new();
    core.handle(s(0), CoreEvent::Tick, &mut out);
    let first = starts(&out);
    out.clear();
    core.handle(
        s(1),
        CoreEvent::GroupLost {
            key: first[0].0,
            reason: "panicked: boom".into(),
        },
        &mut out,
    );
    let again = starts(&out);
    assert_eq!(again.len(), 1, "a replacement group starts: {out:?}");
    assert_eq!(again[0].1, 102, "with the next seed");
    let a = core.accounting();
    assert_eq!(a.failed, 3, "group_size + redundancy samples failed: {a:?}");
    assert!(a.balanced());
    for (key, _) in [first[1], again[0]] {
        core.handle(
            s(2),
            CoreEvent::GroupFinished {
                key,
                outcome: complete(2),
            },
            &mut out,
        );
    }
    assert!(out.iter().any(|a| matches!(a, CoreAction::Train { .. })));
    let sum = core.close(s(2));
    assert_eq!(sum.lost_groups, vec!["panicked: boom".to_string()]);
}

/// A sync that leaves no backend at the new version: the run goes on until
/// `serve_timeout`, then stops as stalled — unless a backend reports serving first.
#[test]
fn a_sync_nobody_serves_stalls_the_run_after_the_timeout() {
    for recovers in [false, true] {
        let mut c = cfg(1, 1, 0.0, 3);
        c.serve_timeout = s(30);
        let mut core = ControllerCore::<u32>::new(c, None, s(0)).unwrap();
        let mut out = Vec::new();
        core.handle(s(0), CoreEvent::Tick, &mut out);
        let g = starts(&out)[0].0;
        core.handle(
            s(1),
            CoreEvent::GroupFinished {
                key: g,
                outcome: complete(1),
            },
            &mut out,
        );
        core.handle(s(2), CoreEvent::TrainFinished, &mut out);
        out.clear();
        core.handle(s(3), CoreEvent::SyncFinished { serving: false }, &mut out);
        assert_eq!(core.serve_deadline(), Some(s(33)));
        assert!(!core.is_done());
        let next = starts(&out);
        assert_eq!(next.len(), 1, "the run goes on meanwhile");
        out.clear();
        if recovers {
            core.handle(s(20), CoreEvent::Serving, &mut out);
            assert_eq!(core.serve_deadline(), None);
        }
        core.handle(s(33), CoreEvent::Tick, &mut out);
        if recovers {
            assert!(!core.is_done(), "{out:?}");
        } else {
            assert!(
                matches!(
                    out.last(),
                    Some(CoreAction::Done(RunEnd::Stalled {
                        version: PolicyVersion(1),
                        waited,
                    })) if *waited == s(30)
                ),
                "{out:?}"
            );
            let sum = core.close(s(33));
            assert!(sum.accounting.balanced());
            assert_eq!(sum.accounting.running, 0);
            assert_eq!(sum.cursor.version, PolicyVersion(1));
        }
    }
}

/// Every backend went down between syncs (`Unserved`): the same deadline runs, and the run
/// stops as stalled at the version it had, with the groups still running counted — unless
/// a backend comes back first.
#[test]
fn a_fleet_that_goes_down_mid_run_stalls_it_after_the_timeout() {
    for recovers in [false, true] {
        let mut c = cfg(1, 1, 1.0, 3);
        c.serve_timeout = s(30);
        let mut core = ControllerCore::<u32>::new(c, None, s(0)).unwrap();
        let mut out = Vec::new();
        core.handle(s(0), CoreEvent::Tick, &mut out);
        assert!(!starts(&out).is_empty());
        out.clear();
        core.handle(s(5), CoreEvent::Unserved, &mut out);
        assert_eq!(core.serve_deadline(), Some(s(35)));
        // A second report does not move the deadline.
        core.handle(s(10), CoreEvent::Unserved, &mut out);
        assert_eq!(core.serve_deadline(), Some(s(35)));
        if recovers {
            core.handle(s(20), CoreEvent::Serving, &mut out);
            assert_eq!(core.serve_deadline(), None);
        }
        core.handle(s(35), CoreEvent::Tick, &mut out);
        if recovers {
            assert!(!core.is_done(), "{out:?}");
            continue;
        }
        assert!(
            matches!(
                out.last(),
                Some(CoreAction::Done(RunEnd::Stalled {
                    version: PolicyVersion(0),
                    waited,
                })) if *waited == s(30)
            ),
            "{out:?}"
        );
        let sum = core.close(s(35));
        assert!(sum.accounting.balanced());
        assert_eq!(sum.accounting.running, 0);
    }
}

/// A stop while a step trains: rollout is aborted at once, the step is still synced and
/// published, then the run ends as interrupted.
#[test]
fn a_stop_publishes_the_running_step_then_ends() {
    let mut core = ControllerCore::<u32>::new(cfg(1, 1, 1.0, 5), None, s(0)).unwrap();
    let mut out = Vec::new();
    core.handle(s(0), CoreEvent::Tick, &mut out);
    let g = starts(&out);
    assert_eq!(g.len(), 2, "α = 1 admits two batches");
    core.handle(
        s(1),
        CoreEvent::GroupFinished {
            key: g[0].0,
            outcome: complete(1),
        },
        &mut out,
    );
    out.clear();
    core.handle(s(2), CoreEvent::Stop, &mut out);
    assert!(matches!(&out[..], [CoreAction::AbortRollout]), "{out:?}");
    out.clear();
    core.handle(s(3), CoreEvent::TrainFinished, &mut out);
    core.handle(s(4), CoreEvent::SyncFinished { serving: true }, &mut out);
    assert!(matches!(
        &out[..],
        [
            CoreAction::Sync { .. },
            CoreAction::Published(_),
            CoreAction::Done(RunEnd::Interrupted)
        ]
    ));
    // The aborted group never reports; `close` counts it.
    let sum = core.close(s(4));
    assert_eq!(sum.accounting.aborted, 1);
    assert!(sum.accounting.balanced());
    assert_eq!(sum.cursor.steps_done, 1);
}

#[test]
fn a_resumed_run_continues_at_the_cursor() {
    let from = ResumeFrom {
        cursor: Cursor {
            steps_done: 3,
            version: PolicyVersion(3),
            next_seed: 140,
        },
        accounting: Default::default(),
    };
    let mut core = ControllerCore::<u32>::new(cfg(2, 1, 0.0, 4), Some(from), s(0)).unwrap();
    let mut out = Vec::new();
    core.handle(s(0), CoreEvent::Tick, &mut out);
    let g = starts(&out);
    assert_eq!(g.iter().map(|x| x.1).collect::<Vec<_>>(), vec![140, 141]);
    for (key, _) in g {
        core.handle(
            s(1),
            CoreEvent::GroupFinished {
                key,
                outcome: complete(1),
            },
            &mut out,
        );
    }
    core.handle(s(2), CoreEvent::TrainFinished, &mut out);
    core.handle(s(3), CoreEvent::SyncFinished { serving: true }, &mut out);
    let p = out
        .iter()
        .find_map(|a| match a {
            CoreAction::Published(p) => Some(p),
            _ => None,
        })
        .unwrap();
    assert_eq!(p.step, 3);
    assert_eq!(p.version, PolicyVersion(3));
    assert!(matches!(
        out.last(),
        Some(CoreAction::Done(RunEnd::Completed))
    ));
}

/// What the storm's driver is doing.
#[derive(Debug)]
enum Ev {
    Group(GroupKey),
    TrainDone,
    SyncDone,
    Stop,
    Serving,
    Deadline,
}

/// One seeded storm: groups finish after random delays with random outcomes (complete,
/// short, some lost), steps train and sync for random times, some syncs reach no backend
/// (a backend comes back later, or never), and some runs are stopped midway.
fn storm(seed: u64) -> RunEnd {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let sync = rng.random_bool(0.3);
    let alpha = if sync {
        0.0
    } else {
        [0.5, 1.0, 1.5, 2.0, 4.0][rng.random_range(0..5)]
    };
    let group_size = rng.random_range(1..4);
    let mut c = CoreConfig {
        buffer: BufferConfig {
            groups_per_batch: rng.random_range(1..4),
            group_size,
            alpha,
            extra_groups: rng.random_range(0..2),
            // A group of one has one reward: the zero-variance filter would drop them all.
            filter: if group_size > 1 && rng.random_bool(0.5) {
                GroupFilter::ZeroVariance
            } else {
                GroupFilter::None
            },
            barrier: sync,
        },
        redundancy: rng.random_range(0..2),
        steps: rng.random_range(1..12),
        seed: 7,
        serve_timeout: Duration::from_secs(50),
        // Storm events are seconds apart: only the serve deadline ends these runs early.
        progress_timeout: Duration::MAX,
    };
    if sync {
        c.redundancy = 0;
    }
    let max_staleness = c.buffer.max_staleness();
    let members = c.group_samples() as usize;
    let steps = c.steps;
    let mut core = ControllerCore::<u32>::new(c, None, Duration::ZERO).unwrap();
    let mut queue: BTreeMap<(u64, u64), Ev> = BTreeMap::new();
    let mut seq = 0u64;
    let mut push = |q: &mut BTreeMap<(u64, u64), Ev>, at: u64, ev: Ev| {
        seq += 1;
        q.insert((at, seq), ev);
    };
    if rng.random_bool(0.2) {
        push(&mut queue, rng.random_range(0..400), Ev::Stop);
    }
    let mut running: BTreeSet<GroupKey> = BTreeSet::new();
    let mut training = false;
    let mut syncing = false;
    let mut published = 0usize;
    let mut seeds = BTreeSet::new();
    let mut end = None;
    let mut out = Vec::new();
    let mut now = 0u64;
    let mut ev = CoreEvent::Tick;
    let mut guard = 0;
    loop {
        guard += 1;
        assert!(guard < 100_000, "seed {seed}: the storm did not end");
        core.handle(Duration::from_secs(now), ev, &mut out);
        assert!(
            core.accounting().balanced(),
            "seed {seed}: {:?}",
            core.accounting()
        );
        for a in out.drain(..) {
            match a {
                CoreAction::StartGroup { key, seed: s, .. } => {
                    assert!(end.is_none(), "seed {seed}: a group started after Done");
                    assert!(
                        !(sync && training),
                        "seed {seed}: the synchronous baseline generated while training"
                    );
                    assert!(seeds.insert(s), "seed {seed}: task seed {s} used twice");
                    running.insert(key);
                    push(&mut queue, now + rng.random_range(1..30), Ev::Group(key));
                }
                CoreAction::Train { batch } => {
                    assert!(!training, "seed {seed}: two steps in flight");
                    for g in &batch.groups {
                        let st = batch.version.0 - g.start.0;
                        assert!(st <= max_staleness, "seed {seed}: staleness {st}");
                        assert_eq!(g.samples.len(), group_size);
                    }
                    training = true;
                    push(&mut queue, now + rng.random_range(1..20), Ev::TrainDone);
                }
                CoreAction::Sync { .. } => {
                    assert!(training && !syncing);
                    syncing = true;
                    push(&mut queue, now + rng.random_range(0..3), Ev::SyncDone);
                }
                CoreAction::Published(p) => {
                    assert!(syncing);
                    assert_eq!(p.step, published);
                    assert!(p.staleness_max <= max_staleness);
                    assert!(p.accounting.balanced());
                    published += 1;
                    training = false;
                    syncing = false;
                }
                CoreAction::AbortRollout => {
                    // The driver aborts every group: they never report.
                    running.clear();
                }
                CoreAction::Done(e) => {
                    assert!(end.is_none());
                    end = Some(e);
                }
            }
        }
        if end.is_some() {
            break;
        }
        let Some(((at, _), next)) = queue.pop_first() else {
            panic!("seed {seed}: nothing left to happen and the run is not done");
        };
        now = at;
        ev = match next {
            Ev::Group(key) => {
                if !running.remove(&key) {
                    CoreEvent::Tick
                } else if rng.random_bool(0.05) {
                    CoreEvent::GroupLost {
                        key,
                        reason: "panicked".into(),
                    }
                } else {
                    let kept = if rng.random_bool(0.1) {
                        rng.random_range(0..group_size)
                    } else {
                        group_size
                    };
                    let failed = rng.random_range(0..=members - kept);
                    CoreEvent::GroupFinished {
                        key,
                        outcome: GroupOutcome {
                            samples: (0..kept)
                                .map(|i| (i as u32, f64::from(rng.random_range(0..2u8))))
                                .collect(),
                            aborted: (members - kept - failed) as u64,
                            failed: failed as u64,
                        },
                    }
                }
            }
            Ev::TrainDone => CoreEvent::TrainFinished,
            Ev::SyncDone => {
                let serving = rng.random_bool(0.8);
                if !serving && rng.random_bool(0.5) {
                    push(&mut queue, now + rng.random_range(1..80), Ev::Serving);
                }
                if !serving {
                    // The driver ticks at the deadline.
                    push(&mut queue, now + 50, Ev::Deadline);
                }
                CoreEvent::SyncFinished { serving }
            }
            Ev::Serving => CoreEvent::Serving,
            Ev::Stop => CoreEvent::Stop,
            Ev::Deadline => CoreEvent::Tick,
        };
    }
    // The driver drains: every group still running ends (aborted), then close.
    for key in std::mem::take(&mut running) {
        core.handle(
            Duration::from_secs(now),
            CoreEvent::GroupFinished {
                key,
                outcome: GroupOutcome {
                    samples: Vec::new(),
                    aborted: members as u64,
                    failed: 0,
                },
            },
            &mut out,
        );
    }
    let sum = core.close(Duration::from_secs(now));
    let a = sum.accounting;
    assert!(a.balanced(), "seed {seed}: {a:?}");
    assert_eq!((a.running, a.buffered), (0, 0), "seed {seed}: {a:?}");
    assert_eq!(sum.cursor.steps_done, published);
    assert_eq!(sum.cursor.version, PolicyVersion(published as u64));
    match end {
        Some(RunEnd::Completed) => assert_eq!(published, steps, "seed {seed}"),
        Some(RunEnd::Interrupted | RunEnd::Stalled { .. } | RunEnd::NoProgress { .. }) => {
            assert!(published <= steps, "seed {seed}")
        }
        None => panic!("seed {seed}: no end"),
    }
    let trained: u64 = sum.staleness.iter().map(|(_, n)| n).sum();
    assert_eq!(trained, a.trained);
    assert!(sum.staleness.iter().all(|(s, _)| *s <= max_staleness));
    end.unwrap()
}

#[test]
fn seeded_storms_keep_the_invariants() {
    let (mut completed, mut interrupted, mut stalled) = (0, 0, 0);
    for seed in 0..400 {
        match storm(seed) {
            RunEnd::Completed => completed += 1,
            RunEnd::Interrupted => interrupted += 1,
            RunEnd::Stalled { .. } => stalled += 1,
            RunEnd::NoProgress { .. } => panic!("seed {seed}: no progress deadline in storms"),
        }
    }
    // The storms reach every way a run ends.
    assert!(
        completed > 0 && interrupted > 0 && stalled > 0,
        "{completed} completed, {interrupted} interrupted, {stalled} stalled"
    );
}

/// Every group failing (an environment server that died and stays down) never forms a
/// batch: between steps, `progress_timeout` after the last sample entered the buffer, the
/// run ends as `NoProgress` with what ended meanwhile — unless a group adds a sample first,
/// which restarts the deadline. A step in flight suspends it.
#[test]
fn a_run_whose_groups_all_fail_stops_after_the_progress_timeout() {
    let failed = |n: u64| GroupOutcome::<u32> {
        samples: Vec::new(),
        aborted: 0,
        failed: n,
    };
    for recovers in [false, true] {
        let mut c = cfg(2, 2, 1.0, 3);
        c.progress_timeout = s(100);
        let mut core = ControllerCore::<u32>::new(c, None, s(0)).unwrap();
        let mut out = Vec::new();
        core.handle(s(0), CoreEvent::Tick, &mut out);
        assert_eq!(core.progress_deadline(), Some(s(100)));
        let mut t = 1;
        // Each failed group is replaced at once; none adds a sample.
        for _ in 0..20 {
            let g = starts(&out)[0].0;
            out.clear();
            core.handle(
                s(t),
                CoreEvent::GroupFinished {
                    key: g,
                    outcome: failed(2),
                },
                &mut out,
            );
            t += 4;
        }
        assert!(!core.is_done());
        assert_eq!(
            core.progress_deadline(),
            Some(s(100)),
            "failures are not progress"
        );
        if recovers {
            let g = starts(&out)[0].0;
            out.clear();
            core.handle(
                s(90),
                CoreEvent::GroupFinished {
                    key: g,
                    outcome: complete(2),
                },
                &mut out,
            );
            assert_eq!(
                core.progress_deadline(),
                Some(s(190)),
                "a sample restarts it"
            );
            core.handle(s(100), CoreEvent::Tick, &mut out);
            assert!(!core.is_done());
            continue;
        }
        out.clear();
        core.handle(s(100), CoreEvent::Tick, &mut out);
        let Some(CoreAction::Done(RunEnd::NoProgress {
            version,
            waited,
            running,
            failed,
            filtered,
        })) = out.last()
        else {
            panic!("{out:?}")
        };
        assert_eq!(
            (*version, *waited, *failed, *filtered),
            (PolicyVersion(0), s(100), 40, 0)
        );
        // The groups admitted last are still running, and counted as such.
        assert_eq!(*running, core.accounting().running);
        assert!(*running > 0);
        let sum = core.close(s(100));
        assert!(sum.accounting.balanced());
        assert_eq!(sum.accounting.failed, 40);
    }
}

/// A training step in flight suspends the progress deadline; its publication restarts it.
#[test]
fn the_progress_deadline_waits_for_a_step_in_flight() {
    let mut c = cfg(1, 1, 0.0, 3);
    c.progress_timeout = s(10);
    let mut core = ControllerCore::<u32>::new(c, None, s(0)).unwrap();
    let mut out = Vec::new();
    core.handle(s(0), CoreEvent::Tick, &mut out);
    let g = starts(&out)[0].0;
    out.clear();
    core.handle(
        s(5),
        CoreEvent::GroupFinished {
            key: g,
            outcome: complete(1),
        },
        &mut out,
    );
    assert!(
        out.iter().any(|a| matches!(a, CoreAction::Train { .. })),
        "{out:?}"
    );
    assert_eq!(core.progress_deadline(), None);
    core.handle(s(50), CoreEvent::TrainFinished, &mut out);
    core.handle(s(51), CoreEvent::SyncFinished { serving: true }, &mut out);
    assert!(!core.is_done());
    assert_eq!(core.progress_deadline(), Some(s(61)));
}
