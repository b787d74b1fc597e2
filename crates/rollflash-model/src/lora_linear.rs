//! The adapted projection of a LoRA training forward as one autograd node.
//!
//! `y = (x·Wᵀ + b) + (scale·(dropout(x)·Aᵀ)·Bᵀ)` composed of candle ops keeps every
//! intermediate alive until the backward pass ends (each node holds its inputs): the base
//! output, the adapter's output and its scaled copy are three extra `[tokens, out]` tensors
//! per projection (and the dropout mask and product two `[tokens, in]` ones). On SmolLM2 at
//! 8 × 128 tokens that is about 1.9 GB, more than LoRA saves by having no base gradients or
//! AdamW state — which is why LoRA used as much memory as full fine-tuning there. As one op
//! the node keeps only its inputs and output; the backward recomputes the rank-`r` product
//! and the dropout mask (cheap: `r` is small, the mask comes from its seed).
//!
//! The forward runs the same CPU matmuls, in the same order, as the composed inference path,
//! so the engine's log-probs still equal the training forward's.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor, WithDType};

/// `(x·Wᵀ + b) + scale·(dropout(x)·Aᵀ)·Bᵀ` for a frozen `W` and `b`; the op's inputs are
/// `x [m, in]` (contiguous), `A [r, in]` and `B [out, r]`, and its backward gives all three
/// gradients. CPU only.
pub(crate) struct LoraLinear {
    /// `[out, in]`, a constant.
    pub(crate) w: Tensor,
    /// `[out]`, a constant.
    pub(crate) bias: Option<Tensor>,
    /// `alpha / r`.
    pub(crate) scale: f64,
    /// Inverted dropout on the adapter's input: `(p, the site's seed)`.
    pub(crate) dropout: Option<(f64, u64)>,
}

fn cpu<'a>(t: &'a Tensor, what: &str) -> candle_core::Result<&'a Tensor> {
    if !t.device().is_cpu() {
        candle_core::bail!("lora_linear: {what} is not on the CPU");
    }
    Ok(t)
}

/// `(y + b) + (delta·scale + 0)`, element by element: exactly the composed ops'
/// `broadcast_add`, `affine` and `add`.
fn combine<T: WithDType + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(
    y: &[T],
    delta: &[T],
    bias: Option<&[T]>,
    scale: f64,
    n: usize,
) -> Vec<T> {
    let (s, zero) = (T::from_f64(scale), T::from_f64(0.0));
    y.chunks(n)
        .zip(delta.chunks(n))
        .flat_map(|(yr, dr)| {
            yr.iter().zip(dr).enumerate().map(move |(j, (&y, &d))| {
                let y = match bias {
                    Some(b) => y + b[j],
                    None => y,
                };
                y + (d * s + zero)
            })
        })
        .collect()
}

/// `x ⊙ mask`, the mask drawn as [`crate::lora::dropout`] draws it.
fn apply_mask<T: WithDType + std::ops::Mul<Output = T>>(x: &[T], p: f64, seed: u64) -> Vec<T> {
    x.iter()
        .zip(crate::lora::dropout_mask(x.len(), p, seed))
        .map(|(&v, m)| v * T::from_f64(m))
        .collect()
}

impl LoraLinear {
    /// [`combine`] over storages of element type `T`; `bias` is contiguous `[n]`.
    fn combine_storage<T>(
        &self,
        y: &CpuStorage,
        delta: &CpuStorage,
        bias: Option<&Tensor>,
        n: usize,
    ) -> candle_core::Result<Vec<T>>
    where
        T: WithDType + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
    {
        let guard = bias.map(Tensor::storage_and_layout);
        let b = match &guard {
            Some((s, l)) => match &**s {
                candle_core::Storage::Cpu(c) => {
                    let o = l.start_offset();
                    Some(&c.as_slice::<T>()?[o..o + n])
                }
                _ => candle_core::bail!("lora_linear: the bias is not on the CPU"),
            },
            None => None,
        };
        Ok(combine(
            y.as_slice::<T>()?,
            delta.as_slice::<T>()?,
            b,
            self.scale,
            n,
        ))
    }
}

impl CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "rollflash-lora-linear"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        a_s: &CpuStorage,
        al: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (m, k) = xl.shape().dims2()?;
        let (n, k_w) = self.w.dims2()?;
        let (r, k_a) = al.shape().dims2()?;
        let (n_b, r_b) = bl.shape().dims2()?;
        if k != k_w || k != k_a || n != n_b || r != r_b {
            candle_core::bail!(
                "lora_linear: x {:?}, W {:?}, A {:?}, B {:?}",
                xl.shape(),
                self.w.shape(),
                al.shape(),
                bl.shape()
            );
        }
        let Some((x0, x1)) = xl.contiguous_offsets() else {
            candle_core::bail!("lora_linear: x must be contiguous");
        };
        let (ws, wl) = cpu(&self.w, "the weight")?.storage_and_layout();
        let candle_core::Storage::Cpu(ws) = &*ws else {
            candle_core::bail!("lora_linear: the weight is not on the CPU");
        };
        let y = xs.matmul(ws, (1, m, n, k), xl, &wl.transpose(0, 1)?)?;
        // The adapter's input: x, or x with dropout (a new contiguous buffer).
        let dropped = match self.dropout {
            Some((p, seed)) if p > 0.0 => Some(match xs {
                CpuStorage::F32(v) => CpuStorage::F32(apply_mask(&v[x0..x1], p, seed)),
                CpuStorage::F64(v) => CpuStorage::F64(apply_mask(&v[x0..x1], p, seed)),
                _ => candle_core::bail!("lora_linear: f32 or f64 only"),
            }),
            _ => None,
        };
        let plain = Layout::contiguous((m, k));
        let (input, il) = match &dropped {
            Some(d) => (d, &plain),
            None => (xs, xl),
        };
        let u = input.matmul(a_s, (1, m, r, k), il, &al.transpose(0, 1)?)?;
        let delta = u.matmul(
            bs,
            (1, m, n, r),
            &Layout::contiguous((m, r)),
            &bl.transpose(0, 1)?,
        )?;
        let bias = match &self.bias {
            Some(b) => Some(cpu(b, "the bias")?.flatten_all()?.contiguous()?),
            None => None,
        };
        let out = match (&y, &delta) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => {
                CpuStorage::F32(self.combine_storage::<f32>(&y, &delta, bias.as_ref(), n)?)
            }
            (CpuStorage::F64(_), CpuStorage::F64(_)) => {
                CpuStorage::F64(self.combine_storage::<f64>(&y, &delta, bias.as_ref(), n)?)
            }
            _ => candle_core::bail!("lora_linear: f32 or f64 inputs of one dtype"),
        };
        Ok((out, Shape::from((m, n))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // With d = dropout's mask (1 without dropout), u = (x⊙d)·Aᵀ and gs = scale·g:
        // ∂B = gsᵀ·u, ∂A = (gs·B)ᵀ·(x⊙d), ∂x = g·W + ((gs·B)·A)⊙d.
        let mask = match self.dropout {
            Some((p, seed)) if p > 0.0 => Some(crate::lora::dropout_mask_tensor(x, p, seed)?),
            _ => None,
        };
        let xd = match &mask {
            Some(m) => (x * m)?,
            None => x.clone(),
        };
        let gs = (grad * self.scale)?;
        let u = xd.matmul(&a.t()?)?;
        let db = gs.t()?.matmul(&u)?;
        let du = gs.matmul(b)?;
        let da = du.t()?.matmul(&xd)?;
        let dxd = du.matmul(a)?;
        let dxd = match &mask {
            Some(m) => (dxd * m)?,
            None => dxd,
        };
        let dx = (grad.matmul(&self.w)? + dxd)?;
        Ok((Some(dx), Some(da), Some(db)))
    }
}
