//! SwiGLU (`silu(gate) · up`): the vectorised forward and backward kernels.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::{contiguous, Real, PAR_MIN};

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
