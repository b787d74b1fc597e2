//! The `Learner` conformance suite: what every learner owes the controller, checked the same
//! way for the embedded [`crate::PolicyLearner`] and for any remote trainer (a Tinker server),
//! as `check_backend` does for backends and the `Env` suite for environments.
//!
//! What it checks, on a well-formed batch the caller supplies:
//! - **version**: a step on a batch of version `v` returns the weights of `v + 1` (the
//!   version the controller's core decides; the driver stops a run whose learner says
//!   otherwise), and the next step continues from there;
//! - **statistics**: the loss and every metric are finite, metric names are unique, and the
//!   per-backend mismatch names only backends that generated tokens of the batch;
//! - **errors**: a batch whose per-token vectors disagree is refused with an error (not a
//!   panic), and the learner trains normally afterwards.

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use rollflash_core::buffer::Batch;
use rollflash_core::{PolicyVersion, Trajectory};

use crate::controller::{Learner, StepStats};

/// A learner broke the contract; the message says which part.
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    /// The step failed where it should have trained.
    #[error("step from {from}")]
    Step {
        from: PolicyVersion,
        #[source]
        source: crate::LearnerError,
    },
    /// It panicked instead of returning.
    #[error("step from {from} panicked ({what})")]
    Panicked { from: PolicyVersion, what: String },
    /// It returned weights of another version than `from + 1`.
    #[error("step from {from} returned weights of {got}, expected {expected}")]
    Version {
        from: PolicyVersion,
        expected: PolicyVersion,
        got: PolicyVersion,
    },
    /// A statistic is NaN or infinite, named twice, or names a backend the batch never used.
    #[error("step from {from}: {what}")]
    Stats { from: PolicyVersion, what: String },
    /// It trained on a batch whose tokens, mask and log-probs disagree.
    #[error("step from {from} accepted a batch whose per-token vectors disagree")]
    AcceptedMalformed { from: PolicyVersion },
    /// The suite needs a batch with at least one sample that has tokens.
    #[error("the suite's batch has no sample with tokens")]
    EmptyBatch,
}

/// What the suite saw, for the caller to print or compare.
#[derive(Debug, Clone)]
pub struct ConformanceReport {
    /// The stats of each well-formed step, in order.
    pub steps: Vec<StepStats>,
}

/// Runs the suite on `learner` with `batch` (well formed, at any version): two steps, a
/// malformed batch, then a third step. The learner ends three versions past `batch.version`.
pub fn check_learner<L: Learner>(
    learner: &mut L,
    batch: &Batch<Trajectory>,
) -> Result<ConformanceReport, ConformanceError> {
    if !batch
        .groups
        .iter()
        .flat_map(|g| &g.samples)
        .any(|(t, _)| !t.tokens.is_empty())
    {
        return Err(ConformanceError::EmptyBatch);
    }
    let mut steps = Vec::new();
    let mut at = batch.version;
    for _ in 0..2 {
        steps.push(good_step(learner, &at_version(batch, at))?);
        at = at.next();
    }
    let bad = malformed(&at_version(batch, at));
    match catch_unwind(AssertUnwindSafe(|| learner.train(&bad))) {
        Ok(Err(_)) => {}
        Ok(Ok(_)) => return Err(ConformanceError::AcceptedMalformed { from: at }),
        Err(p) => {
            return Err(ConformanceError::Panicked {
                from: at,
                what: panic_text(p.as_ref()),
            })
        }
    }
    // A refused batch changes nothing: the same version trains next.
    steps.push(good_step(learner, &at_version(batch, at))?);
    Ok(ConformanceReport { steps })
}

fn good_step<L: Learner>(
    learner: &mut L,
    batch: &Batch<Trajectory>,
) -> Result<StepStats, ConformanceError> {
    let from = batch.version;
    let (update, stats) = match catch_unwind(AssertUnwindSafe(|| learner.train(batch))) {
        Ok(r) => r.map_err(|source| ConformanceError::Step { from, source })?,
        Err(p) => {
            return Err(ConformanceError::Panicked {
                from,
                what: panic_text(p.as_ref()),
            })
        }
    };
    let expected = from.next();
    if update.version() != expected {
        return Err(ConformanceError::Version {
            from,
            expected,
            got: update.version(),
        });
    }
    check_stats(from, batch, &stats)?;
    Ok(stats)
}

fn check_stats(
    from: PolicyVersion,
    batch: &Batch<Trajectory>,
    stats: &StepStats,
) -> Result<(), ConformanceError> {
    let bad = |what: String| ConformanceError::Stats { from, what };
    if !stats.loss.is_finite() {
        return Err(bad(format!("loss is {}", stats.loss)));
    }
    let mut names = HashSet::new();
    for (name, v) in &stats.metrics {
        if !v.is_finite() {
            return Err(bad(format!("metric {name} is {v}")));
        }
        if !names.insert(name.as_str()) {
            return Err(bad(format!("metric {name} is reported twice")));
        }
    }
    let served: HashSet<&str> = batch
        .groups
        .iter()
        .flat_map(|g| &g.samples)
        .flat_map(|(t, _)| &t.served_by)
        .map(|r| r.backend.as_str())
        .collect();
    for (name, v) in &stats.behav_kl_by_backend {
        if !served.contains(name.as_str()) {
            return Err(bad(format!(
                "behav_kl_by_backend names {name}, which generated none of the batch"
            )));
        }
        if !v.is_finite() {
            return Err(bad(format!("behav_kl of {name} is {v}")));
        }
    }
    Ok(())
}

fn at_version(batch: &Batch<Trajectory>, v: PolicyVersion) -> Batch<Trajectory> {
    let mut b = batch.clone();
    b.version = v;
    b
}

/// The batch with its first non-empty sample's loss mask one entry short.
fn malformed(batch: &Batch<Trajectory>) -> Batch<Trajectory> {
    let mut b = batch.clone();
    if let Some((t, _)) = b
        .groups
        .iter_mut()
        .flat_map(|g| g.samples.iter_mut())
        .find(|(t, _)| !t.tokens.is_empty())
    {
        t.loss_mask.pop();
    }
    b
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}
