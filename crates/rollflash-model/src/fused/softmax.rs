//! Softmax over the last dimension for training, and its one-pass backward.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

use super::{contiguous, each_chunk, for_blocks, last_dim, Real, BLOCK_ROWS};

/// Softmax over the last dimension for training, in candle's kernel's steps (max, `exp` of the
/// shifted row, the sum in `T`, divide). The sum runs left to right here; candle 0.11 sums f32
/// rows in AVX lanes where the CPU has them, so the two agree to rounding, not bit for bit.
/// Backward: `y ⊙ (g − Σ g ⊙ y)`, one pass ([`SoftmaxBwd`]).
pub(crate) struct SoftmaxLastDim;

impl SoftmaxLastDim {
    fn fwd<T: Real>(x: &[T], v: usize) -> Vec<T> {
        let mut out = vec![T::zero(); x.len()];
        for_blocks(x, &mut out, v, |xs, ys| {
            for (row, y) in xs.chunks(v).zip(ys.chunks_mut(v)) {
                let mut max = row[0];
                for &e in &row[1..] {
                    max = max.larger(e);
                }
                for (y, &e) in y.iter_mut().zip(row) {
                    *y = (e - max).exp();
                }
                let sum: T = y.iter().copied().sum();
                for y in y.iter_mut() {
                    *y /= sum;
                }
            }
        });
        out
    }
}

impl CustomOp1 for SoftmaxLastDim {
    fn name(&self) -> &'static str {
        "rollflash-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let v = last_dim(l);
        let out = on_real!("softmax", [(x, s, l)], Self::fwd(x, v));
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(
            res.contiguous()?
                .apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxBwd)?,
        ))
    }
}

/// `(y, g) → y ⊙ (g − Σ g ⊙ y)` per row of the last dimension (the dot in f64).
struct SoftmaxBwd;

impl SoftmaxBwd {
    fn run<T: Real>(y: &[T], g: &[T], v: usize) -> Vec<T> {
        let mut out = vec![T::zero(); y.len()];
        let step = BLOCK_ROWS * v.max(1);
        let work = |(bi, o): (usize, &mut [T])| {
            let base = bi * step;
            for (r, orow) in o.chunks_mut(v).enumerate() {
                let yr = &y[base + r * v..base + (r + 1) * v];
                let gr = &g[base + r * v..base + (r + 1) * v];
                let dot: f64 = yr
                    .iter()
                    .zip(gr)
                    .map(|(&a, &b)| a.to_f64() * b.to_f64())
                    .sum();
                let dot = T::from_f64(dot);
                for ((o, &a), &b) in orow.iter_mut().zip(yr).zip(gr) {
                    *o = a * (b - dot);
                }
            }
        };
        each_chunk(&mut out, step, y.len(), work);
        out
    }
}

impl CustomOp2 for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "rollflash-softmax-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let v = last_dim(l1);
        let what = "softmax backward";
        let out = on_real!(what, [(y, s1, l1), (g, s2, l2)], Self::run(y, g, v));
        Ok((out, l1.shape().clone()))
    }
}
