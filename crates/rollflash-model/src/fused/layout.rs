//! Packed rows ⇄ a padded, heads-first batch (attention of independent sequences), both ways.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::{contiguous, each_chunk, Real, PAR_MIN};

/// Where the sequences of a packed batch sit, and the padded length: sequence `s` is rows
/// `spans[s].0 .. spans[s].0 + spans[s].1`, back to back. Slot `(s, i)` of the padded batch
/// holds row `spans[s].0 + min(i, len − 1)`: a pad repeats the last real row (the attention mask
/// hides it).
#[derive(Debug, Clone)]
pub(crate) struct PadMap {
    /// `(first row, length)` of each sequence, in order, back to back.
    pub spans: Vec<(usize, usize)>,
    /// The padded length (the longest sequence).
    pub t: usize,
}

impl PadMap {
    /// The number of packed rows, after checking that the spans tile them.
    fn rows(&self, what: &str) -> candle_core::Result<usize> {
        let mut next = 0;
        for &(off, len) in &self.spans {
            if off != next || len == 0 || len > self.t {
                candle_core::bail!("{what}: sequences must be non-empty and back to back");
            }
            next += len;
        }
        Ok(next)
    }
}

/// `[n, heads, hd]` packed rows → the padded batch `[b, groups, heads / groups · t, hd]` (heads
/// first; `groups` groups the heads so grouped-query attention needs no reshape): one copy,
/// where the composed version is a gather, a reshape, a transpose, a copy and a reshape — five
/// nodes of the backward graph, each a zeroed buffer and an add. With `zero_pads` pad slots
/// are 0 instead of copies. Backward: each slot's gradient added to its source row, in slot
/// order, as the gather's backward adds them ([`FromHeadsFirst`] with `fold_pads`).
pub(crate) struct ToHeadsFirst {
    pub map: PadMap,
    pub groups: usize,
    pub zero_pads: bool,
}

impl ToHeadsFirst {
    fn fwd<T: Real>(&self, x: &[T], heads: usize, hd: usize) -> Vec<T> {
        let t = self.map.t;
        let mut out = vec![T::zero(); self.map.spans.len() * heads * t * hd];
        let work = |(sh, o): (usize, &mut [T])| {
            let (off, len) = self.map.spans[sh / heads];
            let h = sh % heads;
            for (i, o) in o.chunks_mut(hd).enumerate() {
                if i >= len && self.zero_pads {
                    break;
                }
                let r = off + i.min(len - 1);
                o.copy_from_slice(&x[(r * heads + h) * hd..(r * heads + h + 1) * hd]);
            }
        };
        let work_len = out.len();
        each_chunk(&mut out, t * hd, work_len, work);
        out
    }
}

impl CustomOp1 for ToHeadsFirst {
    fn name(&self) -> &'static str {
        "rollflash-to-heads-first"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let what = "to_heads_first";
        let (n, heads, hd) = l.shape().dims3()?;
        if self.map.rows(what)? != n {
            candle_core::bail!("{what}: the sequences do not cover {n} rows");
        }
        if self.groups == 0 || heads % self.groups != 0 {
            candle_core::bail!("{what}: {heads} heads in {} groups", self.groups);
        }
        let out = on_real!(what, [(x, s, l)], self.fwd(x, heads, hd));
        let rows = heads / self.groups * self.map.t;
        Ok((out, (self.map.spans.len(), self.groups, rows, hd).into()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let (_, heads, hd) = x.dims3()?;
        let dx = grad.contiguous()?.apply_op1_no_bwd(&FromHeadsFirst {
            map: self.map.clone(),
            heads,
            hd,
            fold_pads: true,
        })?;
        Ok(Some(dx.reshape(x.shape())?))
    }
}

/// The padded batch (`[b, …]` holding `heads · t · hd` per sequence, heads first) → packed rows
/// `[n, heads · hd]`: the inverse of [`ToHeadsFirst`], for the attention output, where the
/// composed version is a reshape, a transpose, a copying reshape and a gather. Pad slots are
/// dropped, or with `fold_pads` (the backward of [`ToHeadsFirst`]) added to the row they
/// repeat, in slot order. Backward: [`ToHeadsFirst`] with pads 0 (no output reads them).
pub(crate) struct FromHeadsFirst {
    pub map: PadMap,
    pub heads: usize,
    pub hd: usize,
    pub fold_pads: bool,
}

impl FromHeadsFirst {
    fn fwd<T: Real>(&self, y: &[T], n: usize) -> Vec<T> {
        let (t, heads, hd) = (self.map.t, self.heads, self.hd);
        let mut out = vec![T::zero(); n * heads * hd];
        // One part of the output per sequence: their rows are disjoint and back to back.
        let mut parts = Vec::with_capacity(self.map.spans.len());
        let mut rest = out.as_mut_slice();
        for (s, &(_, len)) in self.map.spans.iter().enumerate() {
            let (part, tail) = std::mem::take(&mut rest).split_at_mut(len * heads * hd);
            parts.push((s, part));
            rest = tail;
        }
        let work = |(s, o): (usize, &mut [T])| {
            let len = self.map.spans[s].1;
            let keep = if self.fold_pads { t } else { len };
            for h in 0..heads {
                let block = &y[(s * heads + h) * t * hd..(s * heads + h + 1) * t * hd];
                for (i, src) in block.chunks(hd).take(keep).enumerate() {
                    let r = i.min(len - 1);
                    let dst = &mut o[(r * heads + h) * hd..(r * heads + h + 1) * hd];
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d += v;
                    }
                }
            }
        };
        if n * heads * hd < PAR_MIN {
            parts.into_iter().for_each(work);
        } else {
            parts.into_par_iter().for_each(work);
        }
        out
    }
}

impl CustomOp1 for FromHeadsFirst {
    fn name(&self) -> &'static str {
        "rollflash-from-heads-first"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let what = "from_heads_first";
        let n = self.map.rows(what)?;
        let want = self.map.spans.len() * self.heads * self.map.t * self.hd;
        if l.shape().elem_count() != want {
            candle_core::bail!("{what}: {:?} is not {want} elements", l.shape());
        }
        let out = on_real!(what, [(y, s, l)], self.fwd(y, n));
        Ok((out, (n, self.heads * self.hd).into()))
    }

    fn bwd(&self, y: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let g = grad
            .contiguous()?
            .reshape((grad.dim(0)?, self.heads, self.hd))?;
        let dy = g.apply_op1_no_bwd(&ToHeadsFirst {
            map: self.map.clone(),
            groups: self.heads,
            zero_pads: true,
        })?;
        Ok(Some(dy.reshape(y.shape())?))
    }
}
