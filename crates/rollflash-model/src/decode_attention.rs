//! Batched decode attention on the CPU, read straight from each sequence's KV cache.
//!
//! A decode step attends one new query per sequence to that sequence's cached keys. The
//! composed path stacks every member's whole cache buffers into one `[B, kv_heads, capacity,
//! head_dim]` tensor (a copy of the batch's entire KV cache, per layer, per step), builds a
//! mask tensor, and runs the matmuls over the full capacity including the masked tail. This
//! kernel reads the cache buffers in place and visits only the positions each sequence has.
//!
//! Arithmetic per (sequence, head): the query is scaled first (as the composed path does), the
//! scores are dot products over the head dimension, the softmax subtracts the row maximum and
//! sums the exponentials left to right (candle's softmax kernel), and the output is
//! `Σ_j p_j · v_j` with `p_j` already normalised. The dot products use eight partial sums, so
//! results differ from the composed path's matmul in the last bits (f32: about 1e-7 relative),
//! far inside the engine-vs-training tolerance of 1e-4.

use candle_core::{CpuStorage, Device, Storage, Tensor};
use rayon::prelude::*;

use crate::error::{ModelError, Result};
use crate::fused::Real;

/// One sequence of the batch: its cache buffers for the layer and how many positions it sees.
pub(crate) struct Member<'a> {
    /// `[kv_heads, capacity, head_dim]`, contiguous.
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    /// Positions visible to the new query (the cached ones and the token just appended).
    pub seen: usize,
}

/// Shapes of one call.
#[derive(Clone, Copy)]
pub(crate) struct Heads {
    pub kv_heads: usize,
    /// Query heads per kv head (grouped-query attention).
    pub rep: usize,
    pub head_dim: usize,
}

/// `q: [n, heads, head_dim]` (contiguous), `rows[i]`: the row of `q` that is member `i`'s
/// query. Returns `[members, heads · head_dim]`. `None` when the inputs are not f32/f64 CPU
/// tensors (the caller then takes the composed path).
pub(crate) fn decode_attention(
    q: &Tensor,
    rows: &[usize],
    members: &[Member<'_>],
    heads: Heads,
    scale: f64,
) -> Result<Option<Tensor>> {
    if !q.device().is_cpu() || rows.len() != members.len() {
        return Ok(None);
    }
    let (q_store, q_layout) = q.storage_and_layout();
    let Some((q0, q1)) = q_layout.contiguous_offsets() else {
        return Ok(None);
    };
    // Keep every cache's read guard alive while its slice is used.
    let guards: Vec<_> = members
        .iter()
        .map(|m| (m.k.storage_and_layout(), m.v.storage_and_layout()))
        .collect();
    let call = Call {
        rows,
        guards: &guards,
        members,
        heads,
        scale,
    };
    let out = match &*q_store {
        Storage::Cpu(CpuStorage::F32(q)) => call.typed(&q[q0..q1])?,
        Storage::Cpu(CpuStorage::F64(q)) => call.typed(&q[q0..q1])?,
        _ => None,
    };
    Ok(out.transpose()?)
}

/// One [`decode_attention`] call's arguments besides the queries.
struct Call<'a, 'g> {
    rows: &'a [usize],
    guards: &'g [Guard<'g>],
    members: &'a [Member<'a>],
    heads: Heads,
    scale: f64,
}

impl<'g> Call<'_, 'g> {
    /// The call for the queries' element type: `None` when a cache holds another.
    fn typed<T: Real>(&self, q: &[T]) -> Result<Option<candle_core::Result<Tensor>>> {
        let caches = slices(self.guards, self.members, self.heads, |s| {
            s.as_slice::<T>().ok()
        })?;
        Ok(caches.map(|c| {
            Tensor::from_vec(
                run(q, self.rows, &c, self.heads, self.scale),
                shape(self.rows, self.heads),
                &Device::Cpu,
            )
        }))
    }
}

fn shape(rows: &[usize], h: Heads) -> (usize, usize) {
    (rows.len(), h.kv_heads * h.rep * h.head_dim)
}

type Guard<'a> = (
    (candle_core::StorageRef<'a>, &'a candle_core::Layout),
    (candle_core::StorageRef<'a>, &'a candle_core::Layout),
);

/// Each member's key and value slices (`[kv_heads, capacity, head_dim]`) with its capacity and
/// `seen`; `None` when a buffer has another dtype, device or layout.
fn slices<'g, T>(
    guards: &'g [Guard<'_>],
    members: &[Member<'_>],
    h: Heads,
    typed: impl Fn(&'g CpuStorage) -> Option<&'g [T]>,
) -> Result<Option<Vec<Cache<'g, T>>>> {
    let mut out = Vec::with_capacity(guards.len());
    for (((ks, kl), (vs, vl)), m) in guards.iter().zip(members) {
        let (Storage::Cpu(ks), Storage::Cpu(vs)) = (&**ks, &**vs) else {
            return Ok(None);
        };
        let (Some(k), Some(v)) = (typed(ks), typed(vs)) else {
            return Ok(None);
        };
        let (Some((k0, k1)), Some((v0, v1))) = (kl.contiguous_offsets(), vl.contiguous_offsets())
        else {
            return Ok(None);
        };
        let cap = kl.shape().dims().get(1).copied().unwrap_or(0);
        if kl.shape() != vl.shape() || k1 - k0 != h.kv_heads * cap * h.head_dim {
            return Err(ModelError::InvalidRequest(format!(
                "decode attention: cache buffers {:?} / {:?} do not hold {} kv heads of {}",
                kl.shape(),
                vl.shape(),
                h.kv_heads,
                h.head_dim
            )));
        }
        if m.seen == 0 || m.seen > cap {
            return Err(ModelError::InvalidRequest(format!(
                "decode attention: {} positions seen in a cache of {cap}",
                m.seen
            )));
        }
        out.push(Cache {
            k: &k[k0..k1],
            v: &v[v0..v1],
            cap,
            seen: m.seen,
        });
    }
    Ok(Some(out))
}

struct Cache<'a, T> {
    k: &'a [T],
    v: &'a [T],
    cap: usize,
    seen: usize,
}

/// The kernel: one parallel task per (member, kv head); each handles that head's `rep` queries.
/// The per-task body is compiled for the CPU's vector extensions (AVX2 / AVX-512, chosen at run
/// time by `pulp`, as `gemm` chooses its kernels): without them the dot products and the
/// weighted sum of values run in SSE and this kernel was slower than the stacked matmuls.
fn run<T: Real>(q: &[T], rows: &[usize], caches: &[Cache<'_, T>], h: Heads, scale: f64) -> Vec<T> {
    let (hd, rep, nkv) = (h.head_dim, h.rep, h.kv_heads);
    let row_len = nkv * rep * hd;
    let scale = T::from_f64(scale);
    let arch = pulp::Arch::new();
    let mut out = vec![T::zero(); rows.len() * row_len];
    out.par_chunks_mut(rep * hd).enumerate().for_each_init(
        || (Vec::new(), Vec::new()),
        |(scores, qr): &mut (Vec<T>, Vec<T>), (task, o)| {
            let (i, g) = (task / nkv, task % nkv);
            let c = &caches[i];
            let q_at = rows[i] * row_len + g * rep * hd;
            let span = g * c.cap * hd..(g * c.cap + c.seen) * hd;
            let (keys, values) = (&c.k[span.clone()], &c.v[span]);
            let queries = &q[q_at..q_at + rep * hd];
            scores.resize(c.seen, T::zero());
            qr.resize(hd, T::zero());
            arch.dispatch(Head {
                queries,
                keys,
                values,
                hd,
                scale,
                scores,
                qr,
                o,
            });
        },
    );
    out
}

/// The `rep` queries of one kv head against its `seen` keys and values, written to `o`
/// (zeroed). Plain indexed loops: the body is compiled once per instruction set inside
/// `pulp`'s dispatch, and only what is inlined there gets the wider vectors.
struct Head<'a, T> {
    queries: &'a [T],
    keys: &'a [T],
    values: &'a [T],
    hd: usize,
    scale: T,
    /// Scratch of `seen` and `hd` elements.
    scores: &'a mut [T],
    qr: &'a mut [T],
    o: &'a mut [T],
}

impl<T: Real> pulp::WithSimd for Head<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let Head {
            queries,
            keys,
            values,
            hd,
            scale,
            scores,
            qr,
            o,
        } = self;
        let seen = scores.len();
        let rep = queries.len() / hd;
        for r in 0..rep {
            for d in 0..hd {
                qr[d] = queries[r * hd + d] * scale;
            }
            for (j, s) in scores.iter_mut().enumerate() {
                *s = dot(qr, &keys[j * hd..(j + 1) * hd]);
            }
            let mut max = scores[0];
            for &s in &scores[1..] {
                max = max.larger(s);
            }
            let mut sum = T::zero();
            for s in scores.iter_mut() {
                *s = (*s - max).exp_vec();
                sum += *s;
            }
            let or = &mut o[r * hd..(r + 1) * hd];
            for j in 0..seen {
                let p = scores[j] / sum;
                let v = &values[j * hd..(j + 1) * hd];
                for d in 0..hd {
                    or[d] += p * v[d];
                }
            }
        }
    }
}

/// `a · b` over sixteen interleaved partial sums (one AVX-512 register of f32; fixed order).
#[inline(always)]
fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    const L: usize = 16;
    let mut acc = [T::zero(); L];
    let (ac, bc) = (a.chunks_exact(L), b.chunks_exact(L));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        // Fixed-length views: no bounds checks in the lane loop, so it becomes vector ops.
        let (Ok(x), Ok(y)) = (<&[T; L]>::try_from(x), <&[T; L]>::try_from(y)) else {
            continue;
        };
        for l in 0..L {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = T::zero();
    for (&x, &y) in ar.iter().zip(br) {
        tail += x * y;
    }
    for l in 0..L / 2 {
        acc[l] += acc[l + L / 2];
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, D};

    /// The composed ops on one member: `softmax(q·scale · Kᵀ) · V` over its first `seen` keys.
    fn composed(q: &Tensor, k: &Tensor, v: &Tensor, seen: usize, h: Heads, scale: f64) -> Tensor {
        let q = (q.reshape((h.kv_heads, h.rep, h.head_dim)).unwrap() * scale).unwrap();
        let k = k.narrow(1, 0, seen).unwrap();
        let v = v.narrow(1, 0, seen).unwrap();
        let s = q.matmul(&k.t().unwrap()).unwrap();
        let p = candle_nn::ops::softmax(&s, D::Minus1).unwrap();
        p.matmul(&v).unwrap().flatten_all().unwrap()
    }

    /// Against the composed ops in f64 (1e-12) and f32 (1e-5), with grouped-query attention,
    /// members of different lengths and capacities, and queries taken out of order.
    #[test]
    fn matches_the_composed_ops() {
        let h = Heads {
            kv_heads: 2,
            rep: 3,
            head_dim: 20,
        };
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let dev = Device::Cpu;
            let n = 4;
            let q = Tensor::randn(0f32, 1.0, (n, h.kv_heads * h.rep, h.head_dim), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let shapes = [(16, 1), (16, 16), (32, 17), (64, 33)];
            let bufs: Vec<(Tensor, Tensor)> = shapes
                .iter()
                .map(|&(cap, _)| {
                    let t = |s: f64| {
                        (Tensor::randn(0f32, 1.0, (h.kv_heads, cap, h.head_dim), &dev).unwrap() * s)
                            .unwrap()
                            .to_dtype(dtype)
                            .unwrap()
                    };
                    (t(2.0), t(1.0))
                })
                .collect();
            let members: Vec<Member<'_>> = bufs
                .iter()
                .zip(&shapes)
                .map(|((k, v), &(_, seen))| Member { k, v, seen })
                .collect();
            let rows = [2, 0, 3, 1];
            let scale = 1.0 / (h.head_dim as f64).sqrt();
            let out = decode_attention(&q, &rows, &members, h, scale)
                .unwrap()
                .unwrap();
            assert_eq!(out.dims(), &[4, h.kv_heads * h.rep * h.head_dim]);
            for (i, m) in members.iter().enumerate() {
                let want = composed(&q.get(rows[i]).unwrap(), m.k, m.v, m.seen, h, scale);
                let got = out.get(i).unwrap();
                let diff = (got - want)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max(0)
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
                assert!(diff < tol, "{dtype:?} member {i}: max |Δ| {diff}");
            }
        }
    }

    /// A cache that does not hold the positions asked for is an error, not a read past it.
    #[test]
    fn refuses_more_positions_than_the_cache_holds() {
        let h = Heads {
            kv_heads: 1,
            rep: 1,
            head_dim: 4,
        };
        let k = Tensor::zeros((1, 16, 4), DType::F32, &Device::Cpu).unwrap();
        let q = Tensor::zeros((1, 1, 4), DType::F32, &Device::Cpu).unwrap();
        let m = [Member {
            k: &k,
            v: &k,
            seen: 17,
        }];
        assert!(decode_attention(&q, &[0], &m, h, 1.0).is_err());
    }
}
