//! The decoder-only transformer (Llama / Qwen2 / Qwen3 families) and its packed forward pass.
//!
//! One forward serves every use: a *packed batch* is a list of chunks, each a run of tokens of
//! one sequence starting at some position. Linear layers run on all tokens of all chunks at
//! once (that is where the FLOPs are); attention runs per chunk against that sequence's KV
//! cache. Prefill, decode and a mix of both (continuous batching) are the same call, and the
//! training forward is the same code with the differentiable ops and no cache — which is why
//! incremental decoding and training log-probs agree.

use candle_core::{DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::decode_attention::{decode_attention, Heads, Member};
use crate::fused::{CausalMask, FromHeadsFirst, FusedAttention, PadMap, ToHeadsFirst};
use crate::lora::{self, Adapters, PROJECTIONS};
use crate::ops;
use crate::weights::Weights;
use crate::{ModelError, Result};

/// A run of tokens of one sequence, at positions `start_pos .. start_pos + tokens.len()`.
#[derive(Debug, Clone, Copy)]
pub struct Chunk<'a> {
    pub tokens: &'a [u32],
    pub start_pos: usize,
}

/// The smallest vocabulary whose training log-probs go through the blocked output layer
/// ([`Transformer::blocked_head`]).
const BLOCKED_HEAD_MIN_VOCAB: usize = 4096;

/// Which logits a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// One row per input token: `[total_tokens, vocab]` (training).
    All,
    /// One row per chunk, for its last token: `[num_chunks, vocab]` (generation).
    LastOfEachChunk,
}

/// The KV cache of one sequence: per layer, keys and values `[kv_heads, capacity, head_dim]`,
/// grown by doubling and written in place. Owned by the caller (the engine), never hidden in
/// the model, so sequences can be added, dropped and resumed freely.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    /// An empty cache for a model with `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        KvCache {
            layers: (0..num_layers).map(|_| None).collect(),
            len: 0,
        }
    }

    /// Number of positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the buffers of `layer` can hold before they grow.
    fn capacity(&self, layer: usize) -> usize {
        match self.layers.get(layer) {
            Some(Some((k, _))) => k.dims().get(1).copied().unwrap_or(0),
            _ => 0,
        }
    }

    /// The whole key and value buffers of `layer` (`[kv_heads, capacity, head_dim]`).
    fn buffers(&self, layer: usize) -> Result<(Tensor, Tensor)> {
        match self.layers.get(layer) {
            Some(Some((k, v))) => Ok((k.clone(), v.clone())),
            _ => Err(ModelError::InvalidRequest(format!(
                "cache layer {layer} is empty"
            ))),
        }
    }

    /// Appends `k`, `v` (`[kv_heads, t, head_dim]`) to layer `layer` and returns views of all
    /// cached keys and values. `len` advances once per forward (after the last layer).
    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (kvh, t, hd) = k.dims3()?;
        let need = self.len + t;
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| ModelError::InvalidRequest(format!("cache has no layer {layer}")))?;
        let grow = match slot {
            Some((ck, _)) => ck.dim(1)? < need,
            None => true,
        };
        if grow {
            let cap = need.next_power_of_two().max(16);
            let nk = Tensor::zeros((kvh, cap, hd), k.dtype(), k.device())?;
            let nv = Tensor::zeros((kvh, cap, hd), v.dtype(), v.device())?;
            if let Some((ck, cv)) = slot.as_ref() {
                if self.len > 0 {
                    nk.slice_set(&ck.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                    nv.slice_set(&cv.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                }
            }
            *slot = Some((nk, nv));
        }
        let (ck, cv) = slot
            .as_ref()
            .ok_or_else(|| ModelError::InvalidRequest("cache slot vanished".into()))?;
        ck.slice_set(&k.contiguous()?, 1, self.len)?;
        cv.slice_set(&v.contiguous()?, 1, self.len)?;
        // Views, not copies: matmul accepts any stride between the kv heads.
        Ok((ck.narrow(1, 0, need)?, cv.narrow(1, 0, need)?))
    }
}

#[derive(Debug, Clone)]
struct Linear {
    w: Tensor,
    b: Option<Tensor>,
    /// A LoRA adapter `(A, B, alpha/r)`, applied unmerged.
    lora: Option<(Tensor, Tensor, f64)>,
}

/// How one forward treats a frozen base and the adapters' dropout.
#[derive(Debug, Clone, Copy)]
struct Pass {
    /// Inference kernels (no backward).
    fused: bool,
    /// The base weights are constants: a training forward skips their gradients
    /// ([`crate::fused::FrozenLinear`]).
    frozen: bool,
    /// Adapter dropout `(p, seed)` of a training forward.
    dropout: Option<(f64, u64)>,
}

impl Pass {
    /// `x · Wᵀ` for a base weight `w`.
    fn base_matmul(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        // The frozen op is a CPU kernel; elsewhere the plain matmul is exact, only slower.
        if self.frozen && !self.fused && x.device().is_cpu() {
            let x = x.contiguous()?;
            return Ok(x.apply_op1(crate::fused::FrozenLinear { w: w.clone() })?);
        }
        if self.fused && x.device().is_cpu() {
            if let ([m, k], [n, _]) = (x.dims(), w.dims()) {
                if *m > 1 && (*m <= 32 || (k > n && *m <= 256)) {
                    // Few rows (decode, short prefills): `(W · xᵀ)ᵀ` gives gemm the weight as a
                    // row-major left operand, where `x · Wᵀ` makes it pack the transposed
                    // weight for a handful of rows — measured 1.2–5× faster at these shapes
                    // (down projections most), slower at training sizes (BENCHMARKS.md).
                    return Ok(w.matmul(&x.t()?)?.t()?.contiguous()?);
                }
            }
        }
        Ok(x.matmul(&w.t()?)?)
    }
}

impl Linear {
    fn load(
        w: &Weights,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
        dt: DType,
    ) -> Result<Self> {
        Ok(Linear {
            w: w.get(&format!("{name}.weight"), &[out, inp], dt)?,
            b: if bias {
                Some(w.get(&format!("{name}.bias"), &[out], dt)?)
            } else {
                None
            },
            lora: None,
        })
    }

    /// `x [n, in] → [n, out]`: `x·Wᵀ + b`, plus `scale·(dropout(x)·Aᵀ)·Bᵀ` when adapted, in
    /// PEFT's order (base output with its bias first). `site` picks the dropout stream.
    fn forward(&self, x: &Tensor, pass: &Pass, site: (usize, usize)) -> Result<Tensor> {
        if let Some((a, b, scale)) = &self.lora {
            // Training on a frozen CPU base: one node instead of five, so the backward
            // keeps no intermediates of the adapter ([`crate::lora_linear`]).
            if pass.frozen && !pass.fused && x.device().is_cpu() {
                let op = crate::lora_linear::LoraLinear {
                    w: self.w.clone(),
                    bias: self.b.clone(),
                    scale: *scale,
                    dropout: match pass.dropout {
                        Some((p, seed)) if p > 0.0 => {
                            Some((p, lora::site_seed(seed, site.0, site.1)))
                        }
                        _ => None,
                    },
                };
                return Ok(x.contiguous()?.apply_op3(a, b, op)?);
            }
        }
        let y = pass.base_matmul(x, &self.w)?;
        let y = match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        let Some((a, b, scale)) = &self.lora else {
            return Ok(y);
        };
        let input = match pass.dropout {
            Some((p, seed)) if !pass.fused && p > 0.0 => {
                lora::dropout(x, p, lora::site_seed(seed, site.0, site.1))?
            }
            _ => x.clone(),
        };
        let delta = input.matmul(&a.t()?)?.matmul(&b.t()?)?;
        Ok((y + (delta * *scale)?)?)
    }
}

#[derive(Debug, Clone)]
struct Layer {
    input_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Layer {
    /// The projection at `module` (a path of [`PROJECTIONS`]).
    fn linear_mut(&mut self, module: &str) -> Result<&mut Linear> {
        Ok(match module {
            "self_attn.q_proj" => &mut self.q,
            "self_attn.k_proj" => &mut self.k,
            "self_attn.v_proj" => &mut self.v,
            "self_attn.o_proj" => &mut self.o,
            "mlp.gate_proj" => &mut self.gate,
            "mlp.up_proj" => &mut self.up,
            "mlp.down_proj" => &mut self.down,
            other => {
                return Err(ModelError::InvalidRequest(format!(
                    "no projection `{other}` in a layer"
                )))
            }
        })
    }
}

/// A transformer with its weights. Cheap to clone (tensors are shared).
#[derive(Debug, Clone)]
pub struct Transformer {
    cfg: ModelConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    /// `[max_positions, head_dim / 2]` rotary tables, computed in f64 then cast.
    cos: Tensor,
    sin: Tensor,
    dtype: DType,
    device: Device,
    /// The LoRA adapters applied on top of the (then frozen) base, unmerged.
    adapters: Option<Adapters>,
    /// Seed of the adapters' dropout masks in a training forward (`None`: no dropout).
    dropout_seed: Option<u64>,
}

impl Transformer {
    /// Builds the model from named weights (cast to `dtype`); every tensor's shape is checked
    /// against `cfg`.
    pub fn from_weights(
        cfg: &ModelConfig,
        w: &Weights,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        cfg.validate()?;
        let h = cfg.hidden_size;
        let hd = cfg.head_dim;
        let q_out = cfg.num_attention_heads * hd;
        let kv_out = cfg.num_key_value_heads * hd;
        let embed = w.get("model.embed_tokens.weight", &[cfg.vocab_size, h], dtype)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let bias = cfg.attention_bias;
            layers.push(Layer {
                input_norm: w.get(&format!("{p}.input_layernorm.weight"), &[h], dtype)?,
                q: Linear::load(w, &format!("{p}.self_attn.q_proj"), q_out, h, bias, dtype)?,
                k: Linear::load(w, &format!("{p}.self_attn.k_proj"), kv_out, h, bias, dtype)?,
                v: Linear::load(w, &format!("{p}.self_attn.v_proj"), kv_out, h, bias, dtype)?,
                o: Linear::load(w, &format!("{p}.self_attn.o_proj"), h, q_out, false, dtype)?,
                q_norm: if cfg.qk_norm {
                    Some(w.get(&format!("{p}.self_attn.q_norm.weight"), &[hd], dtype)?)
                } else {
                    None
                },
                k_norm: if cfg.qk_norm {
                    Some(w.get(&format!("{p}.self_attn.k_norm.weight"), &[hd], dtype)?)
                } else {
                    None
                },
                post_norm: w.get(&format!("{p}.post_attention_layernorm.weight"), &[h], dtype)?,
                gate: Linear::load(
                    w,
                    &format!("{p}.mlp.gate_proj"),
                    cfg.intermediate_size,
                    h,
                    false,
                    dtype,
                )?,
                up: Linear::load(
                    w,
                    &format!("{p}.mlp.up_proj"),
                    cfg.intermediate_size,
                    h,
                    false,
                    dtype,
                )?,
                down: Linear::load(
                    w,
                    &format!("{p}.mlp.down_proj"),
                    h,
                    cfg.intermediate_size,
                    false,
                    dtype,
                )?,
            });
        }
        let norm = w.get("model.norm.weight", &[h], dtype)?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            w.get("lm_head.weight", &[cfg.vocab_size, h], dtype)?
        };
        let (cos, sin) = rope_tables(cfg, dtype, device)?;
        Ok(Transformer {
            cfg: cfg.clone(),
            embed,
            layers,
            norm,
            lm_head,
            cos,
            sin,
            dtype,
            device: device.clone(),
            adapters: None,
            dropout_seed: None,
        })
    }

    /// The model of `base` weights with LoRA `adapters` applied unmerged (the base frozen:
    /// a training forward records gradients only for the adapters). The adapters must be
    /// exactly those their config gives `cfg` ([`lora::check_adapters`]); they are cast to
    /// `dtype` and shared, not copied.
    pub fn with_adapters(
        cfg: &ModelConfig,
        base: &Weights,
        adapters: &Adapters,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        adapters.config.validate("lora")?;
        lora::check_adapters(cfg, &adapters.config, &adapters.weights)?;
        let mut model = Transformer::from_weights(cfg, base, dtype, device)?;
        let scale = adapters.config.scale();
        let mut kept = Weights::default();
        for (l, layer) in model.layers.iter_mut().enumerate() {
            for (_, module) in PROJECTIONS {
                let Some((a, b)) = adapters.pair(l, module) else {
                    continue;
                };
                let (a, b) = (a.to_dtype(dtype)?, b.to_dtype(dtype)?);
                kept.insert(lora::adapter_name(l, module, lora::Factor::A), a.clone());
                kept.insert(lora::adapter_name(l, module, lora::Factor::B), b.clone());
                layer.linear_mut(module)?.lora = Some((a, b, scale));
            }
        }
        model.adapters = Some(Adapters {
            config: adapters.config.clone(),
            weights: kept,
        });
        Ok(model)
    }

    /// This model with adapter dropout on in its training forward, masks drawn from `seed`
    /// (shares every tensor). Without adapters, or with `dropout = 0`, nothing changes.
    pub fn with_dropout_seed(&self, seed: u64) -> Transformer {
        let mut m = self.clone();
        m.dropout_seed = Some(seed);
        m
    }

    /// The LoRA adapters, when the model has them (shared, not copied).
    pub fn adapters(&self) -> Option<&Adapters> {
        self.adapters.as_ref()
    }

    /// The weights a server without LoRA support serves: the base with the adapters merged
    /// in (`W + (alpha/r)·B·A`), or just the weights when there are none.
    pub fn merged_weights(&self) -> Result<Weights> {
        match &self.adapters {
            Some(a) => a.merge_into(&self.cfg, &self.weights()),
            None => Ok(self.weights()),
        }
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The dtype the forward computes in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The model's tensors under their Hugging Face names (shared, not copied). With adapters,
    /// the frozen base without them ([`Transformer::adapters`], [`Transformer::merged_weights`]).
    pub fn weights(&self) -> Weights {
        let mut w = Weights::default();
        w.insert("model.embed_tokens.weight", self.embed.clone());
        for (l, layer) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{l}");
            w.insert(
                format!("{p}.input_layernorm.weight"),
                layer.input_norm.clone(),
            );
            w.insert(
                format!("{p}.post_attention_layernorm.weight"),
                layer.post_norm.clone(),
            );
            for (n, lin) in [
                ("self_attn.q_proj", &layer.q),
                ("self_attn.k_proj", &layer.k),
                ("self_attn.v_proj", &layer.v),
                ("self_attn.o_proj", &layer.o),
                ("mlp.gate_proj", &layer.gate),
                ("mlp.up_proj", &layer.up),
                ("mlp.down_proj", &layer.down),
            ] {
                w.insert(format!("{p}.{n}.weight"), lin.w.clone());
                if let Some(b) = &lin.b {
                    w.insert(format!("{p}.{n}.bias"), b.clone());
                }
            }
            if let Some(t) = &layer.q_norm {
                w.insert(format!("{p}.self_attn.q_norm.weight"), t.clone());
            }
            if let Some(t) = &layer.k_norm {
                w.insert(format!("{p}.self_attn.k_norm.weight"), t.clone());
            }
        }
        w.insert("model.norm.weight", self.norm.clone());
        if !self.cfg.tie_word_embeddings {
            w.insert("lm_head.weight", self.lm_head.clone());
        }
        w
    }

    /// Full-sequence logits `[T, vocab]` for one sequence from position 0 (inference kernels).
    pub fn forward_logits(&self, tokens: &[u32]) -> Result<Tensor> {
        let chunk = Chunk {
            tokens,
            start_pos: 0,
        };
        self.forward(&[chunk], None, Logits::All, true)
    }

    /// The packed forward. With `caches`, chunk `i` continues the sequence cached in
    /// `caches[i]` (whose length must equal the chunk's `start_pos`) and appends to it.
    /// `fused` selects candle's fast kernels, which have no backward pass: pass `false` when
    /// gradients are needed.
    pub fn forward(
        &self,
        chunks: &[Chunk<'_>],
        caches: Option<&mut [&mut KvCache]>,
        logits: Logits,
        fused: bool,
    ) -> Result<Tensor> {
        let (x, pass) = self.trunk(chunks, caches, logits, fused)?;
        pass.base_matmul(&x, &self.lm_head)
    }

    /// Every training row's log-prob of its target and entropy under `softmax(logits / T)`,
    /// `[rows, 2]`, on the CPU computing the output layer in blocks of rows inside the op
    /// ([`crate::fused::HeadLogProbEntropy`]), so the `[rows, vocab]` logits and their gradient
    /// are never held whole. Only where [`Self::blocked_head`].
    pub(crate) fn logprob_entropy_all(
        &self,
        chunks: &[Chunk<'_>],
        targets: Vec<u32>,
        temperature: f64,
        fused: bool,
    ) -> Result<Tensor> {
        let (x, pass) = self.trunk(chunks, None, Logits::All, fused)?;
        let stats = x.contiguous()?.apply_op2(
            &self.lm_head,
            crate::fused::HeadLogProbEntropy {
                targets: std::sync::Arc::new(targets),
                temperature,
                // A frozen base (LoRA) needs no gradient for the head.
                head_grad: !pass.frozen,
            },
        )?;
        // Columns 2 and 3 are what the backward pass reads back (the row's max and log-sum).
        Ok(stats.narrow(1, 0, 2)?)
    }

    /// Whether [`Self::logprob_entropy_all`] is the way here: a kernel for the device and dtype
    /// (CPU, f32/f64) and a vocabulary of at least [`BLOCKED_HEAD_MIN_VOCAB`]. A small
    /// vocabulary's logits are no larger than the hidden states, so blocking them saves
    /// nothing and only adds the block products' overhead (measured: ~9 % of the default
    /// model's training step, vocabulary ~100).
    pub(crate) fn blocked_head(&self) -> bool {
        ops::on_cpu_kernels(&self.lm_head) && self.cfg.vocab_size >= BLOCKED_HEAD_MIN_VOCAB
    }

    /// The forward up to the final norm: the rows `logits` asks for, before the output layer,
    /// and the pass's settings.
    fn trunk(
        &self,
        chunks: &[Chunk<'_>],
        mut caches: Option<&mut [&mut KvCache]>,
        logits: Logits,
        fused: bool,
    ) -> Result<(Tensor, Pass)> {
        if chunks.is_empty() {
            return Err(ModelError::InvalidRequest(
                "forward of an empty batch".into(),
            ));
        }
        if let Some(c) = caches.as_deref() {
            if c.len() != chunks.len() {
                return Err(ModelError::InvalidRequest(format!(
                    "{} chunks but {} caches",
                    chunks.len(),
                    c.len()
                )));
            }
        }
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        let mut spans = Vec::with_capacity(chunks.len());
        for (i, ch) in chunks.iter().enumerate() {
            if ch.tokens.is_empty() {
                return Err(ModelError::InvalidRequest(format!("chunk {i} is empty")));
            }
            if let Some(c) = caches.as_deref() {
                if c[i].len() != ch.start_pos {
                    return Err(ModelError::InvalidRequest(format!(
                        "chunk {i} starts at {} but its cache holds {}",
                        ch.start_pos,
                        c[i].len()
                    )));
                }
            }
            let end = ch.start_pos + ch.tokens.len();
            if end > self.cfg.max_position_embeddings {
                return Err(ModelError::InvalidRequest(format!(
                    "sequence reaches position {end}, beyond max_position_embeddings = {}",
                    self.cfg.max_position_embeddings
                )));
            }
            if let Some(&bad) = ch
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.cfg.vocab_size)
            {
                return Err(ModelError::InvalidRequest(format!(
                    "token id {bad} is outside the vocabulary of {}",
                    self.cfg.vocab_size
                )));
            }
            spans.push((ids.len(), ch.tokens.len(), ch.start_pos));
            ids.extend_from_slice(ch.tokens);
            positions.extend((ch.start_pos..end).map(|p| p as u32));
        }
        let n = ids.len();
        let ids = Tensor::from_vec(ids, n, &self.device)?;
        let pos = Tensor::from_vec(positions, n, &self.device)?;
        let cos = self.cos.index_select(&pos, 0)?;
        let sin = self.sin.index_select(&pos, 0)?;

        // Without caches every chunk attends only to itself: run them as one padded batch
        // (one set of ops per layer instead of one per chunk — what makes training fast).
        let padded = if caches.is_none() && spans.len() > 1 {
            Some(Padding::new(&spans, &self.device, self.dtype)?)
        } else {
            None
        };
        let cfg = &self.cfg;
        let (nh, nkv, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let eps = cfg.rms_norm_eps;
        let pass = Pass {
            fused,
            frozen: self.adapters.is_some(),
            dropout: match (&self.adapters, self.dropout_seed) {
                (Some(a), Some(seed)) => Some((a.config.dropout, seed)),
                _ => None,
            },
        };
        let mut x = self.embed.index_select(&ids, 0)?;
        for (li, layer) in self.layers.iter().enumerate() {
            let hn = ops::rms_norm(&x, &layer.input_norm, eps, fused)?;
            let mut q = layer.q.forward(&hn, &pass, (li, 0))?.reshape((n, nh, hd))?;
            let mut k = layer
                .k
                .forward(&hn, &pass, (li, 1))?
                .reshape((n, nkv, hd))?;
            let v = layer
                .v
                .forward(&hn, &pass, (li, 2))?
                .reshape((n, nkv, hd))?;
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                q = ops::rms_norm(&q, qn, eps, fused)?;
                k = ops::rms_norm(&k, kn, eps, fused)?;
            }
            let q = ops::rope(&q, &cos, &sin, fused)?;
            let k = ops::rope(&k, &cos, &sin, fused)?;
            let attn = match (caches.as_deref_mut(), &padded) {
                (None, Some(pad)) => self.attend_padded(&q, &k, &v, pad, fused)?,
                (None, None) => {
                    // One chunk, no cache: it attends to itself.
                    let qc = q.transpose(0, 1)?.contiguous()?;
                    let kc = k.transpose(0, 1)?.contiguous()?;
                    let vc = v.transpose(0, 1)?.contiguous()?;
                    self.attend(&qc, &kc, &vc, fused)?
                }
                (Some(c), _) => self.attend_cached(li, &q, &k, &v, &spans, c, fused)?,
            };
            x = (x + layer.o.forward(&attn, &pass, (li, 3))?)?;
            let hn = ops::rms_norm(&x, &layer.post_norm, eps, fused)?;
            let mlp = layer.down.forward(
                &ops::swiglu(
                    &layer.gate.forward(&hn, &pass, (li, 4))?,
                    &layer.up.forward(&hn, &pass, (li, 5))?,
                )?,
                &pass,
                (li, 6),
            )?;
            x = (x + mlp)?;
        }
        if let Some(c) = caches {
            for (cache, &(_, t, _)) in c.iter_mut().zip(&spans) {
                cache.len += t;
            }
        }
        let x = match logits {
            Logits::All => x,
            Logits::LastOfEachChunk => {
                let last: Vec<u32> = spans.iter().map(|&(o, t, _)| (o + t - 1) as u32).collect();
                let idx = Tensor::from_vec(last, spans.len(), &self.device)?;
                x.index_select(&idx, 0)?
            }
        };
        Ok((ops::rms_norm(&x, &self.norm, eps, fused)?, pass))
    }

    /// Attention of chunks that continue cached sequences. New keys and values are appended to
    /// each cache; then decode chunks (one token) whose caches have the same capacity attend as
    /// one batch — a single stack of their cache buffers and one set of ops — and longer chunks
    /// (prefills) attend one by one. Rows are put back in packed order at the end.
    #[allow(clippy::too_many_arguments)]
    fn attend_cached(
        &self,
        li: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spans: &[(usize, usize, usize)],
        caches: &mut [&mut KvCache],
        fused: bool,
    ) -> Result<Tensor> {
        let (n, nh, hd) = q.dims3()?;
        let nkv = k.dim(1)?;
        let rep = nh / nkv;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut pieces = Vec::new();
        let mut perm = vec![0u32; n];
        let mut row = 0usize;
        let mut buckets: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        let mut views = Vec::with_capacity(spans.len());
        for (ci, &(off, t, _)) in spans.iter().enumerate() {
            // `[t, heads, hd] → [heads, t, hd]`: a free reshape when t = 1.
            let heads_first = |x: &Tensor, heads: usize| -> Result<Tensor> {
                let x = x.narrow(0, off, t)?;
                Ok(if t == 1 {
                    x.reshape((heads, 1, hd))?
                } else {
                    x.transpose(0, 1)?.contiguous()?
                })
            };
            let view = caches[ci].append(li, &heads_first(k, nkv)?, &heads_first(v, nkv)?)?;
            if t == 1 {
                buckets.entry(caches[ci].capacity(li)).or_default().push(ci);
                views.push(None);
            } else {
                views.push(Some((heads_first(q, nh)?, view)));
            }
        }
        for (ci, view) in views.into_iter().enumerate() {
            if let Some((qc, (kc, vc))) = view {
                let (off, t, _) = spans[ci];
                pieces.push(self.attend(&qc, &kc, &vc, fused)?);
                for j in 0..t {
                    perm[off + j] = (row + j) as u32;
                }
                row += t;
            }
        }
        if ops::on_cpu_kernels(q) && !buckets.is_empty() {
            // Every decode chunk in one kernel that reads the caches in place (no stacked copy
            // of the batch's caches, no mask, no work on the unused capacity).
            let members: Vec<usize> = buckets.into_values().flatten().collect();
            let bufs = members
                .iter()
                .map(|&ci| caches[ci].buffers(li))
                .collect::<Result<Vec<_>>>()?;
            let views: Vec<Member<'_>> = members
                .iter()
                .zip(&bufs)
                .map(|(&ci, (k, v))| Member {
                    k,
                    v,
                    // The appended token is not yet counted in `len` (that happens after the
                    // last layer), so this sequence sees keys 0 ..= len.
                    seen: caches[ci].len() + 1,
                })
                .collect();
            let rows: Vec<usize> = members.iter().map(|&ci| spans[ci].0).collect();
            let heads = Heads {
                kv_heads: nkv,
                rep,
                head_dim: hd,
            };
            if let Some(out) = decode_attention(&q.contiguous()?, &rows, &views, heads, scale)? {
                pieces.push(out);
                for (j, &ci) in members.iter().enumerate() {
                    perm[spans[ci].0] = (row + j) as u32;
                }
                return self.unpermute(pieces, perm, n);
            }
            return Err(ModelError::InvalidRequest(
                "decode attention: the query and the caches differ in dtype".into(),
            ));
        }
        for (cap, members) in buckets {
            let b = members.len();
            let rows: Vec<u32> = members.iter().map(|&ci| spans[ci].0 as u32).collect();
            let rows = Tensor::from_vec(rows, b, &self.device)?;
            let qb = (q.index_select(&rows, 0)?.reshape((b, nkv, rep, hd))? * scale)?;
            let mut ks = Vec::with_capacity(b);
            let mut vs = Vec::with_capacity(b);
            let mut mask = Vec::with_capacity(b * cap);
            for &ci in &members {
                let (ck, cv) = caches[ci].buffers(li)?;
                ks.push(ck);
                vs.push(cv);
                // The appended token is not yet counted in `len` (that happens after the last
                // layer), so this sequence sees keys 0 ..= len.
                let seen = caches[ci].len() + 1;
                mask.extend((0..cap).map(|j| if j < seen { 0f32 } else { f32::NEG_INFINITY }));
            }
            let kb = Tensor::stack(&ks, 0)?;
            let vb = Tensor::stack(&vs, 0)?;
            let mask =
                Tensor::from_vec(mask, (b, 1, 1, cap), &self.device)?.to_dtype(self.dtype)?;
            let scores = qb.matmul(&kb.transpose(2, 3)?)?.broadcast_add(&mask)?;
            let p = ops::softmax_last_dim(&scores, fused)?;
            pieces.push(p.matmul(&vb)?.reshape((b, nh * hd))?);
            for (j, &ci) in members.iter().enumerate() {
                perm[spans[ci].0] = (row + j) as u32;
            }
            row += b;
        }
        self.unpermute(pieces, perm, n)
    }

    /// The attention outputs of [`Self::attend_cached`]'s pieces, concatenated and put back in
    /// packed order (`perm[i]`: the concatenated row of packed row `i`).
    fn unpermute(&self, mut pieces: Vec<Tensor>, perm: Vec<u32>, n: usize) -> Result<Tensor> {
        let all = if pieces.len() == 1 {
            pieces
                .pop()
                .ok_or_else(|| ModelError::InvalidRequest("no chunk".into()))?
        } else {
            Tensor::cat(&pieces, 0)?
        };
        let perm = Tensor::from_vec(perm, n, &self.device)?;
        Ok(all.index_select(&perm, 0)?)
    }

    /// Causal attention of several independent chunks as one padded batch `[B, heads, T, hd]`.
    fn attend_padded(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pad: &Padding,
        fused: bool,
    ) -> Result<Tensor> {
        let (_, nh, hd) = q.dims3()?;
        let nkv = k.dim(1)?;
        let rep = nh / nkv;
        let (b, t) = (pad.batch, pad.max_len);
        let scale = 1.0 / (hd as f64).sqrt();
        if ops::on_cpu_kernels(q) {
            // The packed ⇄ padded reshuffles as one copy each (pure copies: the same values as
            // the composed chains below, with one backward node instead of four or five).
            let heads_first = |x: &Tensor, groups: usize| -> Result<Tensor> {
                Ok(x.contiguous()?.apply_op1(ToHeadsFirst {
                    map: pad.map.clone(),
                    groups,
                    zero_pads: false,
                })?)
            };
            let (q, k, v) = (
                heads_first(q, nkv)?,
                heads_first(k, nkv)?,
                heads_first(v, nkv)?,
            );
            let out = if fused {
                // Inference: candle's softmax kernel (it sums in another order than training).
                let scores = (q.matmul(&k.t()?)? * scale)?
                    .reshape((b, nkv, rep, t, t))?
                    .broadcast_add(&pad.mask)?
                    .reshape((b, nkv, rep * t, t))?;
                ops::softmax_last_dim(&scores, fused)?.matmul(&v)?
            } else {
                // Training: scores, scale, mask, softmax and the values in one op, which keeps
                // no `[t, t]` tensor for the backward pass (it recomputes them).
                q.apply_op3(
                    &k,
                    &v,
                    FusedAttention {
                        scale,
                        mask: CausalMask {
                            queries: t,
                            past: 0,
                            lens: pad.lens.clone(),
                        },
                    },
                )?
            };
            return Ok(out.apply_op1(FromHeadsFirst {
                map: pad.map.clone(),
                heads: nh,
                hd,
                fold_pads: false,
            })?);
        }
        let to_batch = |x: &Tensor, heads: usize| -> Result<Tensor> {
            Ok(x.index_select(&pad.gather, 0)?
                .reshape((b, t, heads, hd))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let q = to_batch(q, nh)?.reshape((b, nkv, rep * t, hd))?;
        let k = to_batch(k, nkv)?;
        let v = to_batch(v, nkv)?;
        let scores = (q.matmul(&k.t()?)? * scale)?
            .reshape((b, nkv, rep, t, t))?
            .broadcast_add(&pad.mask)?
            .reshape((b, nkv, rep * t, t))?;
        let p = ops::softmax_last_dim(&scores, fused)?;
        let out = p
            .matmul(&v)?
            .reshape((b, nh, t, hd))?
            .transpose(1, 2)?
            .reshape((b * t, nh * hd))?;
        Ok(out.index_select(&pad.scatter, 0)?)
    }

    /// Causal attention of one chunk. `q: [heads, t, hd]`, `k, v: [kv_heads, L, hd]` where the
    /// chunk's queries sit at the last `t` of the `L` key positions. Grouped-query attention is
    /// a reshape, not a copy: query heads `g·r .. g·r + r` share kv head `g`, as in `repeat_kv`.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, fused: bool) -> Result<Tensor> {
        let (nh, t, hd) = q.dims3()?;
        let (nkv, l, _) = k.dims3()?;
        let rep = nh / nkv;
        let scale = 1.0 / (hd as f64).sqrt();
        // Scaling q (t rows) is cheaper than scaling the scores (L columns).
        let q = (q.reshape((nkv, rep * t, hd))? * scale)?;
        if t > 1 && !fused && ops::on_cpu_kernels(&q) {
            // Training: scores, mask, softmax and the values in one op that keeps no `[t, l]`
            // tensor for the backward pass (q is already scaled: the scale is 1, exact), the
            // arithmetic of the ops below.
            let out = q.apply_op3(
                &k.contiguous()?,
                &v.contiguous()?,
                FusedAttention {
                    scale: 1.0,
                    mask: CausalMask {
                        queries: t,
                        past: l - t,
                        lens: vec![l],
                    },
                },
            )?;
            let out = out.reshape((nh, t, hd))?;
            return Ok(out.transpose(0, 1)?.reshape((t, nh * hd))?);
        }
        let mut scores = q.matmul(&k.t()?)?;
        if t > 1 {
            // The queries are the last t of the l key positions: query i sees keys 0 ..= past + i.
            let past = l - t;
            let mask: Vec<f32> = (0..t)
                .flat_map(|i| {
                    (0..l).map(move |j| if j > past + i { f32::NEG_INFINITY } else { 0.0 })
                })
                .collect();
            let mask = Tensor::from_vec(mask, (t, l), &self.device)?.to_dtype(self.dtype)?;
            scores = scores
                .reshape((nkv, rep, t, l))?
                .broadcast_add(&mask)?
                .reshape((nkv, rep * t, l))?;
        }
        let p = ops::softmax_last_dim(&scores, fused)?;
        let out = p.matmul(v)?.reshape((nh, t, hd))?;
        Ok(out.transpose(0, 1)?.reshape((t, nh * hd))?)
    }
}

/// Index maps between the packed layout and a padded `[B, T]` batch, and the attention mask.
struct Padding {
    batch: usize,
    max_len: usize,
    /// For each padded slot, the packed row it reads (pads repeat a real row; they are masked).
    gather: Tensor,
    /// For each packed row, its padded slot.
    scatter: Tensor,
    /// `[B, 1, 1, T, T]`: 0 where query i may see key j (j ≤ i, j real), −∞ elsewhere.
    mask: Tensor,
    /// The real length of each sequence (the same mask for [`FusedAttention`]).
    lens: Vec<usize>,
    /// The same maps for [`ToHeadsFirst`] / [`FromHeadsFirst`].
    map: PadMap,
}

impl Padding {
    fn new(spans: &[(usize, usize, usize)], device: &Device, dtype: DType) -> Result<Self> {
        let b = spans.len();
        let t = spans.iter().map(|s| s.1).max().unwrap_or(1);
        let mut gather = Vec::with_capacity(b * t);
        let mut scatter = Vec::new();
        let mut mask = Vec::with_capacity(b * t * t);
        for (bi, &(off, len, _)) in spans.iter().enumerate() {
            for i in 0..t {
                gather.push((off + i.min(len - 1)) as u32);
                if i < len {
                    scatter.push((bi * t + i) as u32);
                }
                for j in 0..t {
                    // A pad query row still needs one visible key to keep softmax finite.
                    let visible = j <= i.min(len - 1);
                    mask.push(if visible { 0f32 } else { f32::NEG_INFINITY });
                }
            }
        }
        let n_scatter = scatter.len();
        Ok(Padding {
            batch: b,
            max_len: t,
            gather: Tensor::from_vec(gather, b * t, device)?,
            scatter: Tensor::from_vec(scatter, n_scatter, device)?,
            mask: Tensor::from_vec(mask, (b, 1, 1, t, t), device)?.to_dtype(dtype)?,
            lens: spans.iter().map(|s| s.1).collect(),
            map: PadMap {
                spans: spans.iter().map(|&(off, len, _)| (off, len)).collect(),
                t,
            },
        })
    }
}

fn rope_tables(cfg: &ModelConfig, dtype: DType, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = cfg.head_dim / 2;
    let max = cfg.max_position_embeddings;
    let mut cos = Vec::with_capacity(max * half);
    let mut sin = Vec::with_capacity(max * half);
    for p in 0..max {
        for i in 0..half {
            let inv_freq = 1.0 / cfg.rope_theta.powf((2 * i) as f64 / cfg.head_dim as f64);
            let a = p as f64 * inv_freq;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    let cos = Tensor::from_vec(cos, (max, half), device)?.to_dtype(dtype)?;
    let sin = Tensor::from_vec(sin, (max, half), device)?.to_dtype(dtype)?;
    Ok((cos, sin))
}
