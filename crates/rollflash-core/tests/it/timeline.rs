//! `BusyCoalescer`: per-request running counts become a few per-backend busy intervals.

use rollflash_core::timeline::{BusyCoalescer, EventKind, TimelineEvent};
use rollflash_core::PolicyVersion;

fn coalescer() -> BusyCoalescer {
    BusyCoalescer::new(vec!["a".into(), "b".into()], 50, 1_000)
}

#[test]
fn short_gaps_merge_and_long_gaps_split() {
    let mut c = coalescer();
    let mut out = Vec::new();
    let v = PolicyVersion(3);
    c.observe(0, 0, 1, v, &mut out);
    c.completed(0, 10);
    c.observe(100, 0, 0, v, &mut out);
    // Back within the merge gap: the same interval.
    c.observe(130, 0, 2, v, &mut out);
    c.completed(0, 5);
    c.observe(200, 0, 0, v, &mut out);
    assert!(out.is_empty());
    // Back after a longer idle stretch: the first interval ends where it went idle.
    c.observe(400, 0, 1, v, &mut out);
    assert_eq!(
        out,
        vec![TimelineEvent {
            lane: "a".into(),
            kind: EventKind::Generate,
            start_ms: 0,
            end_ms: 200,
            version: 3,
            count: 2,
            tokens: 15,
        }]
    );
}

#[test]
fn long_busy_stretches_are_cut_at_the_span_and_at_a_pause() {
    let mut c = coalescer();
    let mut out = Vec::new();
    let v = PolicyVersion(0);
    // 3.5 s of continuous work on backend b, observed every 10 ms: three cut intervals.
    for t in (0..3_500).step_by(10) {
        c.observe(t, 1, 4, v, &mut out);
    }
    assert_eq!(out.len(), 3);
    assert!(out
        .iter()
        .all(|e| e.lane == "b" && e.end_ms - e.start_ms == 1_000));
    c.cut(3_500, &mut out);
    assert_eq!(out.len(), 4);
    assert_eq!((out[3].start_ms, out[3].end_ms), (3_000, 3_500));
    // Nothing open any more: a second cut reports nothing.
    c.cut(3_600, &mut out);
    assert_eq!(out.len(), 4);
}

/// A million requests over an hour of continuous generation write about one event per
/// `max_span_ms`, not one per request.
#[test]
fn the_event_count_is_bounded_by_time_not_requests() {
    let mut c = coalescer();
    let mut out = Vec::new();
    for i in 0..1_000_000u64 {
        let t = i * 3_600_000 / 1_000_000;
        c.observe(
            t,
            0,
            1 + (i % 7) as usize,
            PolicyVersion(i / 100_000),
            &mut out,
        );
        c.completed(0, 3);
    }
    c.cut(3_600_000, &mut out);
    assert!(out.len() <= 3_601, "{} events", out.len());
    assert_eq!(out.iter().map(|e| e.count).sum::<u64>(), 1_000_000);
}
