//! [`Timeline`]: a [`TimelineSink`] with the clock its drivers stamp events with. The proxy
//! task and the controller's driver share one, so their bars line up: wall-clock
//! milliseconds taken once at creation, advanced by tokio's monotonic clock (which a test
//! can pause).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rollflash_core::timeline::{TimelineEvent, TimelineSink};
use tokio::time::Instant;

/// Where the drivers report timeline events, and their common clock.
#[derive(Clone)]
pub struct Timeline {
    sink: Arc<dyn TimelineSink>,
    /// Unix epoch milliseconds at `t0`.
    wall0_ms: u64,
    t0: Instant,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline")
            .field("wall0_ms", &self.wall0_ms)
            .finish()
    }
}

impl Timeline {
    /// Events to `sink`, stamped from now on.
    pub fn new(sink: Arc<dyn TimelineSink>) -> Self {
        let wall0_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Timeline {
            sink,
            wall0_ms,
            t0: Instant::now(),
        }
    }

    /// The time `at` in Unix epoch milliseconds.
    pub fn ms_at(&self, at: Instant) -> u64 {
        self.wall0_ms + at.saturating_duration_since(self.t0).as_millis() as u64
    }

    /// Now, in Unix epoch milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// Reports one event.
    pub fn record(&self, event: TimelineEvent) {
        self.sink.record(event);
    }
}
