//! Rotary embedding ("rotate half" layout): forward, and its backward as the opposite rotation.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::{contiguous, Real, PAR_MIN};

/// Rotary embedding in the "rotate half" layout: `x [n, heads, hd]`, `cos, sin [n, hd / 2]`
/// (row `i`'s own position). `y₁ = x₁ cos − x₂ sin`, `y₂ = x₁ sin + x₂ cos`, as candle's kernel.
/// Its backward is the same rotation by the opposite angle (`sin → −sin`).
pub(crate) struct Rope;

impl Rope {
    fn fwd<T: Real>(x: &[T], cos: &[T], sin: &[T], heads: usize, hd: usize) -> Vec<T> {
        let half = hd / 2;
        let mut out = vec![T::zero(); x.len()];
        let row = heads * hd;
        // Tokens are independent: rotate token by token, in parallel when large.
        let work = |(t, (xr, yr)): (usize, (&[T], &mut [T]))| {
            let c = &cos[t * half..(t + 1) * half];
            let s = &sin[t * half..(t + 1) * half];
            for (xh, yh) in xr.chunks(hd).zip(yr.chunks_mut(hd)) {
                for i in 0..half {
                    let (x1, x2) = (xh[i], xh[i + half]);
                    yh[i] = x1 * c[i] - x2 * s[i];
                    yh[i + half] = x1 * s[i] + x2 * c[i];
                }
            }
        };
        if x.len() < PAR_MIN {
            x.chunks(row)
                .zip(out.chunks_mut(row))
                .enumerate()
                .for_each(work);
        } else {
            x.par_chunks(row)
                .zip(out.par_chunks_mut(row))
                .enumerate()
                .for_each(work);
        }
        out
    }
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "rollflash-rope"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, heads, hd) = l1.shape().dims3()?;
        if hd % 2 != 0 || l2.shape().dims() != [n, hd / 2] || l3.shape().dims() != [n, hd / 2] {
            candle_core::bail!(
                "rope: x {:?} with cos {:?} and sin {:?}",
                l1.shape(),
                l2.shape(),
                l3.shape()
            );
        }
        let out = on_real!(
            "rope",
            [(x, s1, l1), (c, s2, l2), (s, s3, l3)],
            Self::fwd(x, c, s, heads, hd)
        );
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // The tables are constants of the model: no gradient for them.
        let dx = grad
            .contiguous()?
            .apply_op3_no_bwd(cos, &sin.neg()?, &Rope)?;
        Ok((Some(dx), None, None))
    }
}
