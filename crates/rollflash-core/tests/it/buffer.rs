//! The sample buffer: admission under α, consumption and staleness, fractional α,
//! filtering, incomplete groups, the synchronous barrier, and exact accounting under a
//! seeded random storm.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollflash_core::buffer::{BufferConfig, GroupFilter, GroupKey, GroupOutcome, SampleBuffer};
use rollflash_core::PolicyVersion;

fn cfg(groups: usize, size: usize, alpha: f64) -> BufferConfig {
    BufferConfig {
        groups_per_batch: groups,
        group_size: size,
        alpha,
        ..Default::default()
    }
}

/// A complete group whose rewards are 0, 1, 0, 1, ...
fn complete(size: usize) -> GroupOutcome<u32> {
    GroupOutcome {
        samples: (0..size).map(|i| (i as u32, (i % 2) as f64)).collect(),
        aborted: 0,
        failed: 0,
    }
}

fn start_all(b: &mut SampleBuffer<u32>, size: u64) -> Vec<(GroupKey, PolicyVersion)> {
    let mut v = Vec::new();
    while let Some(s) = b.try_start(size) {
        v.push(s);
    }
    v
}

#[test]
fn alpha_zero_is_synchronous() {
    let mut b = SampleBuffer::new(cfg(2, 4, 0.0));
    let started = start_all(&mut b, 4);
    assert_eq!(started.len(), 2, "one batch worth of groups per version");
    for (k, _) in &started {
        b.finish(*k, complete(4));
    }
    let batch = b.take_batch().unwrap();
    assert_eq!(batch.len(), 8);
    assert_eq!(batch.mean_staleness(), 0.0);
    assert!(
        b.try_start(4).is_none(),
        "nothing more until the step publishes"
    );
    b.publish(PolicyVersion(1));
    assert_eq!(start_all(&mut b, 4).len(), 2);
    assert!(b.accounting().balanced());
}

#[test]
fn alpha_one_runs_a_batch_ahead_and_trains_oldest_first() {
    let mut b = SampleBuffer::new(cfg(2, 4, 1.0));
    let s0 = start_all(&mut b, 4);
    assert_eq!(s0.len(), 4, "(v + 1 + α)·B = 2 batches at version 0");
    // Finishing order differs from start order; the batch still takes the oldest starts.
    for (k, _) in s0.iter().rev() {
        b.finish(*k, complete(4));
    }
    let batch = b.take_batch().unwrap();
    let keys: Vec<GroupKey> = batch.groups.iter().map(|g| g.key).collect();
    assert_eq!(keys, vec![s0[0].0, s0[1].0]);
    b.publish(PolicyVersion(1));
    let s1 = start_all(&mut b, 4);
    assert_eq!(s1.len(), 2);
    assert!(s1.iter().all(|(_, v)| *v == PolicyVersion(1)));
    // Step 1 trains the two version-0 groups (staleness 1, allowed).
    let batch = b.take_batch().unwrap();
    assert_eq!(batch.mean_staleness(), 1.0);
    assert_eq!(b.staleness_histogram().get(&1), Some(&8));
    assert!(b.accounting().balanced());
}

#[test]
fn samples_older_than_alpha_are_dropped_and_counted() {
    let mut c = cfg(1, 2, 1.0);
    c.extra_groups = 1;
    let mut b = SampleBuffer::new(c);
    let s = start_all(&mut b, 2);
    assert_eq!(s.len(), 3);
    // Group 0 and 1 finish and are trained over two steps; group 2 (version 0) is slow.
    b.finish(s[0].0, complete(2));
    b.take_batch().unwrap();
    b.publish(PolicyVersion(1));
    b.finish(s[1].0, complete(2));
    b.take_batch().unwrap();
    b.publish(PolicyVersion(2));
    // Now at version 2 a version-0 group is too old for α = 1.
    b.finish(s[2].0, complete(2));
    assert!(b.take_batch().is_none());
    let a = b.accounting();
    assert_eq!(a.dropped_stale, 2);
    assert_eq!(a.trained, 4);
    assert!(a.balanced());
    assert!(b.staleness_histogram().keys().all(|&s| s <= 1));
}

#[test]
fn fractional_alpha_caps_the_oldest_versions_share() {
    let mut b = SampleBuffer::new(cfg(4, 1, 0.5));
    let s0 = start_all(&mut b, 1);
    assert_eq!(s0.len(), 6, "⌊(0 + 1 + 0.5)·4⌋");
    for (k, _) in &s0 {
        b.finish(*k, complete(1));
    }
    b.take_batch().unwrap();
    b.publish(PolicyVersion(1));
    // Two version-0 groups are left; a version-1 batch may take at most 2 (50%) of them.
    let s1 = start_all(&mut b, 1);
    assert_eq!(s1.len(), 4);
    for (k, _) in &s1 {
        b.finish(*k, complete(1));
    }
    let batch = b.take_batch().unwrap();
    let old = batch
        .groups
        .iter()
        .filter(|g| g.start == PolicyVersion(0))
        .count();
    assert_eq!(old, 2);
    assert_eq!(batch.groups.len(), 4);
}

#[test]
fn zero_variance_groups_are_filtered_and_replaced() {
    let mut c = cfg(2, 2, 0.0);
    c.filter = GroupFilter::ZeroVariance;
    let mut b = SampleBuffer::new(c);
    let s = start_all(&mut b, 2);
    assert_eq!(s.len(), 2);
    b.finish(
        s[0].0,
        GroupOutcome {
            samples: vec![(0, 1.0), (1, 1.0)],
            aborted: 0,
            failed: 0,
        },
    );
    // The filtered group freed its place: another may start.
    let more = start_all(&mut b, 2);
    assert_eq!(more.len(), 1);
    b.finish(s[1].0, complete(2));
    b.finish(more[0].0, complete(2));
    assert_eq!(b.take_batch().unwrap().groups.len(), 2);
    let a = b.accounting();
    assert_eq!(a.filtered, 2);
    assert!(a.balanced());
}

#[test]
fn incomplete_groups_fail_and_redundancy_surplus_is_aborted() {
    let mut b = SampleBuffer::new(cfg(1, 2, 0.0));
    let (k, _) = b.try_start(4).unwrap(); // 2 + 2 redundant
    b.finish(
        k,
        GroupOutcome {
            samples: vec![(0, 0.0), (1, 1.0)],
            aborted: 1,
            failed: 1,
        },
    );
    let a = b.accounting();
    assert_eq!((a.aborted, a.failed, a.buffered), (1, 1, 2));
    b.take_batch().unwrap();
    b.publish(PolicyVersion(1));
    let (k, _) = b.try_start(3).unwrap();
    b.finish(
        k,
        GroupOutcome {
            samples: vec![(0, 0.0)],
            aborted: 0,
            failed: 2,
        },
    );
    let a = b.accounting();
    assert_eq!(a.failed, 1 + 3, "a group short of group_size fails whole");
    assert!(a.balanced());
    // Its place is free again.
    assert!(b.try_start(2).is_some());
}

#[test]
fn barrier_admits_nothing_while_training() {
    let mut c = cfg(1, 1, 0.0);
    c.barrier = true;
    c.extra_groups = 2;
    let mut b = SampleBuffer::new(c);
    let s = start_all(&mut b, 1);
    assert_eq!(s.len(), 3);
    b.finish(s[0].0, complete(1));
    b.take_batch().unwrap();
    b.finish(s[1].0, complete(1));
    // Places are free (extra groups), but none is given out while the step runs.
    assert_eq!(b.admissible(), 0);
    b.publish(PolicyVersion(1));
    assert!(b.admissible() > 0);
}

/// Random starts, finishes (complete, short, zero-variance), steps and publishes for many
/// configurations: the counts always add up and no trained sample is staler than ⌈α⌉.
#[test]
fn random_storm_keeps_accounting_exact_and_staleness_bounded() {
    for seed in 0..200u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let alpha = [0.0, 0.5, 1.0, 2.0, 4.0][rng.random_range(0..5)];
        let c = BufferConfig {
            groups_per_batch: 1 + rng.random_range(0..4),
            group_size: 1 + rng.random_range(0..3),
            alpha,
            extra_groups: rng.random_range(0..3),
            filter: if rng.random_bool(0.5) {
                GroupFilter::ZeroVariance
            } else {
                GroupFilter::None
            },
            barrier: rng.random_bool(0.3),
        };
        let size = c.group_size;
        let mut b: SampleBuffer<u32> = SampleBuffer::new(c.clone());
        let mut running: Vec<(GroupKey, u64)> = Vec::new();
        let mut training = false;
        for _ in 0..500 {
            match rng.random_range(0..10) {
                0..=3 => {
                    let n = (size + rng.random_range(0..2)) as u64;
                    if let Some((k, _)) = b.try_start(n) {
                        running.push((k, n));
                    }
                }
                4..=6 if !running.is_empty() => {
                    let (k, n) = running.swap_remove(rng.random_range(0..running.len()));
                    let kept = if rng.random_bool(0.1) { size - 1 } else { size };
                    let same = rng.random_bool(0.3);
                    let samples = (0..kept)
                        .map(|i| (i as u32, if same { 1.0 } else { (i % 2) as f64 }))
                        .collect::<Vec<_>>();
                    let failed = rng.random_range(0..=(n - kept as u64));
                    b.finish(
                        k,
                        GroupOutcome {
                            samples,
                            aborted: 0,
                            failed,
                        },
                    );
                }
                7 | 8 if !training => {
                    if let Some(batch) = b.take_batch() {
                        assert_eq!(batch.groups.len(), c.groups_per_batch);
                        for g in &batch.groups {
                            assert!(batch.version.0 - g.start.0 <= c.max_staleness());
                            assert_eq!(g.samples.len(), size);
                        }
                        training = true;
                    }
                }
                9 if training => {
                    b.publish(PolicyVersion(b.version().0 + 1));
                    training = false;
                }
                _ => {}
            }
            let a = b.accounting();
            assert!(a.balanced(), "seed {seed}: {a:?}");
            assert_eq!(a.running, running.iter().map(|r| r.1).sum::<u64>());
        }
        b.shutdown();
        for (k, _) in running.drain(..) {
            b.finish(
                k,
                GroupOutcome {
                    samples: vec![],
                    aborted: 0,
                    failed: 0,
                },
            );
        }
        let a = b.accounting();
        assert!(a.balanced(), "seed {seed}: {a:?}");
        assert_eq!((a.running, a.buffered), (0, 0));
        assert!(b
            .staleness_histogram()
            .keys()
            .all(|&s| s <= c.max_staleness()));
    }
}
