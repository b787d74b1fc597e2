//! The training side of the engine: trainable parameters, per-token log-probs and entropy from
//! the differentiable forward, AdamW with gradient clipping and a warm-up + cosine schedule,
//! gradient accumulation over micro-batches.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::lora::{self, Adapters, LoraConfig};
use crate::model::{Chunk, Logits, Transformer};
use crate::ops;
use crate::weights::Weights;
use crate::{ModelError, Result};

/// A model whose parameters are candle `Var`s, so a loss over its forward can be
/// differentiated with respect to every one of them: all weights (full fine-tuning), or only
/// LoRA adapters over a frozen base ([`TrainableModel::with_lora`]).
#[derive(Debug)]
pub struct TrainableModel {
    cfg: ModelConfig,
    /// Sorted by name, so optimizer state and gradient norms iterate deterministically.
    /// With LoRA, the adapter matrices only (PEFT names): the base has no `Var`, hence no
    /// gradient and no optimizer state.
    vars: Vec<(String, Var)>,
    model: Transformer,
}

impl TrainableModel {
    /// Makes every tensor of `weights` a trainable variable (copied: `weights` is not changed
    /// by later optimizer steps).
    pub fn new(
        cfg: &ModelConfig,
        weights: &Weights,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut vars = Vec::new();
        let mut as_tensors = Weights::default();
        for name in weights.names() {
            let t = weights
                .tensors()
                .get(name)
                .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
            let var = Var::from_tensor(&t.to_dtype(dtype)?.to_device(device)?.copy()?)?;
            as_tensors.insert(name, var.as_tensor().clone());
            vars.push((name.to_string(), var));
        }
        let model = Transformer::from_weights(cfg, &as_tensors, dtype, device)?;
        // A weight the model does not use would never get a gradient; refuse it up front.
        let used = model.weights();
        if let Some((name, _)) = vars.iter().find(|(n, _)| !used.contains(n)) {
            return Err(ModelError::Config {
                field: name.clone(),
                reason: "tensor is not used by this architecture".into(),
            });
        }
        Ok(TrainableModel {
            cfg: cfg.clone(),
            vars,
            model,
        })
    }

    /// LoRA training: `adapters` (fresh ones from `seed` when `None`, PEFT's initialisation)
    /// are the variables; `base` is copied once to `dtype` on `device` and frozen.
    pub fn with_lora(
        cfg: &ModelConfig,
        base: &Weights,
        lora: &LoraConfig,
        adapters: Option<&Weights>,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        lora.validate("lora")?;
        let fresh;
        let adapters = match adapters {
            Some(a) => a,
            None => {
                fresh = lora::init_adapters(cfg, lora, seed, dtype, device)?;
                &fresh
            }
        };
        lora::check_adapters(cfg, lora, adapters)?;
        // A copy: the caller's tensors may be variables a later step would change in place.
        let mut frozen = Weights::default();
        for name in base.names() {
            let t = &base.tensors()[name];
            frozen.insert(name, t.to_dtype(dtype)?.to_device(device)?.detach().copy()?);
        }
        let mut vars = Vec::new();
        let mut as_tensors = Weights::default();
        for name in adapters.names() {
            let t = &adapters.tensors()[name];
            let var = Var::from_tensor(&t.to_dtype(dtype)?.to_device(device)?.copy()?)?;
            as_tensors.insert(name, var.as_tensor().clone());
            vars.push((name.to_string(), var));
        }
        let model = Transformer::with_adapters(
            cfg,
            &frozen,
            &Adapters {
                config: lora.clone(),
                weights: as_tensors,
            },
            dtype,
            device,
        )?;
        Ok(TrainableModel {
            cfg: cfg.clone(),
            vars,
            model,
        })
    }

    /// The LoRA settings, when only adapters are trained.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.model.adapters().map(|a| &a.config)
    }

    /// The model; its forward records gradients for the variables.
    pub fn model(&self) -> &Transformer {
        &self.model
    }

    /// The config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The trainable variables, sorted by name.
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// An independent inference copy of the current weights (for publishing to engines:
    /// later optimizer steps do not change it). With LoRA only the adapters are copied: the
    /// frozen base is shared, so publishing a version costs the adapters' size.
    pub fn snapshot(&self) -> Result<Transformer> {
        let (dtype, device) = (self.model.dtype(), self.model.device());
        match self.model.adapters() {
            Some(a) => {
                let adapters = Adapters {
                    config: a.config.clone(),
                    weights: a.weights.deep_copy()?,
                };
                Transformer::with_adapters(
                    &self.cfg,
                    &self.model.weights(),
                    &adapters,
                    dtype,
                    device,
                )
            }
            None => {
                let w = self.model.weights().deep_copy()?;
                Transformer::from_weights(&self.cfg, &w, dtype, device)
            }
        }
    }

    /// The current weights (shared, not copied); with LoRA, the frozen base.
    pub fn weights(&self) -> Weights {
        self.model.weights()
    }

    /// The adapters, when only adapters are trained (shared, not copied).
    pub fn adapters(&self) -> Option<&Adapters> {
        self.model.adapters()
    }
}

/// Per-token statistics of a packed batch of sequences, aligned with the tokens: entry `i` of
/// sequence `s` is about token `i` given tokens `< i`; entry 0 of every sequence is 0.
#[derive(Debug)]
pub struct TokenStats {
    /// `log softmax(logits / temperature)` at the actual token, `[total_tokens]`.
    pub logprobs: Tensor,
    /// Entropy of the predictive distribution for that token, `[total_tokens]`.
    pub entropy: Tensor,
    /// Start offset of each sequence in the packed layout, plus the total at the end.
    pub offsets: Vec<usize>,
}

/// Log-probs and entropies of full sequences under `model` (differentiable unless `fused`).
pub fn token_stats(
    model: &Transformer,
    sequences: &[&[u32]],
    temperature: f64,
    fused: bool,
) -> Result<TokenStats> {
    if !(temperature > 0.0) {
        return Err(ModelError::InvalidRequest(format!(
            "temperature must be positive for log-probs, got {temperature}"
        )));
    }
    let chunks: Vec<Chunk<'_>> = sequences
        .iter()
        .map(|s| Chunk {
            tokens: s,
            start_pos: 0,
        })
        .collect();
    let mut offsets = Vec::with_capacity(sequences.len() + 1);
    let mut targets = Vec::new();
    let mut keep = Vec::new();
    let mut off = 0;
    for s in sequences {
        offsets.push(off);
        // Row j predicts token j + 1; the last row of a sequence predicts nothing.
        for j in 0..s.len() {
            targets.push(if j + 1 < s.len() { s[j + 1] } else { 0 });
        }
        // Token i's value comes from row i - 1; token 0 of each sequence has none.
        for i in 0..s.len() {
            keep.push(if i == 0 { 0.0f32 } else { 1.0 });
        }
        off += s.len();
    }
    offsets.push(off);
    let n = off;
    let device = model.device();
    let both = if model.blocked_head() {
        model.logprob_entropy_all(&chunks, targets, temperature, fused)?
    } else {
        let logits = model.forward(&chunks, None, Logits::All, fused)?;
        ops::logprob_entropy(&logits, targets, temperature)?
    };
    let row_lp = both.narrow(1, 0, 1)?.squeeze(1)?;
    let row_ent = both.narrow(1, 1, 1)?.squeeze(1)?;
    // The stats' dtype: f32 for a half-precision model (see `ops::logprob_entropy`).
    let keep = Tensor::from_vec(keep, n, device)?.to_dtype(row_lp.dtype())?;
    let shift = |x: &Tensor| -> Result<Tensor> {
        let zero = Tensor::zeros(1, x.dtype(), device)?;
        let shifted = if n > 1 {
            Tensor::cat(&[&zero, &x.narrow(0, 0, n - 1)?], 0)?
        } else {
            zero
        };
        Ok((shifted * &keep)?)
    };
    Ok(TokenStats {
        logprobs: shift(&row_lp)?,
        entropy: shift(&row_ent)?,
        offsets,
    })
}

/// AdamW hyper-parameters and the learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimizerConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay (applied to matrices; norms and biases are exempt).
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (None = no clipping).
    pub max_grad_norm: Option<f64>,
    /// Linear warm-up from 0 over this many steps.
    pub warmup_steps: usize,
    /// Cosine decay to `min_lr_ratio · lr` at this step (0 = constant after warm-up).
    pub total_steps: usize,
    pub min_lr_ratio: f64,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            warmup_steps: 0,
            total_steps: 0,
            min_lr_ratio: 0.1,
        }
    }
}

impl OptimizerConfig {
    /// Learning rate at (0-based) step `step`.
    pub fn lr_at(&self, step: usize) -> f64 {
        if self.warmup_steps > 0 && step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        if self.total_steps == 0 || self.total_steps <= self.warmup_steps {
            return self.lr;
        }
        let progress = ((step - self.warmup_steps) as f64
            / (self.total_steps - self.warmup_steps) as f64)
            .min(1.0);
        let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cos)
    }
}

/// Gradients summed over micro-batches, keyed by parameter name.
#[derive(Debug, Default)]
pub struct GradAccumulator {
    grads: HashMap<String, Tensor>,
    micro_batches: usize,
}

impl GradAccumulator {
    /// Adds the gradients of one micro-batch's backward pass.
    pub fn add(&mut self, model: &TrainableModel, grads: &GradStore) -> Result<()> {
        for (name, var) in model.vars() {
            if let Some(g) = grads.get(var.as_tensor()) {
                let g = g.detach();
                let sum = match self.grads.remove(name) {
                    Some(prev) => (prev + g)?,
                    None => g,
                };
                self.grads.insert(name.clone(), sum);
            }
        }
        self.micro_batches += 1;
        Ok(())
    }

    /// Number of micro-batches added.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// The accumulated gradient of one parameter.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.grads.get(name)
    }

    /// Global L2 norm of the accumulated gradients.
    pub fn norm(&self) -> Result<f64> {
        // Summed in name order: a `HashMap`'s order changes from process to process, and
        // a resumed run must clip exactly as the uninterrupted one did.
        let mut names: Vec<&String> = self.grads.keys().collect();
        names.sort();
        let mut total = 0.0f64;
        for g in names.into_iter().filter_map(|n| self.grads.get(n)) {
            total += match cpu_kernel::sum_of_squares(g)? {
                Some(s) => s,
                None => g
                    .to_dtype(DType::F64)?
                    .sqr()?
                    .sum_all()?
                    .to_scalar::<f64>()?,
            };
        }
        Ok(total.sqrt())
    }
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    pub lr: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
}

/// AdamW (decoupled weight decay, Loshchilov & Hutter) with bias correction, matching
/// `torch.optim.AdamW`.
#[derive(Debug)]
pub struct AdamW {
    cfg: OptimizerConfig,
    step: usize,
    /// First and second moments per parameter name.
    state: HashMap<String, (Tensor, Tensor)>,
}

impl AdamW {
    /// A fresh optimizer.
    pub fn new(cfg: OptimizerConfig) -> Self {
        AdamW {
            cfg,
            step: 0,
            state: HashMap::new(),
        }
    }

    /// Steps taken so far.
    pub fn steps_taken(&self) -> usize {
        self.step
    }

    /// The optimizer's state for a checkpoint: steps taken (the learning-rate schedule's
    /// position) and the moments as named tensors, `exp_avg.<param>` and `exp_avg_sq.<param>`
    /// (torch's names).
    pub fn state(&self) -> Result<(usize, Weights)> {
        // Copies: the moments are updated in place by later steps.
        let mut w = Weights::default();
        for (name, (m, v)) in &self.state {
            w.insert(format!("exp_avg.{name}"), m.copy()?);
            w.insert(format!("exp_avg_sq.{name}"), v.copy()?);
        }
        Ok((self.step, w))
    }

    /// An optimizer continuing from a [`AdamW::state`]; fails on a moment without its pair.
    pub fn from_state(cfg: OptimizerConfig, step: usize, moments: &Weights) -> Result<Self> {
        let mut state = HashMap::new();
        for name in moments.names() {
            let Some(param) = name.strip_prefix("exp_avg.") else {
                continue;
            };
            let get = |n: &str| {
                moments
                    .tensors()
                    .get(n)
                    .cloned()
                    .ok_or_else(|| ModelError::MissingTensor { name: n.into() })
            };
            // Copies: a step updates the moments in place, and these are the caller's.
            let m = get(name)?.copy()?;
            let v = get(&format!("exp_avg_sq.{param}"))?.copy()?;
            state.insert(param.to_string(), (m, v));
        }
        Ok(AdamW { cfg, step, state })
    }

    /// Applies accumulated gradients to the model's variables in place.
    pub fn step(&mut self, model: &TrainableModel, grads: &GradAccumulator) -> Result<StepStats> {
        let lr = self.cfg.lr_at(self.step);
        let grad_norm = grads.norm()?;
        let clip = match self.cfg.max_grad_norm {
            Some(max) if grad_norm > max && grad_norm > 0.0 => max / grad_norm,
            _ => 1.0,
        };
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let bc1 = 1.0 - b1.powi(t);
        let bc2 = 1.0 - b2.powi(t);
        for (name, var) in model.vars() {
            let Some(g) = grads.get(name) else { continue };
            let (m, v) = match self.state.remove(name) {
                Some(s) => s,
                None => (g.zeros_like()?, g.zeros_like()?),
            };
            let w = var.as_tensor();
            let decay = if w.rank() >= 2 {
                self.cfg.weight_decay
            } else {
                0.0
            };
            if cpu_kernel::takes(&[w, g, &m, &v]) {
                // Three passes in place instead of a dozen allocating ones: the same
                // arithmetic in the same order.
                m.inplace_op2(
                    g,
                    &cpu_kernel::Moment {
                        beta: b1,
                        clip,
                        square: false,
                    },
                )?;
                v.inplace_op2(
                    g,
                    &cpu_kernel::Moment {
                        beta: b2,
                        clip,
                        square: true,
                    },
                )?;
                w.inplace_op3(
                    &m,
                    &v,
                    &cpu_kernel::Update {
                        lr,
                        decay,
                        eps: self.cfg.eps,
                        bc1,
                        bc2,
                    },
                )?;
                self.state.insert(name.clone(), (m, v));
                continue;
            }
            let g = if clip != 1.0 { (g * clip)? } else { g.clone() };
            let m = ((m * b1)? + (&g * (1.0 - b1))?)?;
            let v = ((v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let m_hat = (&m / bc1)?;
            let v_hat = (&v / bc2)?;
            let update = (m_hat / (v_hat.sqrt()? + self.cfg.eps)?)?;
            let w = w.detach();
            let new_w = ((w * (1.0 - lr * decay))? - (update * lr)?)?;
            var.set(&new_w)?;
            self.state.insert(name.clone(), (m, v));
        }
        Ok(StepStats { lr, grad_norm })
    }
}

/// AdamW's CPU kernels (f32, f64, contiguous): the moments and the parameter updated in place,
/// and the gradient norm's sum of squares in one pass. Each does the composed tensor ops'
/// arithmetic per element in their order (`affine` for a product with a scalar), so a step
/// gives the same parameters either way; other devices and dtypes use the composed ops.
mod cpu_kernel {
    use candle_core::{CpuStorage, Layout, Storage, Tensor};
    use rayon::prelude::*;

    use crate::fused::Real;

    /// Elements per parallel block (fixed, so the sum of squares adds its partials in the same
    /// order whatever the thread count).
    const BLOCK: usize = 1 << 14;

    /// Whether every tensor is a contiguous f32 or f64 tensor on the CPU, all of one dtype.
    pub(super) fn takes(ts: &[&Tensor]) -> bool {
        let dtype = ts.first().map(|t| t.dtype());
        ts.iter().all(|t| {
            t.device().is_cpu()
                && Some(t.dtype()) == dtype
                && matches!(t.dtype(), candle_core::DType::F32 | candle_core::DType::F64)
                && t.is_contiguous()
        })
    }

    fn slice<'a, T>(d: &'a [T], l: &Layout) -> candle_core::Result<&'a [T]> {
        crate::fused::contiguous(d, l, "adamw")
    }

    fn slice_mut<'a, T>(d: &'a mut [T], l: &Layout) -> candle_core::Result<&'a mut [T]> {
        crate::fused::contiguous_mut(d, l, "adamw")
    }

    /// `Σ g²` in f64 for a CPU tensor the kernels take; `None` for others.
    pub(super) fn sum_of_squares(g: &Tensor) -> candle_core::Result<Option<f64>> {
        if !takes(&[g]) {
            return Ok(None);
        }
        fn run<T: Real>(d: &[T]) -> f64 {
            let partials: Vec<f64> = d
                .par_chunks(BLOCK)
                .map(|c| c.iter().map(|&x| x.to_f64() * x.to_f64()).sum::<f64>())
                .collect();
            partials.iter().sum()
        }
        let (s, l) = g.storage_and_layout();
        Ok(match &*s {
            Storage::Cpu(CpuStorage::F32(d)) => Some(run(slice(d, l)?)),
            Storage::Cpu(CpuStorage::F64(d)) => Some(run(slice(d, l)?)),
            _ => None,
        })
    }

    /// A moment, in place: `m ← m·β + (c·g)·(1 − β)` (first) or `v ← v·β + (c·g)²·(1 − β)`
    /// (second, `square`), with `c` the clipping factor (1: none).
    pub(super) struct Moment {
        pub beta: f64,
        pub clip: f64,
        pub square: bool,
    }

    impl Moment {
        fn run<T: Real>(&self, m: &mut [T], g: &[T]) -> candle_core::Result<()> {
            if m.len() != g.len() {
                candle_core::bail!("adamw: moment of {} for a gradient of {}", m.len(), g.len());
            }
            let (beta, rest) = (T::from_f64(self.beta), T::from_f64(1.0 - self.beta));
            let clip = (self.clip != 1.0).then(|| T::from_f64(self.clip));
            m.par_chunks_mut(BLOCK)
                .zip(g.par_chunks(BLOCK))
                .for_each(|(m, g)| {
                    for (m, &g) in m.iter_mut().zip(g) {
                        let g = clip.map_or(g, |c| g * c);
                        let g = if self.square { g * g } else { g };
                        *m = *m * beta + g * rest;
                    }
                });
            Ok(())
        }
    }

    impl candle_core::InplaceOp2 for Moment {
        fn name(&self) -> &'static str {
            "rollflash-adamw-moment"
        }

        fn cpu_fwd(
            &self,
            s1: &mut CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
        ) -> candle_core::Result<()> {
            match (s1, s2) {
                (CpuStorage::F32(m), CpuStorage::F32(g)) => {
                    self.run(slice_mut(m, l1)?, slice(g, l2)?)
                }
                (CpuStorage::F64(m), CpuStorage::F64(g)) => {
                    self.run(slice_mut(m, l1)?, slice(g, l2)?)
                }
                _ => candle_core::bail!("adamw: f32 or f64 tensors of one dtype"),
            }
        }
    }

    /// The parameter, in place, from the updated moments:
    /// `w ← w·(1 − lr·decay) − (m·(1/bc1)) / (sqrt(v·(1/bc2)) + eps)·lr`.
    pub(super) struct Update {
        pub lr: f64,
        pub decay: f64,
        pub eps: f64,
        pub bc1: f64,
        pub bc2: f64,
    }

    impl Update {
        fn run<T: Real>(&self, w: &mut [T], m: &[T], v: &[T]) -> candle_core::Result<()> {
            if w.len() != m.len() || w.len() != v.len() {
                candle_core::bail!(
                    "adamw: parameter of {} with moments of {}",
                    w.len(),
                    m.len()
                );
            }
            let keep = T::from_f64(1.0 - self.lr * self.decay);
            let (ic1, ic2) = (T::from_f64(1.0 / self.bc1), T::from_f64(1.0 / self.bc2));
            let (eps, lr) = (T::from_f64(self.eps), T::from_f64(self.lr));
            w.par_chunks_mut(BLOCK)
                .zip(m.par_chunks(BLOCK).zip(v.par_chunks(BLOCK)))
                .for_each(|(w, (m, v))| {
                    for ((w, &m), &v) in w.iter_mut().zip(m).zip(v) {
                        let update = (m * ic1) / ((v * ic2).sqrt() + eps);
                        *w = *w * keep - update * lr;
                    }
                });
            Ok(())
        }
    }

    impl candle_core::InplaceOp3 for Update {
        fn name(&self) -> &'static str {
            "rollflash-adamw-update"
        }

        fn cpu_fwd(
            &self,
            s1: &mut CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
            s3: &CpuStorage,
            l3: &Layout,
        ) -> candle_core::Result<()> {
            match (s1, s2, s3) {
                (CpuStorage::F32(w), CpuStorage::F32(m), CpuStorage::F32(v)) => {
                    self.run(slice_mut(w, l1)?, slice(m, l2)?, slice(v, l3)?)
                }
                (CpuStorage::F64(w), CpuStorage::F64(m), CpuStorage::F64(v)) => {
                    self.run(slice_mut(w, l1)?, slice(m, l2)?, slice(v, l3)?)
                }
                _ => candle_core::bail!("adamw: f32 or f64 tensors of one dtype"),
            }
        }
    }
}
