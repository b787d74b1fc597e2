//! Timeline events: what each backend and the trainer did when (generate, train, weight
//! sync, pause), as plain data, and the [`TimelineSink`] seam the drivers (the proxy task,
//! the controller's driver) report them through. Nothing here reads a clock or writes a
//! file: times come in as wall-clock milliseconds from the driver, and the sink decides
//! where events go (`timeline.jsonl`, a live page).
//!
//! Generation is reported per backend as *busy intervals*, not per request:
//! [`BusyCoalescer`] turns "backend b has n requests running at t" observations into
//! intervals during which the backend had at least one request, merging gaps shorter than
//! `merge_gap_ms` and cutting an interval every `max_span_ms` (so a live view sees it) and
//! at every pause. A run therefore writes at most about one generate event per backend per
//! `max_span_ms` of generation plus one per idle gap or pause — independent of how many
//! requests it serves.

use serde::{Deserialize, Serialize};

use crate::PolicyVersion;

/// What a timeline bar shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A backend had at least one generation request running.
    Generate,
    /// The trainer ran one training step.
    Train,
    /// A backend loaded new weights.
    Sync,
    /// Generation was paused for a weight sync.
    Pause,
}

/// One bar of the timeline: on `lane` (a backend's name, or `trainer`), `kind` from
/// `start_ms` to `end_ms` (Unix epoch milliseconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineEvent {
    pub lane: String,
    pub kind: EventKind,
    pub start_ms: u64,
    pub end_ms: u64,
    /// Generate: the weights version the backend held; train: the version trained from;
    /// sync: the version loaded; pause: the version being published.
    pub version: u64,
    /// Generate: requests that finished on the backend in the interval; train: samples in
    /// the batch; sync: 1 when the backend loaded the weights, 0 when it failed.
    pub count: u64,
    /// Generate: tokens generated in the interval; train: model tokens trained on.
    #[serde(default)]
    pub tokens: u64,
}

/// Where timeline events go. Called from the drivers' tasks: keep it short (append to a
/// buffered file, push to a ring).
pub trait TimelineSink: Send + Sync {
    /// One finished bar.
    fn record(&self, event: TimelineEvent);
}

/// The lane name of the trainer's events.
pub const TRAINER_LANE: &str = "trainer";

/// The default gap below which two busy intervals of a backend are one.
pub const DEFAULT_MERGE_GAP_MS: u64 = 50;

/// The default longest busy interval before it is cut (and reported).
pub const DEFAULT_MAX_SPAN_MS: u64 = 5_000;

/// One backend's open interval.
#[derive(Debug, Clone, Default)]
struct Busy {
    /// Start of the open interval, if any.
    start: Option<u64>,
    /// When the running count last dropped to zero (the interval may still continue if
    /// work comes back within the merge gap).
    idle_since: Option<u64>,
    version: u64,
    count: u64,
    tokens: u64,
}

/// Per-backend busy intervals from running-count observations (see the module docs).
#[derive(Debug, Clone)]
pub struct BusyCoalescer {
    lanes: Vec<String>,
    busy: Vec<Busy>,
    merge_gap_ms: u64,
    max_span_ms: u64,
}

impl BusyCoalescer {
    /// A coalescer over backends named `lanes` (in backend order).
    pub fn new(lanes: Vec<String>, merge_gap_ms: u64, max_span_ms: u64) -> Self {
        BusyCoalescer {
            busy: vec![Busy::default(); lanes.len()],
            lanes,
            merge_gap_ms,
            max_span_ms: max_span_ms.max(1),
        }
    }

    /// Backend `b` has `running` requests at `now_ms` and holds weights `version`. Pushes
    /// the intervals this closes.
    pub fn observe(
        &mut self,
        now_ms: u64,
        b: usize,
        running: usize,
        version: PolicyVersion,
        out: &mut Vec<TimelineEvent>,
    ) {
        let (gap, span) = (self.merge_gap_ms, self.max_span_ms);
        let Some(s) = self.busy.get_mut(b) else {
            return;
        };
        // An idle stretch longer than the merge gap closes the interval where it went idle.
        if let (Some(_), Some(idle)) = (s.start, s.idle_since) {
            if now_ms.saturating_sub(idle) > gap {
                Self::close(&self.lanes[b], s, idle, out);
            }
        }
        if running > 0 {
            s.idle_since = None;
            match s.start {
                Some(start) if now_ms.saturating_sub(start) >= span => {
                    Self::close(&self.lanes[b], s, now_ms, out);
                    Self::open(s, now_ms, version);
                }
                Some(_) => {}
                None => Self::open(s, now_ms, version),
            }
        } else if s.start.is_some() && s.idle_since.is_none() {
            s.idle_since = Some(now_ms);
        }
    }

    /// A request finished on backend `b` having generated `tokens` new tokens.
    pub fn completed(&mut self, b: usize, tokens: u64) {
        if let Some(s) = self.busy.get_mut(b) {
            s.count += 1;
            s.tokens += tokens;
        }
    }

    /// Closes every open interval at `now_ms` (a pause, the end of the run); backends still
    /// running start a new interval at `now_ms` on their next observation.
    pub fn cut(&mut self, now_ms: u64, out: &mut Vec<TimelineEvent>) {
        for (lane, s) in self.lanes.iter().zip(self.busy.iter_mut()) {
            if s.start.is_some() {
                let end = s.idle_since.unwrap_or(now_ms);
                Self::close(lane, s, end, out);
            }
        }
    }

    fn open(s: &mut Busy, now_ms: u64, version: PolicyVersion) {
        *s = Busy {
            start: Some(now_ms),
            idle_since: None,
            version: version.0,
            count: 0,
            tokens: 0,
        };
    }

    fn close(lane: &str, s: &mut Busy, end_ms: u64, out: &mut Vec<TimelineEvent>) {
        if let Some(start) = s.start.take() {
            out.push(TimelineEvent {
                lane: lane.to_string(),
                kind: EventKind::Generate,
                start_ms: start,
                end_ms: end_ms.max(start),
                version: s.version,
                count: s.count,
                tokens: s.tokens,
            });
        }
        s.idle_since = None;
        s.count = 0;
        s.tokens = 0;
    }
}
