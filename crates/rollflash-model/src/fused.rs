//! Fused CPU kernels with hand-written backward passes: RMSNorm, rotary embedding, SwiGLU, the
//! training softmax, causal attention for training (scores, mask, softmax and values in one op
//! that recomputes the probabilities in its backward pass), and the log-prob/entropy of the
//! logits (alone, or with the output layer over blocks of rows).
//!
//! Each is one pass over memory forward and one backward, where the composed candle ops are 3–8
//! passes each way (plus their intermediate tensors). The same forward kernel serves inference and
//! training, so the engine's log-probs and the training forward's agree by construction; the
//! arithmetic per element is the one of candle's inference kernels (`candle_nn::ops::rms_norm`,
//! `rotary_emb::rope`, `silu(gate) * up`), in the same order, except that the exponentials of
//! SwiGLU and of the attention softmax are [`exp_f32`]'s in f32 (within 2 ulp of libm's; a vector
//! loop where `expf` was a call per element) and their rows' sums and maxima run over sixteen
//! lanes. f32 and f64 only (f64 for the finite-difference tests); other dtypes and other devices
//! use the composed ops ([`crate::ops`]).
//!
//! Rows are split over the current rayon pool in fixed blocks, and partial sums (the RMSNorm
//! weight gradient) are added in block order, so results do not depend on the thread count.

use std::ops::{Add, Div, Mul, Neg, Sub};

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

/// Rows per parallel block: large enough to amortise the task, fixed so sums are reproducible.
const BLOCK_ROWS: usize = 64;
/// Below this many elements a kernel runs on the calling thread.
const PAR_MIN: usize = 1 << 15;

/// The element types the kernels support.
pub(crate) trait Real:
    candle_core::WithDType
    + Copy
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + std::iter::Sum
{
    fn sqrt(self) -> Self;
    fn exp(self) -> Self;
    /// `e^self` in plain arithmetic, no libm call, so that a loop of it becomes vector
    /// instructions inside a `pulp` dispatch: [`exp_f32`] for f32, `exp` for f64 (whose
    /// kernels serve the finite-difference tests and stay exact).
    fn exp_vec(self) -> Self;
    fn of_f32(x: f32) -> Self;
    fn larger(self, other: Self) -> Self;
    fn of_usize(x: usize) -> Self;
    fn unit() -> Self;
}

impl Real for f32 {
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
    #[inline(always)]
    fn exp_vec(self) -> Self {
        exp_f32(self)
    }
    fn of_f32(x: f32) -> Self {
        x
    }
    fn larger(self, other: Self) -> Self {
        f32::max(self, other)
    }
    fn of_usize(x: usize) -> Self {
        x as f32
    }
    fn unit() -> Self {
        1.0
    }
}

impl Real for f64 {
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline(always)]
    fn exp_vec(self) -> Self {
        f64::exp(self)
    }
    fn of_f32(x: f32) -> Self {
        x as f64
    }
    fn larger(self, other: Self) -> Self {
        f64::max(self, other)
    }
    fn of_usize(x: usize) -> Self {
        x as f64
    }
    fn unit() -> Self {
        1.0
    }
}

/// `e^x` for f32 with the Cephes `expf` method: `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2` (ln 2
/// split in two parts, Cody–Waite), a degree-7 polynomial for `e^r`, and `2^n` put into the
/// exponent bits. Within 2 ulp of libm's `expf` for `x` in [−87.3, 88.7] (the unit test sweeps
/// it), +∞ above; below, about the smallest normal number instead of a denormal or 0 — nothing
/// a softmax can tell apart — and a NaN stays NaN. Plain arithmetic (rounding by
/// `round_ties_even`, one instruction from SSE4.1 on) so loops of it vectorise.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Comparisons, not `max`/`min`, so that a NaN passes through.
    let x = if x < -87.336_54 { -87.336_54 } else { x };
    // Past ln(f32::MAX) ≈ 88.72 the result overflows to +∞, as `expf`'s does.
    let x = if x > 89.0 { 89.0 } else { x };
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * (r * r) + r + 1.0;
    // 2^n as two factors 2^⌊n/2⌋ · 2^⌈n/2⌉, each a normal number for n ∈ [−126, 128]: at the
    // top (n = 128, x > 127.5 ln 2) 2^n alone would already be +∞ although e^x is not. Each
    // factor's exponent bits come from adding 1.5·2²³ (the sum's low mantissa bits are then
    // the integer k + 127) and shifting them into place: float arithmetic that vectorises,
    // where `as i32` is a saturating conversion compiled one element at a time.
    let pow2 = |k: f32| f32::from_bits((k + (12_582_912.0 + 127.0)).to_bits() << 23);
    let half = (n * 0.5).floor();
    e * pow2(half) * pow2(n - half)
}

/// `Σ xs` over sixteen interleaved partial sums (one AVX-512 register of f32; a fixed order, so
/// reproducible), which vectorises where a running sum waits on each add.
#[inline(always)]
fn sum_lanes<T: Real>(xs: &[T]) -> T {
    const L: usize = 16;
    let mut acc = [T::zero(); L];
    let chunks = xs.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        // A fixed-length view: no bounds checks in the lane loop.
        let Ok(c) = <&[T; L]>::try_from(c) else {
            continue;
        };
        for l in 0..L {
            acc[l] += c[l];
        }
    }
    let mut total = T::zero();
    for (l, &a) in acc.iter().enumerate() {
        total += a + rest.get(l).copied().unwrap_or(T::zero());
    }
    total
}

/// The largest of `xs` (not empty) over sixteen interleaved partial maxima, which vectorises
/// where a running maximum waits on each comparison; the same value as a left-to-right scan.
#[inline(always)]
fn max_lanes<T: Real>(xs: &[T]) -> T {
    const L: usize = 16;
    let first = xs[0];
    let mut acc = [first; L];
    let chunks = xs.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        let Ok(c) = <&[T; L]>::try_from(c) else {
            continue;
        };
        for l in 0..L {
            acc[l] = acc[l].larger(c[l]);
        }
    }
    let mut m = first;
    for &a in acc.iter().chain(rest) {
        m = m.larger(a);
    }
    m
}

pub(crate) fn contiguous<'a, T>(
    data: &'a [T],
    layout: &Layout,
    what: &str,
) -> candle_core::Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("{what}: input must be contiguous"),
    }
}

/// Dispatches a CPU kernel on its inputs' element type, f32 or f64 and the same for all:
/// `on_real!(what, [(x, s1, l1), (w, s2, l2)], body)` binds each name to the contiguous slice of
/// its storage and layout, evaluates `body` (a `Vec` of that element type; compiled once per
/// type) and wraps it in the storage of that type. Other dtypes are an error naming `what`.
macro_rules! on_real {
    ($what:expr, [$(($name:ident, $s:expr, $l:expr)),+ $(,)?], $body:expr) => {{
        let what = $what;
        match ($($s,)+) {
            ($(CpuStorage::F32($name),)+) => {
                $(let $name = contiguous($name, $l, what)?;)+
                CpuStorage::F32($body)
            }
            ($(CpuStorage::F64($name),)+) => {
                $(let $name = contiguous($name, $l, what)?;)+
                CpuStorage::F64($body)
            }
            _ => candle_core::bail!("{what}: f32 or f64 inputs of one dtype"),
        }
    }};
}

/// [`contiguous`] for a tensor an in-place op writes.
pub(crate) fn contiguous_mut<'a, T>(
    data: &'a mut [T],
    layout: &Layout,
    what: &str,
) -> candle_core::Result<&'a mut [T]> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&mut data[a..b]),
        None => candle_core::bail!("{what}: input must be contiguous"),
    }
}

fn last_dim(layout: &Layout) -> usize {
    layout.shape().dims().last().copied().unwrap_or(1)
}

/// `Σ terms` in f64 over four interleaved partial sums (fixed order: reproducible): a single
/// running sum waits on each add's latency, which made the backward passes' dot products slow.
fn dot_f64(terms: impl Iterator<Item = f64>) -> f64 {
    let mut acc = [0f64; 4];
    for (i, t) in terms.enumerate() {
        acc[i % 4] += t;
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// Runs `f(block_index, rows_in, rows_out)` over blocks of `BLOCK_ROWS` rows of `d` elements,
/// in parallel when there is enough work.
fn for_blocks<T: Real, R: Send>(
    src: &[T],
    dst: &mut [T],
    d: usize,
    f: impl Fn(&[T], &mut [T]) -> R + Sync + Send,
) -> Vec<R> {
    let step = BLOCK_ROWS * d.max(1);
    if src.len() < PAR_MIN {
        src.chunks(step)
            .zip(dst.chunks_mut(step))
            .map(|(s, o)| f(s, o))
            .collect()
    } else {
        src.par_chunks(step)
            .zip(dst.par_chunks_mut(step))
            .map(|(s, o)| f(s, o))
            .collect()
    }
}

/// Runs `work((i, chunk))` on each `step`-element chunk of `out`: over the current rayon pool
/// when the kernel reads at least `PAR_MIN` elements (`work_len`), else on this thread.
fn each_chunk<T: Send>(
    out: &mut [T],
    step: usize,
    work_len: usize,
    work: impl Fn((usize, &mut [T])) + Sync + Send,
) {
    if work_len < PAR_MIN {
        out.chunks_mut(step).enumerate().for_each(work);
    } else {
        out.par_chunks_mut(step).enumerate().for_each(work);
    }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

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

// ---------------------------------------------------------------------------------------------
// Rotary embedding

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

// ---------------------------------------------------------------------------------------------
// SwiGLU

/// `silu(gate) · up` with `silu(v) = v / (1 + e^{−v})` (candle's formula; `e^{−v}` from
/// [`Real::exp_vec`], so within 2 ulp of candle's in f32 and the loop vectorises). The engine and
/// the training forward share this kernel, so their results agree exactly. Backward: `∂/∂up = g ·
/// silu(gate)`, `∂/∂gate = g · up · σ(gate) (1 + gate (1 − σ(gate)))`.
pub(crate) struct SwiGlu;

#[inline(always)]
fn silu<T: Real>(v: T) -> T {
    v / (T::unit() + (-v).exp_vec())
}

impl SwiGlu {
    fn fwd<T: Real>(gate: &[T], up: &[T]) -> Vec<T> {
        let mut out = vec![T::zero(); gate.len()];
        let arch = pulp::Arch::new();
        let work = |((o, g), u): ((&mut [T], &[T]), &[T])| {
            arch.dispatch(SiluMul { o, g, u });
        };
        let c = ELEMS_PER_TASK;
        if gate.len() < PAR_MIN {
            work(((&mut out, gate), up));
        } else {
            out.par_chunks_mut(c)
                .zip(gate.par_chunks(c))
                .zip(up.par_chunks(c))
                .for_each(work);
        }
        out
    }
}

/// Elements per parallel task of the elementwise kernels.
const ELEMS_PER_TASK: usize = 1 << 14;

/// `o = silu(g) · u`, compiled per instruction set inside `pulp`'s dispatch (with
/// [`Real::exp_vec`], so the loop is vector instructions).
struct SiluMul<'a, T> {
    o: &'a mut [T],
    g: &'a [T],
    u: &'a [T],
}

impl<T: Real> pulp::WithSimd for SiluMul<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        for ((o, &g), &u) in self.o.iter_mut().zip(self.g).zip(self.u) {
            *o = silu(g) * u;
        }
    }
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "rollflash-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if l1.shape() != l2.shape() {
            candle_core::bail!("swiglu: gate {:?} but up {:?}", l1.shape(), l2.shape());
        }
        let out = on_real!("swiglu", [(g, s1, l1), (u, s2, l2)], Self::fwd(g, u));
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let n = gate.elem_count();
        let both = gate.contiguous()?.apply_op3_no_bwd(
            &up.contiguous()?,
            &grad.contiguous()?,
            &SwiGluBwd,
        )?;
        let dg = both.narrow(0, 0, n)?.reshape(gate.shape())?;
        let du = both.narrow(0, n, n)?.reshape(up.shape())?;
        Ok((Some(dg), Some(du)))
    }
}

/// One task of [`SwiGluBwd`]: the two gradient slices, then `((gate, up), g)`.
type SwiGluBwdItem<'a, T> = ((&'a mut [T], &'a mut [T]), ((&'a [T], &'a [T]), &'a [T]));

/// The backward of [`SwiGlu`]: `(gate, up, g) → [2n]`, the gate gradient then the up gradient.
struct SwiGluBwd;

impl SwiGluBwd {
    fn run<T: Real>(gate: &[T], up: &[T], g: &[T]) -> Vec<T> {
        let n = gate.len();
        let mut out = vec![T::zero(); 2 * n];
        let (dg, du) = out.split_at_mut(n);
        let arch = pulp::Arch::new();
        let work = |((dg, du), ((x, u), g)): SwiGluBwdItem<'_, T>| {
            arch.dispatch(SiluMulBwd { dg, du, x, u, g });
        };
        let c = ELEMS_PER_TASK;
        if n < PAR_MIN {
            work(((dg, du), ((gate, up), g)));
        } else {
            dg.par_chunks_mut(c)
                .zip(du.par_chunks_mut(c))
                .zip(
                    gate.par_chunks(c)
                        .zip(up.par_chunks(c))
                        .zip(g.par_chunks(c)),
                )
                .for_each(work);
        }
        out
    }
}

/// The gradients of `silu(x) · u` for upstream `g`, with `s = σ(x)`: `du = g · x · s`,
/// `dx = g · u · s · (1 + x (1 − s))`; compiled like [`SiluMul`].
struct SiluMulBwd<'a, T> {
    dg: &'a mut [T],
    du: &'a mut [T],
    x: &'a [T],
    u: &'a [T],
    g: &'a [T],
}

impl<T: Real> pulp::WithSimd for SiluMulBwd<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let inputs = self.x.iter().zip(self.u).zip(self.g);
        for ((dg, du), ((&x, &u), &gr)) in self.dg.iter_mut().zip(self.du.iter_mut()).zip(inputs) {
            let s = T::unit() / (T::unit() + (-x).exp_vec());
            *du = gr * x * s;
            *dg = gr * u * s * (T::unit() + x * (T::unit() - s));
        }
    }
}

impl CustomOp3 for SwiGluBwd {
    fn name(&self) -> &'static str {
        "rollflash-swiglu-bwd"
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
        let n = l1.shape().elem_count();
        let what = "swiglu backward";
        let out = on_real!(
            what,
            [(a, s1, l1), (b, s2, l2), (c, s3, l3)],
            Self::run(a, b, c)
        );
        Ok((out, (2 * n).into()))
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax

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

// ---------------------------------------------------------------------------------------------
// Attention: scores, scale, causal mask, softmax and the weighted sum of values in one kernel

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
/// entries, their sum in `T`, the division ([`SoftmaxLastDim`]) — with the `exp` of
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

/// A read-only strided matrix for [`matmul_into`]: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
struct MatRef<'a, T> {
    /// The elements, from `(0, 0)`.
    data: &'a [T],
    /// Rows.
    rows: usize,
    /// Columns.
    cols: usize,
    /// Distance between rows.
    rs: usize,
    /// Distance between columns.
    cs: usize,
}

impl<T> MatRef<'_, T> {
    /// Whether every element lies inside `data`.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `dst = lhs · rhs`, or `dst += lhs · rhs` with `accumulate`, where `dst` is row-major with
/// rows `dst_rs` apart: the `gemm` crate (candle's own CPU matmul engine) on the calling thread.
/// The attention kernel's products are small (a block of query rows against one head's keys)
/// and run inside rayon tasks already, so one more level of threads would only add overhead.
/// The one `unsafe` of the kernels, behind bounds checks: `gemm` takes raw pointers.
fn matmul_into<T: Real>(
    dst: &mut [T],
    dst_rs: usize,
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    accumulate: bool,
) -> candle_core::Result<()> {
    matmul_into_on(dst, dst_rs, lhs, rhs, accumulate, gemm::Parallelism::None)
}

/// [`matmul_into`] with gemm's own threading (`Parallelism::Rayon` splits the product over the
/// current rayon pool), for products large enough to share.
#[allow(unsafe_code)]
fn matmul_into_on<T: Real>(
    dst: &mut [T],
    dst_rs: usize,
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) -> candle_core::Result<()> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    let dst_fits = m == 0 || n == 0 || (dst_rs >= n && (m - 1) * dst_rs + n <= dst.len());
    if rhs.rows != k || !lhs.fits() || !rhs.fits() || !dst_fits {
        candle_core::bail!(
            "attention: a {m}×{k} by {}×{n} product out of bounds",
            rhs.rows
        );
    }
    if m == 0 || n == 0 || k == 0 {
        if !accumulate {
            for row in dst.chunks_mut(dst_rs.max(1)).take(m) {
                row[..n].fill(T::zero());
            }
        }
        return Ok(());
    }
    let stride = |s: usize| -> candle_core::Result<isize> {
        isize::try_from(s).map_err(|_| candle_core::Error::Msg("attention: stride overflow".into()))
    };
    let (dst_rs, lhs_rs, lhs_cs, rhs_rs, rhs_cs) = (
        stride(dst_rs)?,
        stride(lhs.rs)?,
        stride(lhs.cs)?,
        stride(rhs.rs)?,
        stride(rhs.cs)?,
    );
    // SAFETY: the checks above put every element gemm reads (`lhs (i, p)` for i < m, p < k;
    // `rhs (p, j)` for p < k, j < n) and writes (`dst[i * dst_rs + j]`, j < n ≤ dst_rs, so no
    // two coincide) inside its slice; `dst` is borrowed mutably, so it aliases neither input;
    // gemm returns only when the product is done (on this thread, or on the rayon pool it
    // joins), within the borrows; `T` is f32 or f64 ([`Real`]), types gemm implements.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs,
            accumulate,
            lhs.data.as_ptr(),
            lhs_cs,
            lhs_rs,
            rhs.data.as_ptr(),
            rhs_cs,
            rhs_rs,
            T::unit(),
            T::unit(),
            false,
            false,
            false,
            parallelism,
        );
    }
    Ok(())
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
/// `rep` query heads of a kv group one after the other, as [`ToHeadsFirst`] lays them out) and
/// `k, v [.., keys, hd]` (the same leading dimensions, one kv head each). Output: `[.., rows,
/// hd]` like `q`.
///
/// The composed ops (`q · kᵀ`, the masked softmax, `· v`) keep the raw scores and the probabilities
/// — two `[rows, keys]` tensors per kv head and layer — alive until the backward pass ends; this op
/// keeps only its inputs and output and recomputes the probabilities in the backward pass
/// (flash-attention style; [`FusedAttentionBwd`]). Its per-row arithmetic is the composed training
/// ops': the scores from gemm, then [`causal_softmax_row`], then gemm, so the two agree to rounding
/// (the sums' order, and [`exp_f32`]'s 2 ulp in f32). Work is split by query head (and, in the
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

// ---------------------------------------------------------------------------------------------
// Log-prob of the target and entropy per row of the logits

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
const LPE_COLS: usize = 4;

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
fn lpe_row_stats<T: Real>(row: &[T], target: usize, inv_t: T, o: &mut [T]) {
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
fn lpe_grad<T: Real>(x: T, st: &[T], g_lp: T, g_ent: T, inv_t: T) -> T {
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

// ---------------------------------------------------------------------------------------------
// The output layer and the log-prob/entropy together, in blocks of rows

/// Rows per block of [`HeadLogProbEntropy`]: its scratch is `rows × vocab` (SmolLM2: 48 MiB in
/// f32), against the whole `[tokens, vocab]` logits and their gradient the composed head keeps.
const HEAD_ROWS: usize = 256;

/// [`LogProbEntropy`] of `h · Wᵀ` for hidden states `h [n, d]` and the output layer `W [V, d]`,
/// computing the logits one block of [`HEAD_ROWS`] rows at a time: forward the block's row
/// statistics, backward the block's logits again (one more output-layer product), their
/// gradient in place, then `∂h = G · W` for the block and `∂W += Gᵀ · h` over the blocks in
/// order (reproducible). Neither the `[n, V]` logits nor their gradient is ever whole, which is
/// what a training step's peak memory on a large vocabulary was made of. Same statistics and
/// same row arithmetic as [`LogProbEntropy`] on the logits `x · Wᵀ`; the products are gemm's.
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

// ---------------------------------------------------------------------------------------------
// Packed rows ⇄ a padded, heads-first batch (attention of independent sequences)

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

/// `x · Wᵀ` for a frozen `W` (LoRA's base projections): the same CPU matmul as
/// `x.matmul(&w.t())`, so inference and training agree bit for bit, but its backward returns
/// only the input's gradient `g · W`. candle's `Matmul` backward always forms the right-hand
/// side's gradient too (`xᵀ · g`, one weight-sized tensor per projection, kept to the end of
/// the backward pass) even when nothing asks for it, which would cost a frozen base as much
/// time and memory as training it.
pub(crate) struct FrozenLinear {
    /// `[out, in]`, not a variable.
    pub(crate) w: Tensor,
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "rollflash-frozen-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        let (m, k) = l.shape().dims2()?;
        let (n, k_w) = self.w.dims2()?;
        if k != k_w {
            candle_core::bail!("frozen_linear: input of {k} features, weight takes {k_w}");
        }
        let (ws, wl) = self.w.storage_and_layout();
        let candle_core::Storage::Cpu(ws) = &*ws else {
            candle_core::bail!("frozen_linear: the weight is not on the CPU");
        };
        let out = s.matmul(ws, (1, m, n, k), l, &wl.transpose(0, 1)?)?;
        Ok((out, Shape::from((m, n))))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.matmul(&self.w)?))
    }
}

#[cfg(test)]
mod tests {
    use super::exp_f32;

    /// [`exp_f32`] against the f64 `exp` rounded to f32, over its whole range in steps of
    /// 2⁻¹⁰ plus the edges: within 2 ulp everywhere (the bound its doc states), NaN kept.
    #[test]
    fn exp_f32_is_within_two_ulp() {
        let ulps = |x: f32| -> i64 {
            let want = (x as f64).exp() as f32;
            (exp_f32(x).to_bits() as i64 - want.to_bits() as i64).abs()
        };
        let mut worst = (0, 0.0f32);
        let mut x = -87.3f32;
        while x < 88.72 {
            let u = ulps(x);
            if u > worst.0 {
                worst = (u, x);
            }
            x += 1.0 / 1024.0;
        }
        for x in [0.0, -0.0, 1e-8, -1e-8, 1.0, -1.0, 88.0, -87.0] {
            let u = ulps(x);
            if u > worst.0 {
                worst = (u, x);
            }
        }
        assert!(worst.0 <= 2, "{} ulp at x = {}", worst.0, worst.1);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(88.8), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NEG_INFINITY) > 0.0 && exp_f32(f32::NEG_INFINITY) < 1.2e-38);
        assert_eq!(exp_f32(0.0), 1.0);
    }
}
