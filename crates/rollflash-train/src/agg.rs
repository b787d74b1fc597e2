//! Loss aggregation: how per-token losses become one scalar.
//!
//! Every mode is a weighted sum `Σ_t w_t·ℓ_t` with weights that depend only on the mask and
//! the sequence layout, so the weights are computed once as plain data and the scalar is one
//! multiply-and-sum on the device. Definitions follow ROLL's `agg_loss`
//! (`roll/utils/functionals.py`, itself from verl's `core_algos.agg_loss`), with ROLL's
//! denominators: the number of valid tokens and the number of *valid* sequences (sequences
//! with at least one valid token), each floored at 1 (ROLL's `_get_batch_num_tokens` /
//! `_get_global_valid_samples`). ROLL adds 1e-8 to some denominators; that changes results by
//! a relative 1e-8 at most and is left out.

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::layout::SeqLayout;

/// How per-token losses are reduced. Serialised snake_case; ROLL/verl's kebab-case names
/// (`token-mean`, ...) are accepted as aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossAgg {
    /// `Σ_t m_t·ℓ_t / Σ_t m_t`: every valid token weighs the same, so long sequences weigh
    /// more (DAPO, AReaL, verl's default).
    #[serde(alias = "token-mean")]
    TokenMean,
    /// `(1/S_valid)·Σ_i Σ_{t∈i} m_t·ℓ_t`: mean over sequences of per-sequence sums.
    #[serde(alias = "seq-mean-token-sum")]
    SeqMeanTokenSum,
    /// `(1/S_valid)·Σ_i (Σ_{t∈i} m_t·ℓ_t / Σ_{t∈i} m_t)`: every sequence weighs the same
    /// (the GRPO paper; ROLL's default).
    #[default]
    #[serde(alias = "seq-mean-token-mean")]
    SeqMeanTokenMean,
    /// `Σ_i Σ_{t∈i} m_t·ℓ_t / L`: the total sum over a constant `L` (Dr. GRPO). ROLL and verl
    /// take `L` = the padded response length and do **not** divide by the number of
    /// sequences; here `L` is `LossConfig::agg_norm_len`, or the longest sequence.
    #[serde(alias = "seq-mean-token-sum-norm")]
    SeqMeanTokenSumNorm,
}

impl LossAgg {
    /// The per-token weights `w_t` of this mode for `mask` (0/1 per token). `norm_len` is the
    /// constant `L` of [`LossAgg::SeqMeanTokenSumNorm`] (default: `layout.max_len()`, at
    /// least 1); other modes ignore it. Masked tokens get weight 0.
    pub fn weights(self, mask: &[f64], layout: &SeqLayout, norm_len: Option<usize>) -> Vec<f64> {
        let mut w = vec![0.0; mask.len()];
        match self {
            LossAgg::TokenMean => {
                let n: f64 = mask.iter().sum();
                let denom = n.max(1.0);
                for (w, &m) in w.iter_mut().zip(mask) {
                    *w = m / denom;
                }
            }
            LossAgg::SeqMeanTokenSum | LossAgg::SeqMeanTokenMean => {
                let counts: Vec<f64> = layout
                    .ranges()
                    .map(|r| mask[r].iter().sum::<f64>())
                    .collect();
                let valid = counts.iter().filter(|&&c| c > 0.0).count() as f64;
                let denom = valid.max(1.0);
                for (range, &count) in layout.ranges().zip(&counts) {
                    if count <= 0.0 {
                        continue;
                    }
                    let per_seq = if self == LossAgg::SeqMeanTokenMean {
                        count
                    } else {
                        1.0
                    };
                    for t in range {
                        w[t] = mask[t] / (per_seq * denom);
                    }
                }
            }
            LossAgg::SeqMeanTokenSumNorm => {
                let len = norm_len.unwrap_or_else(|| layout.max_len()).max(1) as f64;
                for (w, &m) in w.iter_mut().zip(mask) {
                    *w = m / len;
                }
            }
        }
        w
    }
}

/// `Σ_t w_t·x_t` as a scalar tensor, differentiable w.r.t. `x`; `weights` are constants.
pub fn weighted_sum(x: &Tensor, weights: &[f64]) -> Result<Tensor> {
    let w = host_tensor(weights, x.device(), x.dtype())?;
    Ok(x.mul(&w)?.sum_all()?)
}

/// Aggregates a per-token loss `loss_tok` (`[tokens]`) with `agg` over `mask` (0/1): the
/// scalar differentiable w.r.t. `loss_tok`. Masked tokens must hold finite values (they are
/// multiplied by 0).
pub fn aggregate(
    loss_tok: &Tensor,
    mask: &[f64],
    layout: &SeqLayout,
    agg: LossAgg,
    norm_len: Option<usize>,
) -> Result<Tensor> {
    layout.check_tokens("loss_tok", loss_tok.elem_count())?;
    layout.check_tokens("mask", mask.len())?;
    weighted_sum(loss_tok, &agg.weights(mask, layout, norm_len))
}

/// A host `f64` vector as a 1-D tensor of `dtype` on `device`.
pub(crate) fn host_tensor(
    values: &[f64],
    device: &Device,
    dtype: candle_core::DType,
) -> Result<Tensor> {
    Ok(Tensor::from_slice(values, values.len(), device)?.to_dtype(dtype)?)
}
