//! The few tensor ops whose fused candle versions record no backward pass, each in two forms:
//! a differentiable composition for training and the fused kernel for inference.
//!
//! candle-nn's `ops::rms_norm`, `ops::softmax_last_dim` and `rotary_emb::rope` are fast but are
//! invisible to autograd, so a training forward built on them silently stops gradients. Every
//! function here takes `fused`: callers pass `true` only when no gradient is wanted.
//!
//! On the CPU in f32/f64, RMSNorm, rotary and SwiGLU run [`crate::fused`]'s kernels (with their
//! own backward passes) for inference and training alike; on other devices and dtypes (CUDA,
//! bf16) they fall back to candle's kernels for inference and the composed ops for training,
//! which candle runs on every device. The softmax and the log-prob/entropy op do the same.

use candle_core::{DType, Tensor, D};

use crate::Result;

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * w`.
/// On the CPU (f32, f64) both inference and training use [`crate::fused::RmsNorm`], one kernel
/// with a hand-written backward pass.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64, fused: bool) -> Result<Tensor> {
    if on_cpu_kernels(x) {
        return Ok(x
            .contiguous()?
            .apply_op2(&w.contiguous()?, crate::fused::RmsNorm { eps: eps as f32 })?);
    }
    rms_norm_composed(x, w, eps, fused)
}

/// Whether candle-nn's fused inference kernels take this tensor: f32 anywhere; on CUDA also
/// bf16 and f16 (its CUDA kernels accumulate in f32).
fn candle_kernel_takes(x: &Tensor) -> bool {
    x.dtype() == DType::F32
        || (x.device().is_cuda() && matches!(x.dtype(), DType::BF16 | DType::F16))
}

/// `x` in f32 when it is a half-precision tensor (for sums that must not round at 8 bits).
fn widened(x: &Tensor) -> Result<Tensor> {
    Ok(match x.dtype() {
        DType::BF16 | DType::F16 => x.to_dtype(DType::F32)?,
        _ => x.clone(),
    })
}

/// Whether the fused CPU kernels of [`crate::fused`] take this tensor.
pub(crate) fn on_cpu_kernels(x: &Tensor) -> bool {
    x.device().is_cpu() && matches!(x.dtype(), DType::F32 | DType::F64)
}

/// RMSNorm from candle's ops: its fused kernel (no backward) or differentiable ops (any
/// device; the reference in tests).
pub(crate) fn rms_norm_composed(x: &Tensor, w: &Tensor, eps: f64, fused: bool) -> Result<Tensor> {
    if fused && candle_kernel_takes(x) {
        return Ok(candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32)?);
    }
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ms + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?.broadcast_mul(w)?)
}

/// Softmax over the last dimension. Inference uses candle's kernel; training on the CPU uses
/// [`crate::fused::SoftmaxLastDim`] (the same arithmetic), one pass forward and one,
/// `y ⊙ (g − Σ g⊙y)`, backward, instead of five ops and their backward passes over the
/// attention scores.
pub(crate) fn softmax_last_dim(x: &Tensor, fused: bool) -> Result<Tensor> {
    if fused && candle_kernel_takes(x) {
        return Ok(candle_nn::ops::softmax_last_dim(&x.contiguous()?)?);
    }
    if x.device().is_cpu() && matches!(x.dtype(), DType::F32 | DType::F64) {
        return Ok(x.contiguous()?.apply_op1(crate::fused::SoftmaxLastDim)?);
    }
    // Half precision: the exponentials and their sum in f32, the result cast back.
    Ok(softmax_last_dim_composed(&widened(x)?)?.to_dtype(x.dtype())?)
}

/// Softmax from differentiable candle ops (any device; the reference in tests).
pub(crate) fn softmax_last_dim_composed(x: &Tensor) -> Result<Tensor> {
    // The max is a constant shift: softmax is invariant to it, so detaching it is exact and
    // keeps the backward graph small.
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}

/// Log-softmax over the last dimension (always differentiable; used for log-probs).
pub(crate) fn log_softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(shifted.broadcast_sub(&lse)?)
}

/// Rotary embedding in the Hugging Face "rotate half" layout.
///
/// `x` is `[n, heads, head_dim]` (one row per token of a packed batch), `cos`/`sin` are
/// `[n, head_dim / 2]` for each row's own position, so tokens of different sequences at
/// different positions are rotated in one call.
///
/// On the CPU (f32, f64) both inference and training use [`crate::fused::Rope`].
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, fused: bool) -> Result<Tensor> {
    if on_cpu_kernels(x) {
        return Ok(x.contiguous()?.apply_op3(
            &cos.contiguous()?,
            &sin.contiguous()?,
            crate::fused::Rope,
        )?);
    }
    rope_composed(x, cos, sin, fused)
}

/// Rotary embedding from candle's ops (any device; the reference in tests).
pub(crate) fn rope_composed(x: &Tensor, cos: &Tensor, sin: &Tensor, fused: bool) -> Result<Tensor> {
    let (n, heads, hd) = x.dims3()?;
    if fused && candle_kernel_takes(x) {
        // candle's kernel wants [b, h, t, d] with per-batch tables [b, t, d/2]: use b = n, t = 1.
        let x4 = x.reshape((n, heads, 1, hd))?;
        let c = cos.reshape((n, 1, hd / 2))?;
        let s = sin.reshape((n, 1, hd / 2))?;
        let y = candle_nn::rotary_emb::rope(&x4.contiguous()?, &c.contiguous()?, &s.contiguous()?)?;
        return Ok(y.reshape((n, heads, hd))?);
    }
    let half = hd / 2;
    let cos = Tensor::cat(&[cos, cos], D::Minus1)?.unsqueeze(1)?;
    let sin = Tensor::cat(&[sin, sin], D::Minus1)?.unsqueeze(1)?;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?)?)
}

/// SwiGLU's activation: `silu(gate) * up`; on the CPU (f32, f64) one kernel,
/// [`crate::fused::SwiGlu`], elsewhere candle's `silu` and a multiply.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if on_cpu_kernels(gate) {
        return Ok(gate
            .contiguous()?
            .apply_op2(&up.contiguous()?, crate::fused::SwiGlu)?);
    }
    swiglu_composed(gate, up)
}

/// SwiGLU from candle's ops (any device; the reference in tests).
pub(crate) fn swiglu_composed(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    Ok((gate.silu()? * up)?)
}

/// Per row of `logits [n, V]`: the log-prob of `targets[row]` and the entropy of
/// `softmax(logits / temperature)`, as `[n, 2]`, with a hand-written backward pass.
///
/// The composed version (divide, max, subtract, exp, sum, log, gather, multiply, sum) keeps
/// half a dozen `[n, V]` tensors alive for the backward pass — 400 MB each for 2 048 tokens of
/// a 49 k vocabulary — and walks them a dozen times. On the CPU (f32, f64) this is
/// [`crate::fused::LogProbEntropy`]: one pass over the logits forward and one backward.
pub(crate) fn logprob_entropy(
    logits: &Tensor,
    targets: Vec<u32>,
    temperature: f64,
) -> Result<Tensor> {
    let logits = logits.contiguous()?;
    if !on_cpu_kernels(&logits) {
        // Other devices and dtypes: the composed ops, in f32 for half-precision logits
        // (log-probs, entropy and the loss built on them are f32; the gradient is cast back by
        // `to_dtype`).
        return logprob_entropy_composed(&widened(&logits)?, &targets, temperature);
    }
    let stats = logits.apply_op1(crate::fused::LogProbEntropy {
        targets: std::sync::Arc::new(targets),
        temperature,
    })?;
    // Columns 2 and 3 are what the backward pass reads back (the row's max and log-sum).
    Ok(stats.narrow(1, 0, 2)?)
}

/// The same quantity from differentiable candle ops (any device; the reference in tests).
pub(crate) fn logprob_entropy_composed(
    logits: &Tensor,
    targets: &[u32],
    temperature: f64,
) -> Result<Tensor> {
    let n = targets.len();
    let z = (logits / temperature)?;
    let logp = log_softmax_last_dim(&z)?;
    let tgt = Tensor::from_vec(targets.to_vec(), (n, 1), logits.device())?;
    let lp = logp.gather(&tgt, 1)?;
    let ent = (logp.exp()? * &logp)?.sum_keepdim(1)?.neg()?;
    Ok(Tensor::cat(&[&lp, &ent], 1)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Runs `op` and `reference` on the same f64 input, back-propagates `Σ y ⊙ weight` through
    /// each, and checks that outputs and input gradients agree within `tol`.
    fn check_against_composed(
        data: &[f64],
        shape: (usize, usize),
        weight: &Tensor,
        tol: f64,
        op: impl Fn(&Tensor) -> Tensor,
        reference: impl Fn(&Tensor) -> Tensor,
    ) {
        let run = |f: &dyn Fn(&Tensor) -> Tensor| {
            let x =
                Var::from_tensor(&Tensor::from_vec(data.to_vec(), shape, &Device::Cpu).unwrap())
                    .unwrap();
            let y = f(x.as_tensor());
            let grads = (&y * weight)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
            let mut all = flat(&y);
            all.extend(flat(grads.get(x.as_tensor()).unwrap()));
            all
        };
        for (a, b) in run(&op).iter().zip(&run(&reference)) {
            assert!((a - b).abs() < tol, "{a} vs {b}");
        }
    }

    /// Several inputs: runs `op` and `reference`, back-propagates `Σ y ⊙ weight`, and compares
    /// the outputs and the gradients of the inputs marked `true` (the others are constants).
    fn check_many(
        inputs: &[(Vec<f64>, Vec<usize>, bool)],
        tol: f64,
        op: impl Fn(&[Tensor]) -> Tensor,
        reference: impl Fn(&[Tensor]) -> Tensor,
    ) {
        let run = |f: &dyn Fn(&[Tensor]) -> Tensor| {
            let vars: Vec<Var> = inputs
                .iter()
                .map(|(d, s, _)| {
                    Var::from_tensor(&Tensor::from_vec(d.clone(), s.clone(), &Device::Cpu).unwrap())
                        .unwrap()
                })
                .collect();
            let ts: Vec<Tensor> = vars
                .iter()
                .zip(inputs)
                .map(|(v, (_, _, grad))| {
                    if *grad {
                        v.as_tensor().clone()
                    } else {
                        v.as_tensor().detach()
                    }
                })
                .collect();
            let y = f(&ts);
            let n = y.elem_count();
            let w: Vec<f64> = (0..n).map(|i| ((i * 13 % 7) as f64 - 3.0) / 2.0).collect();
            let w = Tensor::from_vec(w, y.shape(), &Device::Cpu).unwrap();
            let grads = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
            let mut all = flat(&y);
            for (v, (_, _, grad)) in vars.iter().zip(inputs) {
                if *grad {
                    all.extend(flat(grads.get(v.as_tensor()).unwrap()));
                }
            }
            all
        };
        let (a, b) = (run(&op), run(&reference));
        assert_eq!(a.len(), b.len());
        for (a, b) in a.iter().zip(&b) {
            assert!((a - b).abs() < tol, "{a} vs {b}");
        }
    }

    /// Every element of `t`, as f64.
    fn flat_f64(t: &Tensor) -> Vec<f64> {
        t.to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    }

    fn data(n: usize, seed: usize) -> Vec<f64> {
        (0..n)
            .map(|i| (((i + seed) * 37 % 23) as f64 - 11.0) / 7.0)
            .collect()
    }

    /// The fused RMSNorm and the composed one agree on values and on the gradients of the input
    /// and the weight (f64, 1e-12), for 2-D rows and for per-head rows (`[n, heads, d]`).
    #[test]
    fn fused_rms_norm_matches_composed() {
        for shape in [vec![5, 8], vec![3, 2, 4], vec![200, 6, 32]] {
            let d = *shape.last().unwrap();
            let n: usize = shape.iter().product();
            check_many(
                &[
                    (data(n, 1), shape.clone(), true),
                    (data(d, 5), vec![d], true),
                ],
                1e-12,
                |t| rms_norm(&t[0], &t[1], 1e-6, false).unwrap(),
                |t| rms_norm_composed(&t[0], &t[1], 1e-6, false).unwrap(),
            );
        }
    }

    /// The fused rotary embedding and the composed one agree (f64, 1e-12), values and the
    /// input's gradient (the tables are constants).
    #[test]
    fn fused_rope_matches_composed() {
        for (n, heads, hd) in [(4, 2, 8), (300, 3, 16)] {
            let angles = |f: fn(f64) -> f64| -> Vec<f64> {
                (0..n * hd / 2).map(|i| f(i as f64 * 0.173)).collect()
            };
            check_many(
                &[
                    (data(n * heads * hd, 3), vec![n, heads, hd], true),
                    (angles(f64::cos), vec![n, hd / 2], false),
                    (angles(f64::sin), vec![n, hd / 2], false),
                ],
                1e-12,
                |t| rope(&t[0], &t[1], &t[2], false).unwrap(),
                |t| rope_composed(&t[0], &t[1], &t[2], false).unwrap(),
            );
        }
    }

    /// The fused SwiGLU and `silu(gate) * up` agree (f64, 1e-12), values and both gradients.
    #[test]
    fn fused_swiglu_matches_composed() {
        for shape in [vec![3, 5], vec![100, 512]] {
            let n: usize = shape.iter().product();
            check_many(
                &[
                    (data(n, 2), shape.clone(), true),
                    (data(n, 9), shape.clone(), true),
                ],
                1e-12,
                |t| swiglu(&t[0], &t[1]).unwrap(),
                |t| swiglu_composed(&t[0], &t[1]).unwrap(),
            );
        }
    }

    /// In f32 the fused RMSNorm and rotary give exactly what candle's inference kernels give
    /// (same arithmetic in the same order); SwiGLU differs only by its vectorised `exp` (within
    /// 2 ulp of libm's), so within 4 ulp of `silu(gate) * up` here.
    #[test]
    fn fused_kernels_equal_candles_inference_kernels_in_f32() {
        let t = |n: usize, shape: &[usize], seed: usize| {
            let v: Vec<f32> = data(n, seed).into_iter().map(|x| x as f32).collect();
            Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
        };
        let same = |a: Tensor, b: Tensor| {
            let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(a, b);
        };
        let x = t(40 * 3 * 8, &[40, 3, 8], 1);
        let w = t(8, &[8], 2);
        same(
            rms_norm(&x, &w, 1e-6, true).unwrap(),
            rms_norm_composed(&x, &w, 1e-6, true).unwrap(),
        );
        let ang: Vec<f32> = (0..40 * 4).map(|i| i as f32 * 0.3).collect();
        let cos = Tensor::from_vec(
            ang.iter().map(|a| a.cos()).collect::<Vec<_>>(),
            (40, 4),
            &Device::Cpu,
        )
        .unwrap();
        let sin = Tensor::from_vec(
            ang.iter().map(|a| a.sin()).collect::<Vec<_>>(),
            (40, 4),
            &Device::Cpu,
        )
        .unwrap();
        same(
            rope(&x, &cos, &sin, true).unwrap(),
            rope_composed(&x, &cos, &sin, true).unwrap(),
        );
        let g = t(300, &[30, 10], 3);
        let u = t(300, &[30, 10], 4);
        let fused = swiglu(&g, &u).unwrap().to_vec2::<f32>().unwrap();
        let candle = swiglu_composed(&g, &u).unwrap().to_vec2::<f32>().unwrap();
        for (a, b) in fused.iter().flatten().zip(candle.iter().flatten()) {
            let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
            assert!(ulps <= 4, "{a} vs {b}: {ulps} ulp");
        }
    }

    /// The training softmax and the composed one agree on values and gradients (f64, 1e-12),
    /// including rows with −∞ entries (masked attention).
    #[test]
    fn training_softmax_matches_composed() {
        let mut data: Vec<f64> = (0..4 * 6)
            .map(|i| ((i * 29 % 17) as f64 - 8.0) / 2.0)
            .collect();
        data[5] = f64::NEG_INFINITY;
        data[10] = f64::NEG_INFINITY;
        let w: Vec<f64> = (0..24).map(|i| (i as f64 * 0.37).sin()).collect();
        let w = Tensor::from_vec(w, (4, 6), &Device::Cpu).unwrap();
        check_against_composed(
            &data,
            (4, 6),
            &w,
            1e-12,
            |x| softmax_last_dim(x, false).unwrap(),
            |x| softmax_last_dim_composed(x).unwrap(),
        );
    }

    /// One attention case: (batch, kv groups, rep, queries, keys, past, lens, head dim).
    type AttnCase = (usize, usize, usize, usize, usize, usize, Vec<usize>, usize);

    /// Runs attention on `case` in `dtype`, with the fused op or the composed candle ops
    /// (`q kᵀ`, scale, the additive causal + padding mask, softmax, `· v`), back-propagates
    /// `Σ y ⊙ w`, and returns the output then the gradients of q, k and v, in f64.
    fn attention_run(case: &AttnCase, dtype: DType, fused: bool) -> Vec<f64> {
        use crate::fused::{CausalMask, FusedAttention};
        let (b, g, rep, t, l, past, lens, hd) = case.clone();
        let mut mask = Vec::with_capacity(b * t * l);
        for &len in &lens {
            for i in 0..t {
                for j in 0..l {
                    let seen = j <= (past + i).min(len - 1);
                    mask.push(if seen { 0.0 } else { f64::NEG_INFINITY });
                }
            }
        }
        let mask = Tensor::from_vec(mask, (b, 1, 1, t, l), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let var = |shape: &[usize], seed: usize| {
            let n = shape.iter().product();
            let x = Tensor::from_vec(data(n, seed), shape, &Device::Cpu).unwrap();
            Var::from_tensor(&x.to_dtype(dtype).unwrap()).unwrap()
        };
        let q = var(&[b, g, rep * t, hd], 1);
        let k = var(&[b, g, l, hd], 2);
        let v = var(&[b, g, l, hd], 3);
        let scale = 1.0 / (hd as f64).sqrt();
        let y = if fused {
            let op = FusedAttention {
                scale,
                mask: CausalMask {
                    queries: t,
                    past,
                    lens: lens.clone(),
                },
            };
            q.as_tensor().apply_op3(&k, &v, op).unwrap()
        } else {
            let s = (q.as_tensor().matmul(&k.t().unwrap()).unwrap() * scale)
                .unwrap()
                .reshape((b, g, rep, t, l))
                .unwrap()
                .broadcast_add(&mask)
                .unwrap()
                .reshape((b, g, rep * t, l))
                .unwrap();
            softmax_last_dim_composed(&s)
                .unwrap()
                .matmul(v.as_tensor())
                .unwrap()
        };
        let n = y.elem_count();
        let w: Vec<f64> = (0..n).map(|i| ((i * 13 % 7) as f64 - 3.0) / 2.0).collect();
        let w = Tensor::from_vec(w, y.shape(), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let grads = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let mut all = flat_f64(&y);
        for x in [&q, &k, &v] {
            all.extend(flat_f64(grads.get(x.as_tensor()).unwrap()));
        }
        all
    }

    /// The fused attention op and the composed ops it replaces agree on values and on the
    /// gradients of q, k and v: f64 within 1e-10; f32 within 2e-5 of the f64 composed ops
    /// (no worse than the f32 composed ops' own error, bounded alongside). Cases: a padded
    /// batch with grouped heads (rep 3), a chunk continuing a cache (queries after `past`
    /// keys), a batch with a length-1 sequence and more queries than one row block, and one
    /// large enough to run on the rayon pool.
    #[test]
    fn fused_attention_matches_composed() {
        let cases: [AttnCase; 4] = [
            (2, 2, 3, 5, 5, 0, vec![5, 3], 4),
            (1, 2, 2, 3, 7, 4, vec![7], 8),
            (3, 1, 1, 40, 40, 0, vec![40, 1, 17], 8),
            (2, 3, 3, 70, 70, 0, vec![70, 33], 16),
        ];
        for case in &cases {
            let want = attention_run(case, DType::F64, false);
            let close = |got: &[f64], tol: f64| -> f64 {
                assert_eq!(got.len(), want.len());
                let mut worst = 0f64;
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() < tol, "{case:?}: {a} vs {b}");
                    worst = worst.max((a - b).abs());
                }
                worst
            };
            close(&attention_run(case, DType::F64, true), 1e-10);
            let fused32 = close(&attention_run(case, DType::F32, true), 2e-5);
            let composed32 = close(&attention_run(case, DType::F32, false), 2e-5);
            assert!(
                fused32 <= 2.0 * composed32 + 1e-6,
                "{case:?}: f32 error {fused32} vs the composed ops' {composed32}"
            );
        }
    }

    /// In f32 the log-prob/entropy kernel stays within 1e-5 of the f64 composed ops, values and
    /// gradients, on a vocabulary large enough for rounding to show.
    #[test]
    fn logprob_entropy_in_f32_is_close_to_f64() {
        let (n, v) = (6, 5000);
        let raw: Vec<f64> = (0..n * v)
            .map(|i| ((i * 7919 % 4001) as f64 / 4001.0 - 0.5) * 12.0)
            .collect();
        let targets: Vec<u32> = (0..n as u32).map(|i| i * 811 % v as u32).collect();
        let w = Tensor::from_vec(
            vec![
                1.0f64, -0.5, 0.3, 2.0, -1.0, 0.7, 0.2, 0.1, -2.0, 1.5, 0.4, -0.9,
            ],
            (n, 2),
            &Device::Cpu,
        )
        .unwrap();
        let run = |dtype: DType, fused: bool| -> Vec<f64> {
            let x = Var::from_tensor(
                &Tensor::from_vec(raw.clone(), (n, v), &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            )
            .unwrap();
            let y = if fused {
                logprob_entropy(x.as_tensor(), targets.clone(), 0.8).unwrap()
            } else {
                logprob_entropy_composed(x.as_tensor(), &targets, 0.8).unwrap()
            };
            let y = y.to_dtype(DType::F64).unwrap();
            let grads = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let mut all = flat_f64(&y);
            all.extend(flat_f64(grads.get(x.as_tensor()).unwrap()));
            all
        };
        let (got, want) = (run(DType::F32, true), run(DType::F64, false));
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    /// The packed ⇄ padded heads-first copies and the composed gather / reshape / transpose
    /// chains they replace agree exactly (f64), values and gradients, with pads.
    #[test]
    fn heads_first_copies_match_composed() {
        use crate::fused::{FromHeadsFirst, PadMap, ToHeadsFirst};
        let (heads, groups, hd) = (6, 2, 4);
        let lens = [5usize, 2, 4];
        let t = 5;
        let mut spans = Vec::new();
        let mut gather = Vec::new();
        let mut scatter = Vec::new();
        let mut off = 0;
        for (s, &len) in lens.iter().enumerate() {
            spans.push((off, len));
            for i in 0..t {
                gather.push((off + i.min(len - 1)) as u32);
                if i < len {
                    scatter.push((s * t + i) as u32);
                }
            }
            off += len;
        }
        let n = off;
        let b = lens.len();
        let map = PadMap { spans, t };
        let gather = Tensor::from_vec(gather, b * t, &Device::Cpu).unwrap();
        let scatter = Tensor::from_vec(scatter, n, &Device::Cpu).unwrap();
        let to = |x: &Tensor| {
            x.apply_op1(ToHeadsFirst {
                map: map.clone(),
                groups,
                zero_pads: false,
            })
            .unwrap()
        };
        let to_composed = |x: &Tensor| {
            x.index_select(&gather, 0)
                .unwrap()
                .reshape((b, t, heads, hd))
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .contiguous()
                .unwrap()
                .reshape((b, groups, heads / groups * t, hd))
                .unwrap()
        };
        check_many(
            &[(data(n * heads * hd, 3), vec![n, heads, hd], true)],
            f64::MIN_POSITIVE,
            |x| to(&x[0]),
            |x| to_composed(&x[0]),
        );
        let from = |y: &Tensor| {
            y.apply_op1(FromHeadsFirst {
                map: map.clone(),
                heads,
                hd,
                fold_pads: false,
            })
            .unwrap()
        };
        let from_composed = |y: &Tensor| {
            y.reshape((b, heads, t, hd))
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .reshape((b * t, heads * hd))
                .unwrap()
                .index_select(&scatter, 0)
                .unwrap()
        };
        check_many(
            &[(
                data(b * heads * t * hd, 8),
                vec![b, groups, heads / groups * t, hd],
                true,
            )],
            f64::MIN_POSITIVE,
            |y| from(&y[0]),
            |y| from_composed(&y[0]),
        );
    }

    /// The fused log-prob/entropy op and the composed ops agree on values and on gradients
    /// (f64, 1e-10), for a loss that weights log-probs and entropies differently per row.
    #[test]
    fn fused_logprob_entropy_matches_composed() {
        let data: Vec<f64> = (0..5 * 7)
            .map(|i| ((i * 37 % 23) as f64 - 11.0) / 3.0)
            .collect();
        let targets = vec![0u32, 6, 3, 3, 1];
        let w = vec![1.0, -0.5, 0.3, 2.0, -1.0, 0.7, 0.2, 0.1, -2.0, 1.5];
        let w = Tensor::from_vec(w, (5, 2), &Device::Cpu).unwrap();
        check_against_composed(
            &data,
            (5, 7),
            &w,
            1e-10,
            |x| logprob_entropy(x, targets.clone(), 0.7).unwrap(),
            |x| logprob_entropy_composed(x, &targets, 0.7).unwrap(),
        );
    }

    /// The output layer with the log-prob/entropy in blocks of rows equals the composed
    /// `h · Wᵀ` then log-prob/entropy: values and the gradients of `h` and `W` (f64, 1e-10),
    /// over more rows than one block, at temperature 0.7; without `head_grad` it forms no `∂W`.
    #[test]
    fn head_logprob_entropy_matches_composed() {
        use crate::fused::HeadLogProbEntropy;
        let (n, d, v) = (300, 6, 11);
        let targets: Vec<u32> = (0..n).map(|i| (i * 7 % v) as u32).collect();
        let head = |head_grad| HeadLogProbEntropy {
            targets: std::sync::Arc::new(targets.clone()),
            temperature: 0.7,
            head_grad,
        };
        check_many(
            &[
                (data(n * d, 1), vec![n, d], true),
                (data(v * d, 2), vec![v, d], true),
            ],
            1e-10,
            |t| {
                t[0].apply_op2(&t[1], head(true))
                    .unwrap()
                    .narrow(1, 0, 2)
                    .unwrap()
            },
            |t| {
                let logits = t[0].matmul(&t[1].t().unwrap()).unwrap();
                logprob_entropy_composed(&logits, &targets, 0.7).unwrap()
            },
        );
        let h = Var::from_tensor(&Tensor::from_vec(data(n * d, 1), (n, d), &Device::Cpu).unwrap())
            .unwrap();
        let w = Var::from_tensor(&Tensor::from_vec(data(v * d, 2), (v, d), &Device::Cpu).unwrap())
            .unwrap();
        let y = h.as_tensor().apply_op2(w.as_tensor(), head(false)).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(h.as_tensor()).is_some());
        assert!(
            grads.get(w.as_tensor()).is_none(),
            "a frozen head got a gradient"
        );
    }
}
