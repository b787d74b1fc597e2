//! The random quantities of a workload — token lengths and latencies — as serde enums that
//! sample from a caller's RNG.

use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::SimError;

/// A distribution of token counts (at least 0; callers clip to their bounds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LengthDist {
    Fixed {
        tokens: u64,
    },
    /// Uniform over `min..=max`.
    Uniform {
        min: u64,
        max: u64,
    },
    /// Log-normal with the given median (`e^μ`) and σ of the log: a long right tail whose
    /// weight grows quickly with σ (σ = 1: the 99th percentile is 10× the median).
    LogNormal {
        median: f64,
        sigma: f64,
    },
    /// The math task's law (`rollflash-env`'s `MathTask`): `min_terms + k` terms with
    /// `P(k) ∝ (k + 1)^-exponent`, up to `max_terms`; each term costs `tokens_per_term`
    /// tokens of worked solution on top of `base_tokens`.
    TermLaw {
        min_terms: u64,
        max_terms: u64,
        exponent: f64,
        tokens_per_term: u64,
        base_tokens: u64,
    },
    /// Uniform over measured lengths (e.g. responses the real policy generated on the real
    /// prompts, for `rollflash sim validate`).
    Empirical {
        tokens: Vec<u64>,
    },
}

impl LengthDist {
    /// Checks ranges; `field` names the setting in errors.
    pub fn validate(&self, field: &str) -> Result<(), SimError> {
        let bad = |m: String| SimError::Config {
            field: field.to_string(),
            message: m,
        };
        match *self {
            LengthDist::Fixed { .. } => Ok(()),
            LengthDist::Empirical { ref tokens } if tokens.is_empty() => {
                Err(bad("needs at least one measured length".into()))
            }
            LengthDist::Empirical { .. } => Ok(()),
            LengthDist::Uniform { min, max } if min > max => {
                Err(bad(format!("min ({min}) must not exceed max ({max})")))
            }
            LengthDist::Uniform { .. } => Ok(()),
            LengthDist::LogNormal { median, sigma } => {
                if !(median > 0.0) || !median.is_finite() {
                    return Err(bad(format!("median must be finite and > 0, got {median}")));
                }
                if !(sigma >= 0.0) || !sigma.is_finite() {
                    return Err(bad(format!("sigma must be finite and >= 0, got {sigma}")));
                }
                Ok(())
            }
            LengthDist::TermLaw {
                min_terms,
                max_terms,
                exponent,
                ..
            } => {
                if min_terms > max_terms {
                    return Err(bad(format!(
                        "min_terms ({min_terms}) must not exceed max_terms ({max_terms})"
                    )));
                }
                if max_terms - min_terms > 100_000 {
                    return Err(bad("at most 100000 term counts".into()));
                }
                if !(exponent >= 0.0) || !exponent.is_finite() {
                    return Err(bad(format!(
                        "exponent must be finite and >= 0, got {exponent}"
                    )));
                }
                Ok(())
            }
        }
    }

    /// One draw.
    pub fn sample<R: Rng>(&self, rng: &mut R) -> u64 {
        match *self {
            LengthDist::Fixed { tokens } => tokens,
            LengthDist::Empirical { ref tokens } => {
                if tokens.is_empty() {
                    return 0;
                }
                tokens[rng.random_range(0..tokens.len())]
            }
            LengthDist::Uniform { min, max } => rng.random_range(min..=max),
            LengthDist::LogNormal { median, sigma } => {
                let z: f64 = StandardNormal.sample(rng);
                (median * (sigma * z).exp()).round().max(0.0) as u64
            }
            LengthDist::TermLaw {
                min_terms,
                max_terms,
                exponent,
                tokens_per_term,
                base_tokens,
            } => {
                let n = max_terms - min_terms + 1;
                let total: f64 = (0..n).map(|k| ((k + 1) as f64).powf(-exponent)).sum();
                let mut u = rng.random::<f64>() * total;
                let mut terms = max_terms;
                for k in 0..n {
                    u -= ((k + 1) as f64).powf(-exponent);
                    if u <= 0.0 {
                        terms = min_terms + k;
                        break;
                    }
                }
                base_tokens + tokens_per_term * terms
            }
        }
    }

    /// The mean, where it has a closed form (before any clipping).
    pub fn mean(&self) -> f64 {
        match *self {
            LengthDist::Fixed { tokens } => tokens as f64,
            LengthDist::Empirical { ref tokens } => {
                tokens.iter().sum::<u64>() as f64 / tokens.len().max(1) as f64
            }
            LengthDist::Uniform { min, max } => (min + max) as f64 / 2.0,
            LengthDist::LogNormal { median, sigma } => median * (sigma * sigma / 2.0).exp(),
            LengthDist::TermLaw {
                min_terms,
                max_terms,
                exponent,
                tokens_per_term,
                base_tokens,
            } => {
                let n = max_terms - min_terms + 1;
                let w: Vec<f64> = (0..n).map(|k| ((k + 1) as f64).powf(-exponent)).collect();
                let total: f64 = w.iter().sum();
                let terms: f64 = w
                    .iter()
                    .enumerate()
                    .map(|(k, p)| (min_terms + k as u64) as f64 * p)
                    .sum::<f64>()
                    / total;
                base_tokens as f64 + tokens_per_term as f64 * terms
            }
        }
    }
}

/// A distribution of latencies in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LatencyDist {
    Fixed {
        secs: f64,
    },
    /// Uniform over `[min, max]`.
    Uniform {
        min: f64,
        max: f64,
    },
    /// Log-normal with the given *mean* (not median) and σ of the log, the shape of
    /// `rollflash-env`'s `Flaky` latency: a heavy tail of slow steps. `cap_secs` clips the
    /// tail, as `Flaky`'s `cap_secs` does (which lowers the mean slightly).
    LogNormal {
        mean: f64,
        sigma: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap_secs: Option<f64>,
    },
}

impl LatencyDist {
    /// Checks ranges; `field` names the setting in errors.
    pub fn validate(&self, field: &str) -> Result<(), SimError> {
        let bad = |m: String| SimError::Config {
            field: field.to_string(),
            message: m,
        };
        let ok = |v: f64| v >= 0.0 && v.is_finite();
        match *self {
            LatencyDist::Fixed { secs } if !ok(secs) => {
                Err(bad(format!("secs must be finite and >= 0, got {secs}")))
            }
            LatencyDist::Uniform { min, max } if !ok(min) || !ok(max) || min > max => Err(bad(
                format!("need 0 <= min <= max (finite), got {min}..{max}"),
            )),
            LatencyDist::LogNormal { mean, sigma, .. } if !ok(mean) || !ok(sigma) => Err(bad(
                format!("mean and sigma must be finite and >= 0, got {mean}, {sigma}"),
            )),
            LatencyDist::LogNormal {
                cap_secs: Some(cap),
                ..
            } if !ok(cap) => Err(bad(format!("cap_secs must be finite and >= 0, got {cap}"))),
            _ => Ok(()),
        }
    }

    /// One draw, in seconds.
    pub fn sample<R: Rng>(&self, rng: &mut R) -> f64 {
        match *self {
            LatencyDist::Fixed { secs } => secs,
            LatencyDist::Uniform { min, max } => min + (max - min) * rng.random::<f64>(),
            LatencyDist::LogNormal {
                mean,
                sigma,
                cap_secs,
            } => {
                if mean <= 0.0 {
                    return 0.0;
                }
                // E[e^(μ+σZ)] = e^(μ+σ²/2), so μ = ln(mean) − σ²/2 keeps the mean.
                let mu = mean.ln() - sigma * sigma / 2.0;
                let z: f64 = StandardNormal.sample(rng);
                let secs = (mu + sigma * z).exp();
                cap_secs.map_or(secs, |c| secs.min(c))
            }
        }
    }

    /// The mean in seconds (for a capped log-normal, of the uncapped distribution).
    pub fn mean(&self) -> f64 {
        match *self {
            LatencyDist::Fixed { secs } => secs,
            LatencyDist::Uniform { min, max } => (min + max) / 2.0,
            LatencyDist::LogNormal { mean, .. } => mean,
        }
    }
}
