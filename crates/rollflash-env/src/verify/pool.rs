//! A bounded pool that scores responses as soon as they finish, off the async runtime.
//!
//! Rewards are computed per sample, while other samples of the same group still generate, so
//! a slow group member never holds up the scoring of the others. Verifiers are synchronous
//! CPU work, so each call runs on tokio's blocking pool; a semaphore bounds how many run at
//! once (verification must not starve generation of cores). A per-call timeout bounds what a
//! pathological verifier costs: that one sample, scored zero with the reason, never the run.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use super::{Reward, Verifier};

/// Settings of a [`RewardPool`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardPoolConfig {
    /// Verifier calls running at once; further calls wait their turn. Bounds the cores that
    /// verification takes from generation.
    pub max_concurrent: usize,
    /// Longest a single verifier call may run, in milliseconds, before its sample is scored
    /// zero. Waiting for a free slot does not count: under load, queueing is normal
    /// back-pressure and must not turn into zero rewards.
    pub timeout_ms: u64,
}

impl Default for RewardPoolConfig {
    fn default() -> Self {
        RewardPoolConfig {
            max_concurrent: 4,
            timeout_ms: 10_000,
        }
    }
}

impl RewardPoolConfig {
    /// Checks the values; the error names the bad field.
    pub fn validate(&self) -> Result<(), RewardPoolError> {
        if self.max_concurrent == 0 {
            return Err(RewardPoolError::Config {
                field: "max_concurrent",
                reason: "must be at least 1".into(),
            });
        }
        if self.max_concurrent > Semaphore::MAX_PERMITS {
            return Err(RewardPoolError::Config {
                field: "max_concurrent",
                reason: format!("must be at most {}", Semaphore::MAX_PERMITS),
            });
        }
        if self.timeout_ms == 0 {
            return Err(RewardPoolError::Config {
                field: "timeout_ms",
                reason: "must be at least 1".into(),
            });
        }
        Ok(())
    }
}

/// Why a verifier call produced no reward.
#[derive(Debug, thiserror::Error)]
pub enum RewardPoolError {
    /// The verifier ran longer than the per-call timeout.
    #[error("verifier timed out after {0:?}")]
    Timeout(Duration),
    /// The verifier panicked.
    #[error("verifier panicked: {0}")]
    Panicked(String),
    /// The blocking task was cancelled (the runtime is shutting down).
    #[error("verifier task cancelled")]
    Cancelled,
    /// A configuration value is invalid.
    #[error("invalid reward pool config `{field}`: {reason}")]
    Config { field: &'static str, reason: String },
}

/// Counters of a [`RewardPool`], for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RewardPoolStats {
    /// Calls whose verifier returned a reward.
    pub scored: u64,
    /// Calls that hit the timeout.
    pub timed_out: u64,
    /// Calls whose verifier panicked.
    pub panicked: u64,
    /// Verifier calls executing now, including timed-out ones that have not returned yet.
    pub running: usize,
}

#[derive(Debug, Default)]
struct Counters {
    scored: AtomicU64,
    timed_out: AtomicU64,
    panicked: AtomicU64,
    running: AtomicUsize,
}

/// Decrements `running` when a verifier call ends, however it ends.
struct RunningGuard(Arc<Counters>);

impl RunningGuard {
    fn new(c: Arc<Counters>) -> RunningGuard {
        c.running.fetch_add(1, Ordering::SeqCst);
        RunningGuard(c)
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Scores responses on a bounded set of blocking threads, with a per-call timeout. Cheap to
/// clone; clones share the slots and counters, so every environment manager of a run can
/// share one pool.
///
/// A timed-out call keeps its slot until the verifier actually returns (a thread cannot be
/// killed), so the bound on concurrent verifier work holds even for runaway verifiers; the
/// built-in verifiers bound their work by construction and never get there.
#[derive(Debug, Clone)]
pub struct RewardPool {
    /// One permit per concurrent verifier call.
    permits: Arc<Semaphore>,
    /// Per-call limit on running time.
    timeout: Duration,
    /// Shared counters.
    counters: Arc<Counters>,
}

impl RewardPool {
    /// A pool with the given settings.
    pub fn new(cfg: &RewardPoolConfig) -> Result<RewardPool, RewardPoolError> {
        cfg.validate()?;
        Ok(RewardPool {
            permits: Arc::new(Semaphore::new(cfg.max_concurrent)),
            timeout: Duration::from_millis(cfg.timeout_ms),
            counters: Arc::default(),
        })
    }

    /// Scores one response; waits for a free slot, then runs the verifier on a blocking
    /// thread for at most the timeout.
    pub async fn try_score(
        &self,
        verifier: Arc<dyn Verifier>,
        response: String,
        reference: String,
    ) -> Result<Reward, RewardPoolError> {
        // The semaphore is never closed, so acquiring only fails if that invariant breaks.
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| RewardPoolError::Cancelled)?;
        let running = RunningGuard::new(Arc::clone(&self.counters));
        let handle = tokio::task::spawn_blocking(move || {
            // Both live until the verifier returns, even if the caller stopped waiting.
            let _permit = permit;
            let _running = running;
            verifier.score(&response, &reference)
        });
        match tokio::time::timeout(self.timeout, handle).await {
            Ok(Ok(reward)) => {
                self.counters.scored.fetch_add(1, Ordering::Relaxed);
                Ok(reward)
            }
            Ok(Err(e)) if e.is_panic() => {
                self.counters.panicked.fetch_add(1, Ordering::Relaxed);
                let payload = e.into_panic();
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                Err(RewardPoolError::Panicked(msg))
            }
            Ok(Err(_)) => Err(RewardPoolError::Cancelled),
            Err(_) => {
                self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(timeout = ?self.timeout, "verifier timed out; sample scored zero");
                Err(RewardPoolError::Timeout(self.timeout))
            }
        }
    }

    /// Like [`RewardPool::try_score`], but a failed call is a zero reward whose detail says
    /// why: a broken verifier costs its sample, not the run.
    pub async fn score(
        &self,
        verifier: Arc<dyn Verifier>,
        response: String,
        reference: String,
    ) -> Reward {
        match self.try_score(verifier, response, reference).await {
            Ok(r) => r,
            Err(e) => Reward::zero(e.to_string()),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> RewardPoolStats {
        RewardPoolStats {
            scored: self.counters.scored.load(Ordering::Relaxed),
            timed_out: self.counters.timed_out.load(Ordering::Relaxed),
            panicked: self.counters.panicked.load(Ordering::Relaxed),
            running: self.counters.running.load(Ordering::SeqCst),
        }
    }
}
