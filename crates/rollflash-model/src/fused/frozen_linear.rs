//! `x · Wᵀ` for a frozen `W`, whose backward forms only the input's gradient.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};

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
