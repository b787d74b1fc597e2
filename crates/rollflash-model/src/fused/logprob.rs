//! The log-prob of the target and the entropy per row of the logits, forward and backward.

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Shape, Tensor};

use super::{contiguous, each_chunk, Real};

/// Per row of `logits [n, V]` with `z = logits / temperature`: `[log p(target), H, max, s]` as
/// `[n, 4]`, where `max` is the row's largest logit and `s = log Σ exp(z − max/temperature)`
/// (the last two are for the backward pass; [`crate::ops::logprob_entropy`] returns the first
/// two). Backward, one pass over the row: `∂lp/∂z_j = δ_jt − p_j`,
/// `∂H/∂z_j = −p_j (log p_j + H)`, both divided by the temperature ([`LogProbEntropyBwd`]).
///
/// The exponentials are in `T` (f32 for an f32 model) and their sums in f64, so the statistics
/// are as exact as the f32 logits they come from (the f64 tests hold them to the composed ops
/// at 1e-10); the rows are split over the current rayon pool.
pub(crate) struct LogProbEntropy {
    pub targets: std::sync::Arc<Vec<u32>>,
    pub temperature: f64,
}

/// Columns of [`LogProbEntropy`]'s output.
pub(super) const LPE_COLS: usize = 4;

impl LogProbEntropy {
    fn fwd<T: Real>(&self, data: &[T], v: usize) -> candle_core::Result<Vec<T>> {
        if let Some(&t) = self.targets.iter().find(|&&t| t as usize >= v) {
            candle_core::bail!("logprob_entropy: target {t} outside a vocabulary of {v}");
        }
        let inv_t = T::from_f64(1.0 / self.temperature);
        let mut out = vec![T::zero(); self.targets.len() * LPE_COLS];
        let work = |(i, o): (usize, &mut [T])| {
            lpe_row_stats(
                &data[i * v..(i + 1) * v],
                self.targets[i] as usize,
                inv_t,
                o,
            );
        };
        each_chunk(&mut out, LPE_COLS, data.len(), work);
        Ok(out)
    }
}

impl CustomOp1 for LogProbEntropy {
    fn name(&self) -> &'static str {
        "rollflash-logprob-entropy"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, v) = l.shape().dims2()?;
        let what = "logprob_entropy";
        if n != self.targets.len() {
            candle_core::bail!("{what}: {n} rows but {} targets", self.targets.len());
        }
        if v == 0 {
            candle_core::bail!("{what}: empty vocabulary");
        }
        let out = on_real!(what, [(d, s, l)], self.fwd(d, v)?);
        Ok((out, (n, LPE_COLS).into()))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let bwd = LogProbEntropyBwd {
            targets: self.targets.clone(),
            temperature: self.temperature,
        };
        // Read in place from the logits' storage: no host copies of `[n, V]`.
        Ok(Some(logits.contiguous()?.apply_op3_no_bwd(
            &res.contiguous()?,
            &grad.contiguous()?,
            &bwd,
        )?))
    }
}

/// One row's `[log p(target), H, max, s]` ([`LogProbEntropy`]'s columns) from its logits.
pub(super) fn lpe_row_stats<T: Real>(row: &[T], target: usize, inv_t: T, o: &mut [T]) {
    let mut max = row[0];
    for &x in &row[1..] {
        max = max.larger(x);
    }
    let (mut sum, mut sum_ez) = (0f64, 0f64);
    for &x in row {
        let z = (x - max) * inv_t;
        let e = z.exp();
        sum += e.to_f64();
        sum_ez += (e * z).to_f64();
    }
    let s = sum.ln();
    let zt = ((row[target] - max) * inv_t).to_f64();
    // H = −Σ p (z − s) = s − Σ p z, with z measured from the max.
    o[0] = T::from_f64(zt - s);
    o[1] = T::from_f64(s - sum_ez / sum);
    o[2] = max;
    o[3] = T::from_f64(s);
}

/// `∂(g_lp · log p_t + g_ent · H)/∂x` for one logit `x` of a row with stats `st`, without the
/// target's own `g_lp / T` (the caller adds it).
#[inline]
pub(super) fn lpe_grad<T: Real>(x: T, st: &[T], g_lp: T, g_ent: T, inv_t: T) -> T {
    let (ent, max, s) = (st[1], st[2], st[3]);
    let logp = (x - max) * inv_t - s;
    let p = logp.exp();
    (-(g_lp * p) - g_ent * p * (logp + ent)) * inv_t
}

/// `(logits, stats, g) → ∂(g · stats)/∂logits` for [`LogProbEntropy`], one pass per row.
struct LogProbEntropyBwd {
    targets: std::sync::Arc<Vec<u32>>,
    temperature: f64,
}

impl LogProbEntropyBwd {
    fn run<T: Real>(&self, data: &[T], stats: &[T], g: &[T], v: usize) -> Vec<T> {
        let inv_t = T::from_f64(1.0 / self.temperature);
        let mut out = vec![T::zero(); data.len()];
        let work = |(i, o): (usize, &mut [T])| {
            let row = &data[i * v..(i + 1) * v];
            let st = &stats[i * LPE_COLS..(i + 1) * LPE_COLS];
            let (g_lp, g_ent) = (g[i * LPE_COLS], g[i * LPE_COLS + 1]);
            for (o, &x) in o.iter_mut().zip(row) {
                *o = lpe_grad(x, st, g_lp, g_ent, inv_t);
            }
            let t = self.targets[i] as usize;
            o[t] += g_lp * inv_t;
        };
        each_chunk(&mut out, v, data.len(), work);
        out
    }
}

impl CustomOp3 for LogProbEntropyBwd {
    fn name(&self) -> &'static str {
        "rollflash-logprob-entropy-bwd"
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
        let (n, v) = l1.shape().dims2()?;
        let what = "logprob_entropy backward";
        if l2.shape().dims() != [n, LPE_COLS] || l3.shape().dims() != [n, LPE_COLS] {
            candle_core::bail!(
                "{what}: logits {:?}, stats {:?}, gradient {:?}",
                l1.shape(),
                l2.shape(),
                l3.shape()
            );
        }
        let out = on_real!(
            what,
            [(x, s1, l1), (st, s2, l2), (g, s3, l3)],
            self.run(x, st, g, v)
        );
        Ok((out, l1.shape().clone()))
    }
}
