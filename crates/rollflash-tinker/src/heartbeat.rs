//! `Heartbeat`: an owned task that keeps a Tinker session alive, with a stop handle.
//!
//! Servers drop a session that has not sent a heartbeat for a while (SkyRL:
//! `--session-timeout-sec`, 300 s by default); the SDK beats every 10 s. A failed beat is
//! logged and counted, not fatal: the next one may succeed, and a server that is really gone
//! shows up in the training calls themselves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::client::TinkerClient;

/// What the task did, returned by [`Heartbeat::stop`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatReport {
    pub sent: u64,
    pub failed: u64,
    /// The text of the last failure, if any.
    pub last_error: Option<String>,
}

/// The running heartbeat task. Stop it with [`Heartbeat::stop`]; dropping it aborts the task.
#[derive(Debug)]
pub struct Heartbeat {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<HeartbeatReport>>,
    /// Beats failed so far, readable while the task runs: a failure means the server was
    /// unreachable for a while, perhaps restarted (see [`Heartbeat::failures`]).
    failed: Arc<AtomicU64>,
}

impl Heartbeat {
    /// Beats for `session_id` every `interval`, the first after one interval.
    pub fn spawn(client: TinkerClient, session_id: String, interval: Duration) -> Heartbeat {
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let failed = Arc::new(AtomicU64::new(0));
        let failures = Arc::clone(&failed);
        let task = tokio::spawn(async move {
            let mut report = HeartbeatReport::default();
            let mut ticker =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stop_rx => break,
                    _ = ticker.tick() => {
                        match client.heartbeat(&session_id).await {
                            Ok(()) => report.sent += 1,
                            Err(e) => {
                                report.failed += 1;
                                failures.fetch_add(1, Ordering::SeqCst);
                                tracing::warn!(session_id, error = %e, "Tinker session heartbeat failed");
                                report.last_error = Some(e.to_string());
                            }
                        }
                    }
                }
            }
            report
        });
        Heartbeat {
            stop: Some(stop_tx),
            task: Some(task),
            failed,
        }
    }

    /// How many beats have failed so far (the report's `failed`, while the task runs).
    pub fn failures(&self) -> u64 {
        self.failed.load(Ordering::SeqCst)
    }

    /// Stops the task and returns what it did.
    pub async fn stop(mut self) -> HeartbeatReport {
        if let Some(tx) = self.stop.take() {
            // The task may have ended already; then there is no one to tell.
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(task) => task.await.unwrap_or_default(),
            None => HeartbeatReport::default(),
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
