//! RMSNorm: the fused forward kernel and its backward (input and weight gradients).

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::{contiguous, dot_f64, for_blocks, last_dim, Real, BLOCK_ROWS, PAR_MIN};

/// `y = x / sqrt(mean(x²) + eps) * w` over the last dimension (candle's kernel's arithmetic:
/// the sum of squares in `T`, left to right; the divisor formed in `T`).
pub(crate) struct RmsNorm {
    pub eps: f32,
}

fn rms_denominator<T: Real>(row: &[T], eps: f32) -> T {
    let sum2: T = row.iter().map(|&v| v * v).sum();
    (sum2 / T::of_usize(row.len()) + T::of_f32(eps)).sqrt()
}

impl RmsNorm {
    fn fwd<T: Real>(&self, x: &[T], w: &[T], d: usize) -> Vec<T> {
        let mut out = vec![T::zero(); x.len()];
        for_blocks(x, &mut out, d, |xs, ys| {
            for (row, y) in xs.chunks(d).zip(ys.chunks_mut(d)) {
                let m = rms_denominator(row, self.eps);
                for ((y, &v), &a) in y.iter_mut().zip(row).zip(w) {
                    *y = v / m * a;
                }
            }
        });
        out
    }
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rollflash-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let d = last_dim(l1);
        if l2.shape().elem_count() != d {
            candle_core::bail!("rms_norm: weight of {:?} for rows of {d}", l2.shape());
        }
        let out = on_real!("rms_norm", [(x, s1, l1), (w, s2, l2)], self.fwd(x, w, d));
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let d = w.elem_count();
        let rows = x.elem_count() / d.max(1);
        let both = x.contiguous()?.apply_op3_no_bwd(
            &w.contiguous()?,
            &grad.contiguous()?,
            &RmsNormBwd { eps: self.eps },
        )?;
        let dx = both.narrow(0, 0, rows)?.reshape(x.shape())?;
        let dw = both.narrow(0, rows, 1)?.reshape(w.shape())?;
        Ok((Some(dx), Some(dw)))
    }
}

/// The backward of [`RmsNorm`]: `(x, w, g) → [rows + 1, d]`, the input gradient's rows then the
/// weight gradient. With `m = sqrt(mean(x²) + eps)`:
/// `∂/∂x_j = g_j w_j / m − x_j · Σ_i g_i w_i x_i / (d m³)`, `∂/∂w_i = Σ_rows g_i x_i / m`.
struct RmsNormBwd {
    eps: f32,
}

impl RmsNormBwd {
    fn run<T: Real>(&self, x: &[T], w: &[T], g: &[T], d: usize) -> Vec<T> {
        let rows = x.len() / d.max(1);
        let mut out = vec![T::zero(); (rows + 1) * d];
        let (dx, dw) = out.split_at_mut(rows * d);
        let step = BLOCK_ROWS * d;
        let block = |(bi, dxs): (usize, &mut [T])| -> Vec<f64> {
            let mut dw = vec![0f64; d];
            let base = bi * step;
            for (r, dxr) in dxs.chunks_mut(d).enumerate() {
                let row = &x[base + r * d..base + (r + 1) * d];
                let gr = &g[base + r * d..base + (r + 1) * d];
                // Multiplies by 1/m: two divisions per element were most of this loop.
                let inv_m = 1.0 / rms_denominator(row, self.eps).to_f64();
                let dot = dot_f64(
                    row.iter()
                        .zip(gr)
                        .zip(w)
                        .map(|((&v, &gi), &a)| gi.to_f64() * a.to_f64() * v.to_f64()),
                );
                let c = dot * inv_m * inv_m * inv_m / d as f64;
                for (j, o) in dxr.iter_mut().enumerate() {
                    let (v, gi) = (row[j].to_f64(), gr[j].to_f64());
                    *o = T::from_f64(gi * w[j].to_f64() * inv_m - v * c);
                    dw[j] += gi * v * inv_m;
                }
            }
            dw
        };
        let partials: Vec<Vec<f64>> = if x.len() < PAR_MIN {
            dx.chunks_mut(step).enumerate().map(block).collect()
        } else {
            dx.par_chunks_mut(step).enumerate().map(block).collect()
        };
        let mut total = vec![0f64; d];
        for p in &partials {
            for (t, v) in total.iter_mut().zip(p) {
                *t += v;
            }
        }
        for (o, t) in dw.iter_mut().zip(total) {
            *o = T::from_f64(t);
        }
        out
    }
}

impl CustomOp3 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "rollflash-rms-norm-bwd"
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
        let d = last_dim(l1);
        let rows = l1.shape().elem_count() / d.max(1);
        let what = "rms_norm backward";
        let out = on_real!(
            what,
            [(x, s1, l1), (w, s2, l2), (g, s3, l3)],
            self.run(x, w, g, d)
        );
        Ok((out, (rows + 1, d).into()))
    }
}
