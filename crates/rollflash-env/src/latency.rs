//! A wrapper that gives any environment a configurable latency distribution and failure rate.
//!
//! Real agentic environments (sandboxes, web tools, game servers) answer in tens of
//! milliseconds to minutes and sometimes fail; the asynchronous rollout machinery exists for
//! them. [`Flaky`] reproduces both with cheap built-in environments: before every `reset` and
//! `step` it sleeps for a latency drawn from a [`LatencyConfig`] (with `tokio::time::sleep`,
//! so paused-time tests run instantly) and, with probability [`FailureConfig::rate`], fails
//! the call in one of three ways ([`FailureKind`]). Draws come from the wrapper's own seeded
//! ChaCha8 RNG, so a run is reproducible and independent of the environment's own randomness.

use std::time::Duration;

use async_trait::async_trait;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};

use crate::env::{Env, EnvError, Reset, Step};

/// Longest latency ever slept, whatever the distribution says: keeps `Duration` conversion
/// finite (a day is far beyond any caller's timeout).
pub const MAX_LATENCY_SECS: f64 = 86_400.0;

/// The latency distribution, in seconds. JSON: `{"kind": "fixed", "secs": 0.2}`,
/// `{"kind": "uniform", "low": 0.1, "high": 0.5}`,
/// `{"kind": "log_normal", "mean": 0.5, "sigma": 1.0, "cap_secs": 30}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LatencyConfig {
    /// Always `secs`.
    Fixed { secs: f64 },
    /// Uniform on `[low, high]`.
    Uniform { low: f64, high: f64 },
    /// Log-normal with the given *mean* latency in seconds and σ of the underlying normal;
    /// the normal's μ is `ln(mean) − σ²/2`, which makes the latency's mean exactly `mean`
    /// whatever the spread. Heavy-tailed like real tool latencies; `cap_secs` clips the tail
    /// (which lowers the mean slightly).
    LogNormal {
        mean: f64,
        sigma: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap_secs: Option<f64>,
    },
}

impl LatencyConfig {
    /// Checks ranges; errors name the field.
    pub fn validate(&self) -> Result<(), EnvError> {
        let nonneg = |field: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(EnvError::Config {
                    field: field.into(),
                    reason: format!("must be finite and >= 0, got {v}"),
                })
            }
        };
        match *self {
            LatencyConfig::Fixed { secs } => nonneg("secs", secs),
            LatencyConfig::Uniform { low, high } => {
                nonneg("low", low)?;
                nonneg("high", high)?;
                if low > high {
                    return Err(EnvError::Config {
                        field: "high".into(),
                        reason: format!("must be >= low ({low}), got {high}"),
                    });
                }
                Ok(())
            }
            LatencyConfig::LogNormal {
                mean,
                sigma,
                cap_secs,
            } => {
                if !(mean.is_finite() && mean > 0.0) {
                    return Err(EnvError::Config {
                        field: "mean".into(),
                        reason: format!("must be finite and > 0, got {mean}"),
                    });
                }
                nonneg("sigma", sigma)?;
                if sigma > 10.0 {
                    return Err(EnvError::Config {
                        field: "sigma".into(),
                        reason: format!("must be <= 10, got {sigma}"),
                    });
                }
                if let Some(cap) = cap_secs {
                    nonneg("cap_secs", cap)?;
                }
                Ok(())
            }
        }
    }

    /// The distribution ready for sampling; fails on an invalid config.
    pub fn sampler(&self) -> Result<LatencySampler, EnvError> {
        self.validate()?;
        let dist = match *self {
            LatencyConfig::Fixed { secs } => Dist::Fixed(secs),
            LatencyConfig::Uniform { low, high } => Dist::Uniform(low, high),
            LatencyConfig::LogNormal {
                mean,
                sigma,
                cap_secs,
            } => {
                let mu = mean.ln() - sigma * sigma / 2.0;
                let d = LogNormal::new(mu, sigma).map_err(|e| EnvError::Config {
                    field: "sigma".into(),
                    reason: e.to_string(),
                })?;
                Dist::LogNormal(d, cap_secs.unwrap_or(MAX_LATENCY_SECS))
            }
        };
        Ok(LatencySampler { dist })
    }
}

#[derive(Debug, Clone, Copy)]
enum Dist {
    Fixed(f64),
    Uniform(f64, f64),
    LogNormal(LogNormal<f64>, f64),
}

/// A validated [`LatencyConfig`] that draws latencies.
#[derive(Debug, Clone, Copy)]
pub struct LatencySampler {
    dist: Dist,
}

impl LatencySampler {
    /// One latency, in seconds.
    pub fn sample_secs<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        let secs = match self.dist {
            Dist::Fixed(s) => s,
            // `random_range` panics on an empty range; validation allows low == high.
            Dist::Uniform(low, high) if low < high => rng.random_range(low..=high),
            Dist::Uniform(low, _) => low,
            Dist::LogNormal(d, cap) => d.sample(rng).min(cap),
        };
        secs.clamp(0.0, MAX_LATENCY_SECS)
    }

    /// One latency as a `Duration`.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        Duration::try_from_secs_f64(self.sample_secs(rng)).unwrap_or(Duration::ZERO)
    }
}

/// How an injected failure shows itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The call returns `Err(EnvError::Failed)` without touching the environment: a crash
    /// or a refused connection.
    #[default]
    Error,
    /// The call never returns (it awaits forever, consuming nothing): a stuck sandbox. Only the
    /// caller's per-call timeout ends it; dropping the future leaves the environment as it
    /// was before the call.
    Hang,
    /// The environment does its work, then the result is replaced by
    /// `Err(EnvError::Garbage)`: a reply corrupted on the way back. The episode has advanced,
    /// so the caller cannot simply retry the step.
    Garbage,
}

/// Failure injection: each `reset`/`step` fails with probability `rate`.
/// JSON: `{"rate": 0.01, "kind": "hang"}` (`kind` defaults to `error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureConfig {
    /// Probability in [0, 1] that a call fails.
    pub rate: f64,
    /// How it fails.
    #[serde(default)]
    pub kind: FailureKind,
}

impl FailureConfig {
    /// Checks ranges; errors name the field.
    pub fn validate(&self) -> Result<(), EnvError> {
        if !(0.0..=1.0).contains(&self.rate) {
            return Err(EnvError::Config {
                field: "rate".into(),
                reason: format!("must be in [0, 1], got {}", self.rate),
            });
        }
        Ok(())
    }
}

/// Wraps an environment with latency and failure injection (see the module docs).
///
/// Per call it draws, in this order, the latency (if configured) and then one uniform number
/// for the failure decision (if configured), sleeps, and then fails or forwards the call.
#[derive(Debug)]
pub struct Flaky<E> {
    inner: E,
    latency: Option<LatencySampler>,
    failure: Option<FailureConfig>,
    rng: ChaCha8Rng,
}

impl<E: Env> Flaky<E> {
    /// Wraps `inner`; `seed` seeds the latency/failure RNG. Fails on invalid configs.
    pub fn new(
        inner: E,
        latency: Option<LatencyConfig>,
        failure: Option<FailureConfig>,
        seed: u64,
    ) -> Result<Self, EnvError> {
        let latency = latency.map(|l| l.sampler()).transpose()?;
        if let Some(f) = &failure {
            f.validate()?;
        }
        Ok(Flaky {
            inner,
            latency,
            failure,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    /// The wrapped environment.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// The wrapped environment, mutably.
    pub fn inner_mut(&mut self) -> &mut E {
        &mut self.inner
    }

    /// Unwraps.
    pub fn into_inner(self) -> E {
        self.inner
    }

    /// Draws this call's latency and failure decision.
    fn draw(&mut self) -> (Duration, Option<FailureKind>) {
        let delay = self
            .latency
            .map_or(Duration::ZERO, |l| l.sample(&mut self.rng));
        let fail = match &self.failure {
            Some(f) => (self.rng.random::<f64>() < f.rate).then_some(f.kind),
            None => None,
        };
        (delay, fail)
    }

    /// Sleeps, then applies a drawn `Error` or `Hang`; a `Garbage` failure is returned for
    /// the caller to apply after the real call.
    async fn before_call(&mut self, what: &str) -> Result<bool, EnvError> {
        let (delay, fail) = self.draw();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        match fail {
            None => Ok(false),
            Some(FailureKind::Error) => {
                Err(EnvError::Failed(format!("injected failure in {what}")))
            }
            Some(FailureKind::Hang) => std::future::pending().await,
            Some(FailureKind::Garbage) => Ok(true),
        }
    }
}

#[async_trait]
impl<E: Env> Env for Flaky<E> {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        let garbage = self.before_call("reset").await?;
        let r = self.inner.reset(seed).await?;
        if garbage {
            return Err(EnvError::Garbage(format!(
                "injected garbage in reset ({} bytes lost)",
                r.observation.len()
            )));
        }
        Ok(r)
    }

    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let garbage = self.before_call("step").await?;
        let s = self.inner.step(action).await?;
        if garbage {
            return Err(EnvError::Garbage(format!(
                "injected garbage in step ({} bytes lost)",
                s.observation.len()
            )));
        }
        Ok(s)
    }

    async fn close(&mut self) -> Result<(), EnvError> {
        // No injected latency or failure: releasing is not the environment's work.
        self.inner.close().await
    }
}
