//! Verifiers: rewards computed from a finished response (math answer equivalence, format, countdown).
//!
//! A [`Verifier`] is a pure, synchronous function of the response text and the reference:
//! no I/O, no state, bounded work. That keeps it easy to test and lets [`RewardPool`] run it
//! on a blocking thread the moment a response finishes, while other samples still generate.
//!
//! - [`MathVerifier`]: extracts the final answer and compares it to the reference by value
//!   (`\frac{1}{2}` = `0.5` = `1/2`), exactly where both are rational.
//! - [`FormatVerifier`]: `<think>…</think><answer>…</answer>` and nothing else.
//! - [`CountdownVerifier`]: the countdown game (TinyZero): reach the target using each given
//!   number exactly once.
//! - [`WeightedSum`]: combines verifiers, e.g. `answer + 0.1·format`.
//! - [`code`]: the exception — runs the response's program against tests in the sandbox
//!   (async; not a [`Verifier`]).
//! - [`python`]: the user's own Python functions (verl's `compute_score`, TRL's
//!   `reward_funcs`), in a pool of worker processes (async; not a [`Verifier`]).
//!
//! Every verifier is total: any input (huge, deeply nested, not even text a model would write)
//! yields a reward, never a panic, and in time bounded by the input caps in [`expr`] and
//! [`math::MAX_RESPONSE_BYTES`].

pub mod cases;
pub mod code;
pub mod countdown;
pub mod expr;
pub mod format;
pub mod math;
pub mod pool;
pub mod python;

use std::sync::Arc;

pub use countdown::CountdownVerifier;
pub use format::FormatVerifier;
pub use math::MathVerifier;
pub use pool::{RewardPool, RewardPoolConfig, RewardPoolError, RewardPoolStats};

/// The score of one response: the scalar the trainer uses and a short human-readable reason
/// (kept for logs and debugging reward hacking; the trainer ignores it).
#[derive(Debug, Clone, PartialEq)]
pub struct Reward {
    /// The reward. Single verifiers return values in `[0, 1]`; combinations may exceed 1.
    pub value: f64,
    /// Why, in a few words: `"correct"`, `"no answer found"`, `"verifier timed out"`.
    pub detail: String,
}

impl Reward {
    /// A reward with its reason.
    pub fn new(value: f64, detail: impl Into<String>) -> Reward {
        Reward {
            value,
            detail: detail.into(),
        }
    }

    /// Zero, with the reason.
    pub fn zero(detail: impl Into<String>) -> Reward {
        Reward::new(0.0, detail)
    }
}

/// Scores a finished response against a reference answer. Implementations must be pure and
/// total (never panic, bounded work), since they run once per sample on the rollout path.
pub trait Verifier: Send + Sync {
    /// The reward of `response` given `reference`.
    fn score(&self, response: &str, reference: &str) -> Reward;
}

impl<V: Verifier + ?Sized> Verifier for Arc<V> {
    fn score(&self, response: &str, reference: &str) -> Reward {
        (**self).score(response, reference)
    }
}

impl<V: Verifier + ?Sized> Verifier for Box<V> {
    fn score(&self, response: &str, reference: &str) -> Reward {
        (**self).score(response, reference)
    }
}

impl<V: Verifier + ?Sized> Verifier for &V {
    fn score(&self, response: &str, reference: &str) -> Reward {
        (**self).score(response, reference)
    }
}

/// `Σ wᵢ · scoreᵢ`: several verifiers over the same response and reference. ROLL's math
/// reward is `WeightedSum::new().with(1.0, MathVerifier::default()).with(0.1, FormatVerifier)`
/// ([`WeightedSum::math_with_format`]).
#[derive(Default)]
pub struct WeightedSum {
    /// The terms, in the order their details are reported.
    terms: Vec<(f64, Box<dyn Verifier>)>,
}

impl std::fmt::Debug for WeightedSum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let weights: Vec<f64> = self.terms.iter().map(|(w, _)| *w).collect();
        f.debug_struct("WeightedSum")
            .field("weights", &weights)
            .finish()
    }
}

impl WeightedSum {
    /// No terms (scores 0).
    pub fn new() -> WeightedSum {
        WeightedSum::default()
    }

    /// Adds `weight · verifier`.
    pub fn with(mut self, weight: f64, verifier: impl Verifier + 'static) -> WeightedSum {
        self.terms.push((weight, Box::new(verifier)));
        self
    }

    /// Answer correctness plus `format_weight` times the format reward.
    pub fn math_with_format(format_weight: f64) -> WeightedSum {
        WeightedSum::new()
            .with(1.0, MathVerifier::default())
            .with(format_weight, FormatVerifier)
    }
}

impl Verifier for WeightedSum {
    fn score(&self, response: &str, reference: &str) -> Reward {
        let mut value = 0.0;
        let mut details = Vec::with_capacity(self.terms.len());
        for (w, v) in &self.terms {
            let r = v.score(response, reference);
            value += w * r.value;
            details.push(format!("{w}x[{}]", r.detail));
        }
        Reward::new(value, details.join(" + "))
    }
}
