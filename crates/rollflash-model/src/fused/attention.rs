//! Causal attention for training in one op (scores, mask, softmax, values), with a backward
//! that recomputes the probabilities; and the mask that says which keys each query sees.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::matmul::{matmul_into, MatRef};
use super::{contiguous, dot_f64, max_lanes, sum_lanes, Real};

/// Which keys each query row of attention may see, for `q [batch, groups, rows, hd]` against
/// `k [batch, groups, keys, hd]` (any leading dimensions; rows split evenly among the batch
/// elements). Rows are queries repeated per head: row `r` is query `r % queries`. Query `i` of
/// batch element `b` sees keys `0 ..= min(past + i, lens[b] − 1)` — causal, and never a pad key.
#[derive(Debug, Clone)]
pub(crate) struct CausalMask {
    /// Queries per head (the rows of a head are `queries` consecutive rows).
    pub queries: usize,
    /// Keys before the first query (a chunk continuing a cache; 0 for a fresh sequence).
    pub past: usize,
    /// Real key length of each batch element; the rows split evenly among them. A pad query
    /// row still sees its element's real keys, so its softmax stays finite.
    pub lens: Vec<usize>,
}

impl CausalMask {
    /// Keys visible to `row` of `rows` in all, each of `keys` entries.
    fn visible(&self, row: usize, rows: usize, keys: usize) -> usize {
        let per_batch = (rows / self.lens.len().max(1)).max(1);
        let len = self
            .lens
            .get(row / per_batch)
            .copied()
            .unwrap_or(keys)
            .max(1);
        let i = row % self.queries.max(1);
        ((self.past + i).min(len - 1) + 1).min(keys)
    }
}

/// `softmax(scale · s)` of one row's visible raw scores, in place, in the composed training ops'
/// steps — the product `s · scale` in `T` (candle's `affine`), the max, the `exp` of the shifted
/// entries, their sum in `T`, the division ([`SoftmaxLastDim`](super::SoftmaxLastDim)) — with the `exp` of
/// [`Real::exp_vec`], the max over [`max_lanes`] and the sum over [`sum_lanes`]: inlined into
/// [`SoftmaxRows`]' dispatch, the row runs in AVX2/AVX-512 vectors (with libm's `expf` per
/// entry, this softmax was about 15 % of the default model's training step). The hidden keys are left out, as the `−∞` of the composed mask
/// adds nothing to the sum.
#[inline(always)]
fn causal_softmax_row<T: Real>(y: &mut [T], scale: T) {
    for y in y.iter_mut() {
        *y *= scale;
    }
    if y.is_empty() {
        return;
    }
    let max = max_lanes(y);
    for y in y.iter_mut() {
        *y = (*y - max).exp_vec();
    }
    let sum = sum_lanes(y);
    for y in y.iter_mut() {
        *y /= sum;
    }
}

/// The rows of a block of attention probabilities (`width` apart): row `i`'s first `seen(i)`
/// entries through [`causal_softmax_row`], the rest zeroed. Compiled once per instruction set
/// and chosen at run time by `pulp`, as gemm chooses its kernels.
struct SoftmaxRows<'a, T, F> {
    p: &'a mut [T],
    width: usize,
    seen: F,
    scale: T,
}

impl<T: Real, F: Fn(usize) -> usize> pulp::WithSimd for SoftmaxRows<'_, T, F> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        for (i, row) in self.p.chunks_mut(self.width).enumerate() {
            let (seen, hidden) = row.split_at_mut((self.seen)(i));
            causal_softmax_row(seen, self.scale);
            hidden.fill(T::zero());
        }
    }
}

/// Query rows per block of [`FusedAttention`]'s products: a block's scores fit a small per-task
/// scratch (`rows × keys`), and a block of a causal head needs only the keys its last row sees,
/// so the masked upper triangle is mostly skipped (at 128 queries, 4 blocks compute 5/8 of the
/// full score matrix).
const ATTN_ROWS: usize = 32;

/// Below this many multiply-adds of `q · kᵀ` attention runs on the calling thread.
const ATTN_PAR_MIN: usize = 1 << 16;

/// Causal attention for training, `softmax(scale · q kᵀ + mask) · v`, with the mask of
/// [`CausalMask`], in one op over `q [.., rows, hd]` (heads first: `rows = rep · queries`, the
/// `rep` query heads of a kv group one after the other, as [`ToHeadsFirst`](super::ToHeadsFirst) lays them out) and
/// `k, v [.., keys, hd]` (the same leading dimensions, one kv head each). Output: `[.., rows,
/// hd]` like `q`.
///
/// The composed ops (`q · kᵀ`, the masked softmax, `· v`) keep the raw scores and the probabilities
/// — two `[rows, keys]` tensors per kv head and layer — alive until the backward pass ends; this op
/// keeps only its inputs and output and recomputes the probabilities in the backward pass
/// (flash-attention style; [`FusedAttentionBwd`]). Its per-row arithmetic is the composed training
/// ops': the scores from gemm, then [`causal_softmax_row`], then gemm, so the two agree to rounding
/// (the sums' order, and [`exp_f32`](super::exp_f32)'s 2 ulp in f32). Work is split by query head (and, in the
/// backward pass, each kv group's heads are summed after, in head order), so results do not depend
/// on the thread count.
#[derive(Debug, Clone)]
pub(crate) struct FusedAttention {
    pub scale: f64,
    pub mask: CausalMask,
}

/// The sizes of one [`FusedAttention`] call.
#[derive(Debug, Clone, Copy)]
struct AttnDims {
    /// Query heads in all (batch × kv groups × rep).
    heads: usize,
    /// Query heads per kv head.
    rep: usize,
    /// Query rows per head.
    queries: usize,
    /// Keys per kv head.
    keys: usize,
    /// Head dimension.
    hd: usize,
}

impl AttnDims {
    /// The sizes of `q`, `k`, `v` under `mask`, after checking that they fit together.
    fn of(
        q: &Layout,
        k: &Layout,
        v: &Layout,
        mask: &CausalMask,
        what: &str,
    ) -> candle_core::Result<Self> {
        let (qd, kd) = (q.shape().dims(), k.shape().dims());
        let n = qd.len();
        if n < 2 || kd.len() != n || v.shape() != k.shape() || qd[..n - 2] != kd[..n - 2] {
            candle_core::bail!(
                "{what}: q {:?}, k {:?}, v {:?}",
                q.shape(),
                k.shape(),
                v.shape()
            );
        }
        let (rows, hd, keys) = (qd[n - 2], qd[n - 1], kd[n - 2]);
        let queries = mask.queries;
        if kd[n - 1] != hd || keys == 0 || hd == 0 || queries == 0 || rows % queries != 0 {
            candle_core::bail!(
                "{what}: q {:?} and k {:?} with {queries} queries per head",
                q.shape(),
                k.shape()
            );
        }
        let groups: usize = qd[..n - 2].iter().product();
        let rep = rows / queries;
        Ok(Self {
            heads: groups * rep,
            rep,
            queries,
            keys,
            hd,
        })
    }

    /// Whether the work is worth splitting over the rayon pool.
    fn parallel(&self) -> bool {
        self.heads * self.queries * self.keys * self.hd >= ATTN_PAR_MIN
    }
}

/// One head's inputs for [`FusedAttention`]: its queries (and, backward, their output
/// gradients), its kv head's keys and values.
struct HeadIn<'a, T> {
    /// Global index of the head's first row (for the mask).
    row0: usize,
    /// Rows in all (for the mask).
    rows: usize,
    /// The head's queries, `[queries, hd]`.
    q: &'a [T],
    /// Its kv head's keys, `[keys, hd]`.
    k: &'a [T],
    /// Its kv head's values, `[keys, hd]`.
    v: &'a [T],
}

impl FusedAttention {
    /// The inputs of head `h`.
    fn head<'a, T>(
        &self,
        d: &AttnDims,
        h: usize,
        q: &'a [T],
        k: &'a [T],
        v: &'a [T],
    ) -> HeadIn<'a, T> {
        let (qn, kn) = (d.queries * d.hd, d.keys * d.hd);
        let g = h / d.rep;
        HeadIn {
            row0: h * d.queries,
            rows: d.heads * d.queries,
            q: &q[h * qn..(h + 1) * qn],
            k: &k[g * kn..(g + 1) * kn],
            v: &v[g * kn..(g + 1) * kn],
        }
    }

    /// The probabilities of query rows `r0..r1` of a head into `p` (`[r1 − r0, width]`, 0 past
    /// each row's visible keys), where `width` (returned) is the most keys any of them sees.
    fn probs<T: Real>(
        &self,
        d: &AttnDims,
        x: &HeadIn<'_, T>,
        (r0, r1): (usize, usize),
        p: &mut [T],
    ) -> candle_core::Result<usize> {
        let vis = |i: usize| self.mask.visible(x.row0 + i, x.rows, d.keys);
        let width = (r0..r1).map(vis).max().unwrap_or(1);
        let p = &mut p[..(r1 - r0) * width];
        let hd = d.hd;
        matmul_into(
            p,
            width,
            MatRef {
                data: &x.q[r0 * hd..r1 * hd],
                rows: r1 - r0,
                cols: hd,
                rs: hd,
                cs: 1,
            },
            // kᵀ: element (c, j) is key j's component c.
            MatRef {
                data: x.k,
                rows: hd,
                cols: width,
                rs: 1,
                cs: hd,
            },
            false,
        )?;
        pulp::Arch::new().dispatch(SoftmaxRows {
            p,
            width,
            seen: |i| vis(r0 + i),
            scale: T::from_f64(self.scale),
        });
        Ok(width)
    }

    /// The blocks of a head's query rows, `ATTN_ROWS` at a time.
    fn blocks(d: &AttnDims) -> impl Iterator<Item = (usize, usize)> {
        let n = d.queries;
        (0..n)
            .step_by(ATTN_ROWS)
            .map(move |r0| (r0, (r0 + ATTN_ROWS).min(n)))
    }

    fn fwd<T: Real>(&self, d: &AttnDims, q: &[T], k: &[T], v: &[T]) -> candle_core::Result<Vec<T>> {
        let mut out = vec![T::zero(); q.len()];
        let step = d.queries * d.hd;
        let work = |h: usize, o: &mut [T], p: &mut Vec<T>| -> candle_core::Result<()> {
            let x = self.head(d, h, q, k, v);
            for (r0, r1) in Self::blocks(d) {
                let width = self.probs(d, &x, (r0, r1), p)?;
                matmul_into(
                    &mut o[r0 * d.hd..r1 * d.hd],
                    d.hd,
                    MatRef {
                        data: &p[..],
                        rows: r1 - r0,
                        cols: width,
                        rs: width,
                        cs: 1,
                    },
                    MatRef {
                        data: x.v,
                        rows: width,
                        cols: d.hd,
                        rs: d.hd,
                        cs: 1,
                    },
                    false,
                )?;
            }
            Ok(())
        };
        let scratch = ATTN_ROWS * d.keys;
        if d.parallel() {
            out.par_chunks_mut(step)
                .enumerate()
                .try_for_each_init(|| vec![T::zero(); scratch], |p, (h, o)| work(h, o, p))?;
        } else {
            let mut p = vec![T::zero(); scratch];
            for (h, o) in out.chunks_mut(step).enumerate() {
                work(h, o, &mut p)?;
            }
        }
        Ok(out)
    }
}

impl CustomOp3 for FusedAttention {
    fn name(&self) -> &'static str {
        "rollflash-fused-attention"
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
        let what = "attention";
        let d = AttnDims::of(l1, l2, l3, &self.mask, what)?;
        let out = on_real!(
            what,
            [(q, s1, l1), (k, s2, l2), (v, s3, l3)],
            self.fwd(&d, q, k, v)?
        );
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let bwd = FusedAttentionBwd {
            attn: self.clone(),
            grad: grad.contiguous()?,
        };
        let all = q
            .contiguous()?
            .apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &bwd)?;
        let (nq, nk) = (q.elem_count(), k.elem_count());
        let dq = all.narrow(0, 0, nq)?.reshape(q.shape())?;
        let dk = all.narrow(0, nq, nk)?.reshape(k.shape())?;
        let dv = all.narrow(0, nq + nk, nk)?.reshape(v.shape())?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// The backward of [`FusedAttention`]: `(q, k, v)` with the output's gradient `dO` (held here:
/// a custom op takes three inputs) → `[dq | dk | dv]`, flat. Per block of query rows it
/// recomputes the probabilities `P` exactly as the forward pass did, then
/// `dP = dO vᵀ`, `D_i = Σ_j P_ij dP_ij` (in f64), `dS = scale · P ⊙ (dP − D)` (the composed
/// backward's arithmetic: the softmax's, then `affine`'s), `dq = dS k`, and adds `dSᵀ q` and
/// `Pᵀ dO` to the head's key and value gradients. The `rep` heads of a kv group each get their
/// own key/value gradient, summed in head order at the end (reproducible, and every head can
/// run in parallel).
struct FusedAttentionBwd {
    attn: FusedAttention,
    /// `dO`, contiguous, shaped like `q`.
    grad: Tensor,
}

impl FusedAttentionBwd {
    /// `[dq | dk | dv]`, flat.
    fn run<T: Real>(
        &self,
        d: &AttnDims,
        q: &[T],
        k: &[T],
        v: &[T],
        g: &[T],
    ) -> candle_core::Result<Vec<T>> {
        let (nq, nk) = (q.len(), k.len());
        let mut out = vec![T::zero(); nq + 2 * nk];
        let (dq, rest) = out.split_at_mut(nq);
        let (dk, dv) = rest.split_at_mut(nk);
        if d.rep == 1 {
            self.heads(d, (q, k, v, g), dq, dk, dv)?;
        } else {
            let mut dkh = vec![T::zero(); nk * d.rep];
            let mut dvh = vec![T::zero(); nk * d.rep];
            self.heads(d, (q, k, v, g), dq, &mut dkh, &mut dvh)?;
            // Each kv head's gradients: the sum of its query heads', in head order.
            let kn = d.keys * d.hd;
            for (dst, src) in [(dk, &dkh), (dv, &dvh)] {
                let work = |(o, s): (&mut [T], &[T])| {
                    for part in s.chunks(kn) {
                        for (o, &x) in o.iter_mut().zip(part) {
                            *o += x;
                        }
                    }
                };
                if d.parallel() {
                    dst.par_chunks_mut(kn)
                        .zip(src.par_chunks(kn * d.rep))
                        .for_each(work);
                } else {
                    dst.chunks_mut(kn)
                        .zip(src.chunks(kn * d.rep))
                        .for_each(work);
                }
            }
        }
        Ok(out)
    }

    /// Every query head's `dq` into `dq`, and its own key/value gradients into `dk`, `dv`
    /// (`[heads, keys, hd]`).
    fn heads<T: Real>(
        &self,
        d: &AttnDims,
        (q, k, v, g): (&[T], &[T], &[T], &[T]),
        dq: &mut [T],
        dk: &mut [T],
        dv: &mut [T],
    ) -> candle_core::Result<()> {
        let attn = &self.attn;
        let (qn, kn, hd) = (d.queries * d.hd, d.keys * d.hd, d.hd);
        let scale = T::from_f64(attn.scale);
        let work = |h: usize,
                    ((dq, dk), dv): ((&mut [T], &mut [T]), &mut [T]),
                    scratch: &mut Vec<T>|
         -> candle_core::Result<()> {
            let x = attn.head(d, h, q, k, v);
            let gh = &g[h * qn..(h + 1) * qn];
            let (p, ds) = scratch.split_at_mut(ATTN_ROWS * d.keys);
            for (r0, r1) in FusedAttention::blocks(d) {
                let width = attn.probs(d, &x, (r0, r1), p)?;
                let nr = r1 - r0;
                let p = &p[..nr * width];
                let ds = &mut ds[..nr * width];
                let g_blk = &gh[r0 * hd..r1 * hd];
                // dP = dO vᵀ
                matmul_into(
                    ds,
                    width,
                    MatRef {
                        data: g_blk,
                        rows: nr,
                        cols: hd,
                        rs: hd,
                        cs: 1,
                    },
                    MatRef {
                        data: x.v,
                        rows: hd,
                        cols: width,
                        rs: 1,
                        cs: hd,
                    },
                    false,
                )?;
                for (i, (pr, dr)) in (r0..r1).zip(p.chunks(width).zip(ds.chunks_mut(width))) {
                    let vis = attn.mask.visible(x.row0 + i, x.rows, d.keys);
                    let (pr, (dr, hidden)) = (&pr[..vis], dr.split_at_mut(vis));
                    let dot = dot_f64(
                        pr.iter()
                            .zip(dr.iter())
                            .map(|(&a, &b)| a.to_f64() * b.to_f64()),
                    );
                    let dot = T::from_f64(dot);
                    for (o, &a) in dr.iter_mut().zip(pr) {
                        *o = a * (*o - dot) * scale;
                    }
                    hidden.fill(T::zero());
                }
                let ds = &ds[..];
                // dq = dS k
                matmul_into(
                    &mut dq[r0 * hd..r1 * hd],
                    hd,
                    MatRef {
                        data: ds,
                        rows: nr,
                        cols: width,
                        rs: width,
                        cs: 1,
                    },
                    MatRef {
                        data: x.k,
                        rows: width,
                        cols: hd,
                        rs: hd,
                        cs: 1,
                    },
                    false,
                )?;
                // dk += dSᵀ q, dv += Pᵀ dO (keys past `width` get nothing from this block).
                let q_blk = &x.q[r0 * hd..r1 * hd];
                matmul_into(
                    &mut dk[..width * hd],
                    hd,
                    MatRef {
                        data: ds,
                        rows: width,
                        cols: nr,
                        rs: 1,
                        cs: width,
                    },
                    MatRef {
                        data: q_blk,
                        rows: nr,
                        cols: hd,
                        rs: hd,
                        cs: 1,
                    },
                    true,
                )?;
                matmul_into(
                    &mut dv[..width * hd],
                    hd,
                    MatRef {
                        data: p,
                        rows: width,
                        cols: nr,
                        rs: 1,
                        cs: width,
                    },
                    MatRef {
                        data: g_blk,
                        rows: nr,
                        cols: hd,
                        rs: hd,
                        cs: 1,
                    },
                    true,
                )?;
            }
            Ok(())
        };
        let scratch = 2 * ATTN_ROWS * d.keys;
        if d.parallel() {
            dq.par_chunks_mut(qn)
                .zip(dk.par_chunks_mut(kn))
                .zip(dv.par_chunks_mut(kn))
                .enumerate()
                .try_for_each_init(
                    || vec![T::zero(); scratch],
                    |s, (h, parts)| work(h, parts, s),
                )
        } else {
            let mut s = vec![T::zero(); scratch];
            dq.chunks_mut(qn)
                .zip(dk.chunks_mut(kn))
                .zip(dv.chunks_mut(kn))
                .enumerate()
                .try_for_each(|(h, parts)| work(h, parts, &mut s))
        }
    }
}

impl CustomOp3 for FusedAttentionBwd {
    fn name(&self) -> &'static str {
        "rollflash-fused-attention-bwd"
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
        let what = "attention backward";
        let d = AttnDims::of(l1, l2, l3, &self.attn.mask, what)?;
        if self.grad.shape() != l1.shape() {
            candle_core::bail!(
                "{what}: gradient {:?} for q {:?}",
                self.grad.shape(),
                l1.shape()
            );
        }
        let (gs, gl) = self.grad.storage_and_layout();
        let candle_core::Storage::Cpu(gs) = &*gs else {
            candle_core::bail!("{what}: the gradient is not on the CPU");
        };
        let out = on_real!(
            what,
            [(q, s1, l1), (k, s2, l2), (v, s3, l3), (g, gs, gl)],
            self.run(&d, q, k, v, g)?
        );
        let n = l1.shape().elem_count() + 2 * l2.shape().elem_count();
        Ok((out, n.into()))
    }
}
