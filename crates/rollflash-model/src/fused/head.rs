//! The output layer and the log-prob/entropy together, computed in blocks of rows so the
//! `[tokens, vocab]` logits and their gradient are never whole.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::logprob::{lpe_grad, lpe_row_stats, LPE_COLS};
use super::matmul::{matmul_into_on, MatRef};
use super::{contiguous, Real};

/// Rows per block of [`HeadLogProbEntropy`]: its scratch is `rows × vocab` (SmolLM2: 48 MiB in
/// f32), against the whole `[tokens, vocab]` logits and their gradient the composed head keeps.
const HEAD_ROWS: usize = 256;

/// [`LogProbEntropy`](super::LogProbEntropy) of `h · Wᵀ` for hidden states `h [n, d]` and the output layer `W [V, d]`,
/// computing the logits one block of [`HEAD_ROWS`] rows at a time: forward the block's row
/// statistics, backward the block's logits again (one more output-layer product), their
/// gradient in place, then `∂h = G · W` for the block and `∂W += Gᵀ · h` over the blocks in
/// order (reproducible). Neither the `[n, V]` logits nor their gradient is ever whole, which is
/// what a training step's peak memory on a large vocabulary was made of. Same statistics and
/// same row arithmetic as [`LogProbEntropy`](super::LogProbEntropy) on the logits `x · Wᵀ`; the products are gemm's.
pub(crate) struct HeadLogProbEntropy {
    pub targets: std::sync::Arc<Vec<u32>>,
    pub temperature: f64,
    /// Whether the backward pass forms `∂W` (not for a frozen base).
    pub head_grad: bool,
}

/// The parallelism of the head's products: the whole current pool.
fn pool_parallelism() -> gemm::Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => gemm::Parallelism::None,
        n => gemm::Parallelism::Rayon(n),
    }
}

impl HeadLogProbEntropy {
    /// `buf [rows, v] = h[r0 .. r0 + rows] · Wᵀ`.
    fn logits<T: Real>(
        h: &[T],
        w: &[T],
        (d, v): (usize, usize),
        (r0, rows): (usize, usize),
        buf: &mut [T],
    ) -> candle_core::Result<()> {
        matmul_into_on(
            buf,
            v,
            MatRef {
                data: &h[r0 * d..(r0 + rows) * d],
                rows,
                cols: d,
                rs: d,
                cs: 1,
            },
            MatRef {
                data: w,
                rows: d,
                cols: v,
                rs: 1,
                cs: d,
            },
            false,
            pool_parallelism(),
        )
    }

    fn check(&self, n: usize, v: usize, what: &str) -> candle_core::Result<()> {
        if n != self.targets.len() {
            candle_core::bail!("{what}: {n} rows but {} targets", self.targets.len());
        }
        if v == 0 {
            candle_core::bail!("{what}: empty vocabulary");
        }
        if let Some(&t) = self.targets.iter().find(|&&t| t as usize >= v) {
            candle_core::bail!("{what}: target {t} outside a vocabulary of {v}");
        }
        Ok(())
    }

    fn fwd<T: Real>(&self, h: &[T], w: &[T], n: usize, d: usize) -> candle_core::Result<Vec<T>> {
        let v = w.len() / d.max(1);
        let inv_t = T::from_f64(1.0 / self.temperature);
        let mut out = vec![T::zero(); n * LPE_COLS];
        let mut buf = vec![T::zero(); HEAD_ROWS.min(n) * v];
        for r0 in (0..n).step_by(HEAD_ROWS) {
            let rows = HEAD_ROWS.min(n - r0);
            Self::logits(h, w, (d, v), (r0, rows), &mut buf)?;
            out[r0 * LPE_COLS..(r0 + rows) * LPE_COLS]
                .par_chunks_mut(LPE_COLS)
                .zip(buf.par_chunks(v))
                .enumerate()
                .for_each(|(i, (o, row))| {
                    lpe_row_stats(row, self.targets[r0 + i] as usize, inv_t, o)
                });
        }
        Ok(out)
    }

    /// `[∂h (n·d) | ∂W (V·d) when head_grad]` from the stats and their gradient side by side
    /// (`sg [n, 2·LPE_COLS]`).
    fn bwd<T: Real>(
        &self,
        h: &[T],
        w: &[T],
        sg: &[T],
        n: usize,
        d: usize,
    ) -> candle_core::Result<Vec<T>> {
        let v = w.len() / d.max(1);
        let inv_t = T::from_f64(1.0 / self.temperature);
        let dw_len = if self.head_grad { v * d } else { 0 };
        let mut out = vec![T::zero(); n * d + dw_len];
        let (dh, dw) = out.split_at_mut(n * d);
        let mut buf = vec![T::zero(); HEAD_ROWS.min(n) * v];
        for r0 in (0..n).step_by(HEAD_ROWS) {
            let rows = HEAD_ROWS.min(n - r0);
            Self::logits(h, w, (d, v), (r0, rows), &mut buf)?;
            // The block's logits become their gradient, in place.
            buf[..rows * v]
                .par_chunks_mut(v)
                .enumerate()
                .for_each(|(i, row)| {
                    let sgi = &sg[(r0 + i) * 2 * LPE_COLS..(r0 + i + 1) * 2 * LPE_COLS];
                    let (st, g) = sgi.split_at(LPE_COLS);
                    let (g_lp, g_ent) = (g[0], g[1]);
                    for x in row.iter_mut() {
                        *x = lpe_grad(*x, st, g_lp, g_ent, inv_t);
                    }
                    row[self.targets[r0 + i] as usize] += g_lp * inv_t;
                });
            let grad = &buf[..rows * v];
            // ∂h = G · W.
            matmul_into_on(
                &mut dh[r0 * d..(r0 + rows) * d],
                d,
                MatRef {
                    data: grad,
                    rows,
                    cols: v,
                    rs: v,
                    cs: 1,
                },
                MatRef {
                    data: w,
                    rows: v,
                    cols: d,
                    rs: d,
                    cs: 1,
                },
                false,
                pool_parallelism(),
            )?;
            if self.head_grad {
                // ∂W += Gᵀ · h.
                matmul_into_on(
                    dw,
                    d,
                    MatRef {
                        data: grad,
                        rows: v,
                        cols: rows,
                        rs: 1,
                        cs: v,
                    },
                    MatRef {
                        data: &h[r0 * d..(r0 + rows) * d],
                        rows,
                        cols: d,
                        rs: d,
                        cs: 1,
                    },
                    true,
                    pool_parallelism(),
                )?;
            }
        }
        Ok(out)
    }
}

impl CustomOp2 for HeadLogProbEntropy {
    fn name(&self) -> &'static str {
        "rollflash-head-logprob-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let what = "head logprob_entropy";
        let (n, d) = l1.shape().dims2()?;
        let (v, d2) = l2.shape().dims2()?;
        if d != d2 {
            candle_core::bail!("{what}: hidden {:?} but head {:?}", l1.shape(), l2.shape());
        }
        self.check(n, v, what)?;
        let out = on_real!(what, [(h, s1, l1), (w, s2, l2)], self.fwd(h, w, n, d)?);
        Ok((out, (n, LPE_COLS).into()))
    }

    fn bwd(
        &self,
        h: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, d) = h.dims2()?;
        let v = w.dim(0)?;
        let sg = Tensor::cat(&[res, grad], 1)?;
        let bwd = HeadLogProbEntropyBwd {
            head: HeadLogProbEntropy {
                targets: self.targets.clone(),
                temperature: self.temperature,
                head_grad: self.head_grad,
            },
        };
        let both = h
            .contiguous()?
            .apply_op3_no_bwd(&w.contiguous()?, &sg.contiguous()?, &bwd)?;
        let dh = both.narrow(0, 0, n * d)?.reshape((n, d))?;
        let dw = if self.head_grad {
            Some(both.narrow(0, n * d, v * d)?.reshape((v, d))?)
        } else {
            None
        };
        Ok((Some(dh), dw))
    }
}

/// `(h, W, [stats | gradient]) → [∂h | ∂W]` flat, for [`HeadLogProbEntropy`].
struct HeadLogProbEntropyBwd {
    head: HeadLogProbEntropy,
}

impl CustomOp3 for HeadLogProbEntropyBwd {
    fn name(&self) -> &'static str {
        "rollflash-head-logprob-entropy-bwd"
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
        let what = "head logprob_entropy backward";
        let (n, d) = l1.shape().dims2()?;
        let (v, d2) = l2.shape().dims2()?;
        if d != d2 || l3.shape().dims() != [n, 2 * LPE_COLS] {
            candle_core::bail!(
                "{what}: hidden {:?}, head {:?}, stats and gradient {:?}",
                l1.shape(),
                l2.shape(),
                l3.shape()
            );
        }
        self.head.check(n, v, what)?;
        let out = on_real!(
            what,
            [(h, s1, l1), (w, s2, l2), (sg, s3, l3)],
            self.head.bwd(h, w, sg, n, d)?
        );
        let len = n * d + if self.head.head_grad { v * d } else { 0 };
        Ok((out, len.into()))
    }
}
