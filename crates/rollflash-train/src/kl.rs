//! Per-token KL estimators between the policy and a reference, as plain data (for a reward
//! penalty) and as differentiable tensors (for a loss term).
//!
//! With `d = logπ − logπ_ref` on the sampled token (Schulman, "Approximating KL Divergence"):
//! - `k1 = d` — unbiased for KL(π‖π_ref), high variance, can be negative;
//! - `k2 = ½·d²` — ROLL's `mse`;
//! - `k3 = exp(−d) − (−d) − 1 = exp(ref − logπ) − (ref − logπ) − 1` — unbiased, always ≥ 0;
//! - `abs = |d|`.
//!
//! Direction and clamp follow ROLL's `compute_approx_kl` (`roll/utils/functionals.py`):
//! `log_ratio = log_probs − log_probs_base`, and k3 is computed from `kl = base − log_probs`
//! and **clamped to [−10, 10]** (so its gradient vanishes beyond 10). ROLL's KL *loss* uses
//! k3; its KL *reward penalty* defaults to k1 (`kl_penalty: kl`).

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// Where ROLL clamps the k3 estimate (both ends; k3 is never negative, so only 10 bites).
pub const K3_CLAMP: f64 = 10.0;

/// Which per-token KL estimator. Serialised snake_case; ROLL's names `kl` and `mse` are
/// accepted as aliases of `k1` and `k2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `logπ − logπ_ref`.
    #[serde(alias = "kl")]
    K1,
    /// `½·(logπ − logπ_ref)²`.
    #[serde(alias = "mse")]
    K2,
    /// `exp(ref − logπ) − (ref − logπ) − 1`, clamped to [−10, 10].
    #[default]
    K3,
    /// `|logπ − logπ_ref|`.
    Abs,
}

impl KlEstimator {
    /// The estimate for one token with log-prob `logp` under the policy and `ref_logp` under
    /// the reference.
    pub fn estimate(self, logp: f64, ref_logp: f64) -> f64 {
        let d = logp - ref_logp;
        match self {
            KlEstimator::K1 => d,
            KlEstimator::K2 => 0.5 * d * d,
            KlEstimator::K3 => {
                let x = -d; // ROLL: kl = log_probs_base - log_probs
                (x.exp() - x - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
            }
            KlEstimator::Abs => d.abs(),
        }
    }

    /// Differentiable per-token estimate w.r.t. `logp` (a 1-D tensor; `ref_logp` the same
    /// shape, treated as a constant). The non-smooth points follow torch's autograd:
    /// `abs` has gradient 0 at `d = 0`, and k3 has gradient 0 where it is clamped.
    pub fn tensor(self, logp: &Tensor, ref_logp: &Tensor) -> Result<Tensor> {
        let ref_logp = ref_logp.detach();
        let d = logp.sub(&ref_logp)?;
        Ok(match self {
            KlEstimator::K1 => d,
            KlEstimator::K2 => (d.sqr()? * 0.5)?,
            KlEstimator::K3 => {
                let x = d.neg()?;
                let k3 = ((x.exp()? - &x)? - 1.0)?;
                // Clamp with a detached selector rather than min/max, whose candle backward
                // halves the gradient at ties: inside the band k3 passes, outside it is a
                // constant. k3 >= 0, so only the upper bound can apply.
                let inside = k3.detach().le(K3_CLAMP)?;
                let bound =
                    Tensor::full(K3_CLAMP, k3.shape(), k3.device())?.to_dtype(k3.dtype())?;
                inside.where_cond(&k3, &bound)?
            }
            KlEstimator::Abs => {
                // sign(d), detached, with sign(0) = 0 like torch's `abs` backward.
                let sign = d.detach().sign()?;
                (d * sign)?
            }
        })
    }
}

/// Per-token KL estimates over a packed batch, 0 on masked tokens.
pub fn kl_per_token(
    estimator: KlEstimator,
    logp: &[f64],
    ref_logp: &[f64],
    mask: &[bool],
) -> Result<Vec<f64>> {
    check_len("ref_logp", logp.len(), ref_logp.len())?;
    check_len("mask", logp.len(), mask.len())?;
    Ok(logp
        .iter()
        .zip(ref_logp)
        .zip(mask)
        .map(|((&l, &r), &m)| if m { estimator.estimate(l, r) } else { 0.0 })
        .collect())
}

/// Per-token KL **reward penalty** `coef·kl_t` (to be subtracted from token rewards), 0 on
/// masked tokens. ROLL's `apply_kl_penalty` computes it from the old (generating) policy's
/// log-probs against the reference, with `coef` = the KL controller's current β.
pub fn kl_penalty(
    estimator: KlEstimator,
    coef: f64,
    logp: &[f64],
    ref_logp: &[f64],
    mask: &[bool],
) -> Result<Vec<f64>> {
    let mut kl = kl_per_token(estimator, logp, ref_logp, mask)?;
    for k in &mut kl {
        *k *= coef;
    }
    Ok(kl)
}

/// Reads a 1-D tensor into `f64`s (any float dtype, any device).
pub(crate) fn to_f64_vec(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.detach().to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

fn check_len(name: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(crate::error::TrainError::Length {
            name,
            expected,
            got,
        })
    }
}
