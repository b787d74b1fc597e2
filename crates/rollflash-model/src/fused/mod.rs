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
//!
//! One kernel family per file (`rms_norm`, `rope`, `swiglu`, `softmax`, `attention`, `logprob`,
//! `head`, `layout`, `frozen_linear`, and `matmul`, the `gemm` products attention and the head
//! share); this module holds what they all use: the element trait [`Real`], the dtype dispatch
//! macro `on_real!`, contiguous views and the row-splitting helpers.

use std::ops::{Add, Div, Mul, Neg, Sub};

use candle_core::Layout;
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

mod attention;
mod frozen_linear;
mod head;
mod layout;
mod logprob;
mod matmul;
mod rms_norm;
mod rope;
mod softmax;
mod swiglu;

pub(crate) use attention::{CausalMask, FusedAttention};
pub(crate) use frozen_linear::FrozenLinear;
pub(crate) use head::HeadLogProbEntropy;
pub(crate) use layout::{FromHeadsFirst, PadMap, ToHeadsFirst};
pub(crate) use logprob::LogProbEntropy;
pub(crate) use rms_norm::RmsNorm;
pub(crate) use rope::Rope;
pub(crate) use softmax::SoftmaxLastDim;
pub(crate) use swiglu::SwiGlu;

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
