//! The stop request a run watches for (Ctrl-C, SIGTERM, or a test's gate), shared by every
//! phase of `rollflash train`: warm-up, evaluation and the controller.

use std::sync::Arc;

use tokio::sync::watch;

/// A one-way flag: once [`StopFlag::stop`] is called, every clone sees it, now and later.
/// Cheap to clone; clones share the flag.
#[derive(Debug, Clone)]
pub struct StopFlag {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for StopFlag {
    fn default() -> Self {
        StopFlag {
            tx: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl StopFlag {
    /// A flag that is not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks everything watching this flag to stop. Idempotent.
    pub fn stop(&self) {
        self.tx.send_replace(true);
    }

    /// Whether a stop was asked for.
    pub fn is_stopped(&self) -> bool {
        *self.tx.borrow()
    }

    /// Completes once a stop is asked for (at once if it already was).
    pub async fn stopped(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail while we are borrowed.
        let _ = rx.wait_for(|s| *s).await;
    }
}
