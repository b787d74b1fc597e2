//! The few tensor ops whose fused candle versions record no backward pass, each in two forms:
//! a differentiable composition for training and the fused kernel for inference.
//!
//! candle-nn's `ops::rms_norm`, `ops::softmax_last_dim` and `rotary_emb::rope` are fast but are
//! invisible to autograd, so a training forward built on them silently stops gradients. Every
//! function here takes `fused`: callers pass `true` only when no gradient is wanted.

use candle_core::{DType, Tensor, D};

use crate::Result;

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * w`.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64, fused: bool) -> Result<Tensor> {
    if fused && x.dtype() == DType::F32 {
        return Ok(candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32)?);
    }
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ms + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?.broadcast_mul(w)?)
}

/// Softmax over the last dimension.
pub(crate) fn softmax_last_dim(x: &Tensor, fused: bool) -> Result<Tensor> {
    if fused && x.dtype() == DType::F32 {
        return Ok(candle_nn::ops::softmax_last_dim(&x.contiguous()?)?);
    }
    // The max is a constant shift: softmax is invariant to it, so detaching it is exact and
    // keeps the backward graph small.
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}

/// Log-softmax over the last dimension (always differentiable; used for log-probs).
pub(crate) fn log_softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(shifted.broadcast_sub(&lse)?)
}

/// Rotary embedding in the Hugging Face "rotate half" layout.
///
/// `x` is `[n, heads, head_dim]` (one row per token of a packed batch), `cos`/`sin` are
/// `[n, head_dim / 2]` for each row's own position, so tokens of different sequences at
/// different positions are rotated in one call.
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, fused: bool) -> Result<Tensor> {
    let (n, heads, hd) = x.dims3()?;
    if fused && x.dtype() == DType::F32 {
        // candle's kernel wants [b, h, t, d] with per-batch tables [b, t, d/2]: use b = n, t = 1.
        let x4 = x.reshape((n, heads, 1, hd))?;
        let c = cos.reshape((n, 1, hd / 2))?;
        let s = sin.reshape((n, 1, hd / 2))?;
        let y = candle_nn::rotary_emb::rope(&x4.contiguous()?, &c.contiguous()?, &s.contiguous()?)?;
        return Ok(y.reshape((n, heads, hd))?);
    }
    let half = hd / 2;
    let cos = Tensor::cat(&[cos, cos], D::Minus1)?.unsqueeze(1)?;
    let sin = Tensor::cat(&[sin, sin], D::Minus1)?.unsqueeze(1)?;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?)?)
}

/// SwiGLU's activation: `silu(gate) * up` (candle's `silu` has a backward pass).
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    Ok((gate.silu()? * up)?)
}
