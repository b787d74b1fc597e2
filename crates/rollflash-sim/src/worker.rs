//! A modelled inference worker with continuous batching: the stand-in for one engine or one
//! server replica behind the proxy.
//!
//! Between two changes of its batch (a sequence finishing, one joining, a cancel, a pause)
//! a worker's steps are all alike except that every context grows by one token per step,
//! so a whole run of steps is a closed form: with batch `B`, summed context `C₀` and `P`
//! prefill tokens at the start, step `k` ends at
//! `t₀ + p·P + k·(a + b·B + c·C₀) + c·B·k(k−1)/2`.
//! The simulation therefore schedules one event per *segment* (until the first sequence in
//! the batch finishes) instead of one per decode step, and cuts a segment short at the next
//! step boundary when something changes. Changes take effect at step boundaries, as in a
//! real engine, whose worker thread handles commands between steps.

use rollflash_core::{PauseMode, RequestId};

use crate::config::{Batching, InferenceCost};

/// One sequence on a worker.
#[derive(Debug, Clone)]
pub(crate) struct Seq {
    pub id: RequestId,
    pub attempt: u32,
    /// Tokens in its KV cache (prompt and everything generated so far).
    pub context: u64,
    /// Tokens generated so far over all attempts.
    pub generated: u64,
    /// Tokens this turn should generate in all.
    pub target: u64,
    /// Prompt tokens still to prefill (on joining; a resumed request re-prefills its
    /// partial output too).
    pub prefill: u64,
}

/// How a sequence left the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    Done,
    Aborted,
}

/// A sequence that left the worker at a boundary.
#[derive(Debug, Clone)]
pub(crate) struct Departure {
    pub id: RequestId,
    pub attempt: u32,
    pub generated: u64,
    pub left: Left,
}

/// A run of identical decode steps.
#[derive(Debug, Clone, Copy)]
struct Segment {
    t0: f64,
    /// Steps until the first sequence finishes.
    planned: u64,
    batch: u64,
    context: u64,
    prefill: u64,
    /// Slow-down of every step (CPU shared with a running trainer; 1 on separate GPUs).
    scale: f64,
}

impl Segment {
    /// When step `k` (1-based) ends.
    fn end_of(&self, k: u64, cost: &InferenceCost) -> f64 {
        let k = k as f64;
        self.t0
            + self.scale
                * (cost.prefill_token_s * self.prefill as f64
                    + k * cost.step_time(self.batch, self.context, 0)
                    + cost.context_token_s * self.batch as f64 * k * (k - 1.0) / 2.0)
    }

    /// Steps finished by time `t` (at most `planned`).
    fn done_by(&self, t: f64, cost: &InferenceCost) -> u64 {
        // Solve the quadratic for a first guess, then correct it against `end_of` so the
        // answer is exact whatever the rounding.
        let a = cost.context_token_s * self.batch as f64 / 2.0;
        let b = cost.step_time(self.batch, self.context, 0) - a;
        let rhs = (t - self.t0) / self.scale - cost.prefill_token_s * self.prefill as f64;
        if rhs <= 0.0 {
            return 0;
        }
        let guess = if a > 0.0 {
            (-b + (b * b + 4.0 * a * rhs).sqrt()) / (2.0 * a)
        } else {
            rhs / b
        };
        let mut k = (guess.max(0.0).floor() as u64).min(self.planned);
        while k > 0 && self.end_of(k, cost) > t {
            k -= 1;
        }
        while k < self.planned && self.end_of(k + 1, cost) <= t {
            k += 1;
        }
        k
    }
}

/// A modelled worker. The simulation owns the clock and the event queue; a worker only
/// says when its next boundary is and what happened there.
#[derive(Debug)]
pub(crate) struct Worker {
    batching: Batching,
    running: Vec<Seq>,
    joining: Vec<Seq>,
    cancels: Vec<RequestId>,
    pause: Option<PauseMode>,
    paused: bool,
    seg: Option<Segment>,
    /// Steps to apply at the next boundary (`planned`, or fewer when cut short).
    steps_at_boundary: u64,
    /// The time of the pending boundary event, if one is scheduled.
    pub boundary_at: Option<f64>,
    /// Invalidates boundary events that were rescheduled.
    pub epoch: u64,
    /// Seconds spent stepping.
    pub busy_s: f64,
    /// Decode tokens produced.
    pub tokens: u64,
    /// Slow-down applied to segments planned from now on.
    pub scale: f64,
}

/// What the simulation must do after a worker changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Wake {
    /// Nothing: the pending boundary (if any) stands.
    None,
    /// Schedule a boundary event at this time with the worker's (new) epoch.
    At(f64),
}

impl Worker {
    pub fn new(batching: Batching) -> Self {
        Worker {
            batching,
            running: Vec::new(),
            joining: Vec::new(),
            cancels: Vec::new(),
            pause: None,
            paused: false,
            seg: None,
            steps_at_boundary: 0,
            boundary_at: None,
            epoch: 0,
            busy_s: 0.0,
            tokens: 0,
            scale: 1.0,
        }
    }

    /// A dispatched sequence; it joins at the next boundary.
    pub fn dispatch(&mut self, now: f64, seq: Seq, cost: &InferenceCost) -> Wake {
        self.joining.push(seq);
        self.interrupt(now, cost)
    }

    /// Cancel a sequence at the next boundary.
    pub fn cancel(&mut self, now: f64, id: RequestId, cost: &InferenceCost) -> Wake {
        self.cancels.push(id);
        self.interrupt(now, cost)
    }

    /// Pause at the next boundary (aborting everything in `Abort` mode).
    pub fn pause(&mut self, now: f64, mode: PauseMode, cost: &InferenceCost) -> Wake {
        self.pause = Some(mode);
        self.interrupt(now, cost)
    }

    /// Whether the worker is stepping.
    pub fn is_busy(&self) -> bool {
        self.seg.is_some()
    }

    /// The slow-down changed: cut the segment at the next step boundary, so the rest is
    /// planned with the new one.
    pub fn rescale(&mut self, now: f64, scale: f64, cost: &InferenceCost) -> Wake {
        self.scale = scale;
        if self.seg.is_some_and(|s| s.scale != scale) {
            self.interrupt(now, cost)
        } else {
            Wake::None
        }
    }

    /// Generate again.
    pub fn resume(&mut self, now: f64, cost: &InferenceCost) -> Wake {
        self.paused = false;
        self.interrupt(now, cost)
    }

    /// When the segment in progress started, if one is.
    pub fn segment_start(&self) -> Option<f64> {
        self.seg.map(|s| s.t0)
    }

    /// Brings the next boundary forward to the end of the step in progress (or to now
    /// when idle), so a change takes effect there.
    fn interrupt(&mut self, now: f64, cost: &InferenceCost) -> Wake {
        let Some(seg) = self.seg else {
            if self.boundary_at.is_some() {
                return Wake::None;
            }
            self.epoch += 1;
            self.boundary_at = Some(now);
            self.steps_at_boundary = 0;
            return Wake::At(now);
        };
        let done = seg.done_by(now, cost);
        let k = if done == 0 || seg.end_of(done, cost) < now {
            (done + 1).min(seg.planned)
        } else {
            done
        };
        let at = seg.end_of(k, cost);
        match self.boundary_at {
            Some(b) if b <= at => Wake::None,
            _ => {
                self.epoch += 1;
                self.boundary_at = Some(at);
                self.steps_at_boundary = k;
                Wake::At(at)
            }
        }
    }

    /// The boundary event fired at `now`: applies the steps, lets finished, cancelled and
    /// (on an abort pause) all sequences leave, and plans the next segment. Returns the
    /// departures, whether a requested pause took effect, and the next wake-up.
    pub fn boundary(
        &mut self,
        now: f64,
        cost: &InferenceCost,
        out: &mut Vec<Departure>,
    ) -> (bool, Wake) {
        self.boundary_at = None;
        if let Some(seg) = self.seg.take() {
            let k = self.steps_at_boundary;
            self.busy_s += seg.end_of(k, cost) - seg.t0;
            for s in &mut self.running {
                s.context += k;
                s.generated += k;
                s.prefill = 0;
            }
            self.tokens += k * seg.batch;
            let mut i = 0;
            while i < self.running.len() {
                if self.running[i].generated >= self.running[i].target {
                    let s = self.running.swap_remove(i);
                    out.push(Departure {
                        id: s.id,
                        attempt: s.attempt,
                        generated: s.generated,
                        left: Left::Done,
                    });
                } else {
                    i += 1;
                }
            }
        }
        self.steps_at_boundary = 0;
        for id in std::mem::take(&mut self.cancels) {
            let found = if let Some(p) = self.running.iter().position(|s| s.id == id) {
                Some(self.running.swap_remove(p))
            } else {
                self.joining
                    .iter()
                    .position(|s| s.id == id)
                    .map(|p| self.joining.remove(p))
            };
            if let Some(s) = found {
                out.push(Departure {
                    id: s.id,
                    attempt: s.attempt,
                    generated: s.generated,
                    left: Left::Aborted,
                });
            }
        }
        let mut paused_now = false;
        if let Some(mode) = self.pause.take() {
            if mode == PauseMode::Abort {
                let mut all: Vec<Seq> = self.running.drain(..).collect();
                all.append(&mut self.joining);
                // Ids in order, so the re-queue order does not depend on batch order.
                all.sort_by_key(|s| s.id);
                for s in all {
                    out.push(Departure {
                        id: s.id,
                        attempt: s.attempt,
                        generated: s.generated,
                        left: Left::Aborted,
                    });
                }
            }
            self.paused = true;
            paused_now = true;
        }
        (paused_now, self.plan(now, cost))
    }

    fn plan(&mut self, now: f64, cost: &InferenceCost) -> Wake {
        if self.paused {
            return Wake::None;
        }
        let admit = match self.batching {
            Batching::Continuous => true,
            Batching::Static => self.running.is_empty(),
        };
        if admit {
            // Keep dispatch order: earlier requests first in the batch.
            self.running.append(&mut self.joining);
        }
        if self.running.is_empty() {
            return Wake::None;
        }
        let planned = self
            .running
            .iter()
            .map(|s| s.target.saturating_sub(s.generated).max(1))
            .min()
            .unwrap_or(1);
        let seg = Segment {
            t0: now,
            planned,
            batch: self.running.len() as u64,
            context: self.running.iter().map(|s| s.context).sum(),
            prefill: self.running.iter().map(|s| s.prefill).sum(),
            scale: self.scale,
        };
        let at = seg.end_of(planned, cost);
        self.seg = Some(seg);
        self.steps_at_boundary = planned;
        self.epoch += 1;
        self.boundary_at = Some(at);
        Wake::At(at)
    }
}
