//! Low-rank adapters (LoRA) as Hugging Face PEFT defines them: configuration, initialisation,
//! merging, and PEFT's on-disk layout.
//!
//! An adapted projection computes `W x + b + (alpha / r) · B (A (dropout(x)))` with the base
//! `W`, `b` frozen, `A: [r, in]` and `B: [out, r]` trained (PEFT `tuners/lora/layer.py`,
//! `Linear.forward`; `scaling = lora_alpha / r`, rsLoRA off). `A` starts Kaiming-uniform with
//! `a = √5` — for a `[r, in]` matrix that is `U(−1/√in, 1/√in)` — and `B` at zero, so a fresh
//! adapter leaves the model unchanged (PEFT `reset_lora_parameters`, `init_lora_weights=True`).
//!
//! Adapter tensors carry PEFT's saved names from the start,
//! `base_model.model.<module path>.lora_A.weight` (no adapter name: PEFT strips it when saving,
//! `utils/save_and_load.py`), so the optimizer state, checkpoints and the saved adapter all use
//! one naming. [`save_peft`] writes `adapter_config.json` and `adapter_model.safetensors`, which
//! `peft.PeftModel.from_pretrained(base, dir)` loads.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollflash_core::IoError;
use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::weights::Weights;
use crate::{ModelError, Result};

/// The file PEFT reads an adapter's settings from.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The file PEFT reads an adapter's tensors from.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// The seven projections of a decoder layer LoRA can adapt, as (PEFT target name, module path
/// inside the layer). The order is the forward's; it also fixes each site's dropout stream.
pub const PROJECTIONS: [(&str, &str); 7] = [
    ("q_proj", "self_attn.q_proj"),
    ("k_proj", "self_attn.k_proj"),
    ("v_proj", "self_attn.v_proj"),
    ("o_proj", "self_attn.o_proj"),
    ("gate_proj", "mlp.gate_proj"),
    ("up_proj", "mlp.up_proj"),
    ("down_proj", "mlp.down_proj"),
];

/// LoRA settings: the `[train.lora]` section of a run's config, and what
/// `adapter_config.json` records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapter rank `r` (PEFT's default, 8).
    pub rank: usize,
    /// `lora_alpha`; the update is scaled by `alpha / rank` (PEFT's default, 8).
    pub alpha: f64,
    /// Dropout on the adapter's input during training (PEFT's default, 0). Off by default for
    /// RL as well: with dropout the training forward no longer reproduces the engine's
    /// log-probs, so the importance ratio carries dropout noise.
    pub dropout: f64,
    /// Projections that get an adapter, by PEFT target name (all seven by default: attention
    /// and MLP, as QLoRA recommends).
    pub target_modules: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 8,
            alpha: 8.0,
            dropout: 0.0,
            target_modules: PROJECTIONS.iter().map(|(n, _)| n.to_string()).collect(),
        }
    }
}

impl LoraConfig {
    /// The factor on the adapter's output, `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether the projection called `name` (a PEFT target name such as `q_proj`) is adapted.
    pub fn targets(&self, name: &str) -> bool {
        self.target_modules.iter().any(|t| t == name)
    }

    /// Checks every field; errors name it as `<prefix>.<field>`.
    pub fn validate(&self, prefix: &str) -> Result<()> {
        let bad = |field: &str, reason: String| ModelError::Config {
            field: format!("{prefix}.{field}"),
            reason,
        };
        if self.rank == 0 {
            return Err(bad("rank", "must be at least 1".into()));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(bad(
                "alpha",
                format!("must be positive and finite, got {}", self.alpha),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(bad(
                "dropout",
                format!("must be in [0, 1), got {}", self.dropout),
            ));
        }
        if self.target_modules.is_empty() {
            return Err(bad("target_modules", "names no projection".into()));
        }
        for t in &self.target_modules {
            if !PROJECTIONS.iter().any(|(n, _)| n == t) {
                let known: Vec<&str> = PROJECTIONS.iter().map(|(n, _)| *n).collect();
                return Err(bad(
                    "target_modules",
                    format!("unknown projection `{t}` (known: {})", known.join(", ")),
                ));
            }
        }
        Ok(())
    }
}

/// Which of a projection's two adapter matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Factor {
    /// `A: [r, in]`, applied first.
    A,
    /// `B: [out, r]`.
    B,
}

/// PEFT's saved name of one adapter matrix: `base_model.model.<module path>.lora_A.weight`,
/// where the module path is the base tensor's name without `.weight`.
pub fn adapter_name(layer: usize, module: &str, factor: Factor) -> String {
    let ab = match factor {
        Factor::A => "A",
        Factor::B => "B",
    };
    format!("base_model.model.model.layers.{layer}.{module}.lora_{ab}.weight")
}

/// `(in, out)` features of each projection of `cfg`, in [`PROJECTIONS`] order.
fn projection_dims(cfg: &ModelConfig) -> [(usize, usize); 7] {
    let h = cfg.hidden_size;
    let q = cfg.num_attention_heads * cfg.head_dim;
    let kv = cfg.num_key_value_heads * cfg.head_dim;
    let i = cfg.intermediate_size;
    [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
}

/// Every adapter tensor `lora` gives a model of `cfg`: name and shape, sorted by name.
pub fn adapter_shapes(cfg: &ModelConfig, lora: &LoraConfig) -> BTreeMap<String, Vec<usize>> {
    let mut out = BTreeMap::new();
    let dims = projection_dims(cfg);
    for l in 0..cfg.num_hidden_layers {
        for (&(target, module), &(inp, outp)) in PROJECTIONS.iter().zip(&dims) {
            if lora.targets(target) {
                out.insert(adapter_name(l, module, Factor::A), vec![lora.rank, inp]);
                out.insert(adapter_name(l, module, Factor::B), vec![outp, lora.rank]);
            }
        }
    }
    out
}

/// Fresh adapters as PEFT initialises them: `A` uniform in `±1/√in` (Kaiming-uniform with
/// `a = √5`), `B` zero. Seeded; the draws depend only on `seed` and the tensor's name order.
pub fn init_adapters(
    cfg: &ModelConfig,
    lora: &LoraConfig,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<Weights> {
    lora.validate("lora")?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut w = Weights::default();
    for (name, shape) in adapter_shapes(cfg, lora) {
        let n: usize = shape.iter().product();
        let data: Vec<f64> = if name.ends_with(".lora_A.weight") {
            // gain = √(2 / (1 + a²)) = √(1/3); bound = √3 · gain / √fan_in = 1 / √fan_in.
            let bound = 1.0 / (shape[1] as f64).sqrt();
            (0..n)
                .map(|_| bound * (2.0 * rng.random::<f64>() - 1.0))
                .collect()
        } else {
            vec![0.0; n]
        };
        let t = Tensor::from_vec(data, shape.as_slice(), device)?.to_dtype(dtype)?;
        w.insert(name, t);
    }
    Ok(w)
}

/// Checks that `adapters` holds exactly the tensors `lora` gives `cfg`, in their shapes.
pub fn check_adapters(cfg: &ModelConfig, lora: &LoraConfig, adapters: &Weights) -> Result<()> {
    let want = adapter_shapes(cfg, lora);
    for (name, shape) in &want {
        let t = adapters
            .tensors()
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.clone() })?;
        if t.dims() != shape.as_slice() {
            return Err(ModelError::ShapeMismatch {
                name: name.clone(),
                expected: shape.clone(),
                got: t.dims().to_vec(),
            });
        }
    }
    if let Some(extra) = adapters
        .names()
        .into_iter()
        .find(|n| !want.contains_key(*n))
    {
        return Err(ModelError::Config {
            field: extra.to_string(),
            reason: "adapter tensor of no targeted projection".into(),
        });
    }
    Ok(())
}

/// A model's adapters: the settings and the `A`/`B` matrices under PEFT's names.
#[derive(Debug, Clone)]
pub struct Adapters {
    pub config: LoraConfig,
    pub weights: Weights,
}

impl Adapters {
    /// `A` and `B` of one projection, when it is adapted.
    pub(crate) fn pair(&self, layer: usize, module: &str) -> Option<(Tensor, Tensor)> {
        let t = self.weights.tensors();
        let a = t.get(&adapter_name(layer, module, Factor::A))?;
        let b = t.get(&adapter_name(layer, module, Factor::B))?;
        Some((a.clone(), b.clone()))
    }

    /// The base weights with every adapter folded in, `W + (alpha/r)·B·A`, computed in f64
    /// and stored in each base tensor's dtype: what a server that knows nothing of LoRA loads.
    pub fn merge_into(&self, cfg: &ModelConfig, base: &Weights) -> Result<Weights> {
        let mut out = base.clone();
        let scale = self.config.scale();
        for l in 0..cfg.num_hidden_layers {
            for (_, module) in PROJECTIONS {
                let Some((a, b)) = self.pair(l, module) else {
                    continue;
                };
                let name = format!("model.layers.{l}.{module}.weight");
                let w = base
                    .tensors()
                    .get(&name)
                    .ok_or_else(|| ModelError::MissingTensor { name: name.clone() })?;
                let delta = b
                    .to_dtype(DType::F64)?
                    .matmul(&a.to_dtype(DType::F64)?)?
                    .affine(scale, 0.0)?;
                let merged = (w.to_dtype(DType::F64)? + delta)?.to_dtype(w.dtype())?;
                out.insert(name, merged);
            }
        }
        Ok(out)
    }
}

/// `adapter_config.json` as PEFT writes it for a causal LM (the fields PEFT needs to rebuild
/// the adapter; it fills the rest with its defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PeftConfigFile {
    peft_type: String,
    task_type: String,
    r: usize,
    lora_alpha: f64,
    lora_dropout: f64,
    target_modules: Vec<String>,
    bias: String,
    base_model_name_or_path: Option<String>,
    fan_in_fan_out: bool,
    use_rslora: bool,
    inference_mode: bool,
    init_lora_weights: bool,
}

/// Writes `adapters` in PEFT's layout into `dir` (which must exist): `adapter_config.json`
/// naming `base_model` (a Hugging Face id or directory), and `adapter_model.safetensors`.
pub fn save_peft(dir: &Path, adapters: &Adapters, base_model: &str) -> Result<()> {
    let c = &adapters.config;
    let file = PeftConfigFile {
        peft_type: "LORA".into(),
        task_type: "CAUSAL_LM".into(),
        r: c.rank,
        lora_alpha: c.alpha,
        lora_dropout: c.dropout,
        target_modules: c.target_modules.clone(),
        bias: "none".into(),
        base_model_name_or_path: Some(base_model.to_string()),
        fan_in_fan_out: false,
        use_rslora: false,
        inference_mode: true,
        init_lora_weights: true,
    };
    let path = dir.join(ADAPTER_CONFIG);
    let text = serde_json::to_string_pretty(&file).map_err(|source| ModelError::Json {
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, text).map_err(IoError::at("cannot write", &path))?;
    adapters
        .weights
        .save_safetensors(&dir.join(ADAPTER_WEIGHTS))
}

/// Whether `dir` holds a PEFT adapter.
pub fn has_peft(dir: &Path) -> bool {
    dir.join(ADAPTER_CONFIG).is_file()
}

/// Reads a PEFT LoRA adapter from `dir`. Refuses what we cannot apply exactly: another PEFT
/// method, rsLoRA, transposed (`fan_in_fan_out`) weights, trained biases.
pub fn load_peft(dir: &Path, device: &Device) -> Result<Adapters> {
    let path = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path).map_err(IoError::at("cannot read", &path))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: path.clone(),
        source,
    })?;
    let field = |f: &str| v.get(f);
    let bad = |f: &str, reason: String| ModelError::Config {
        field: format!("{}: {f}", path.display()),
        reason,
    };
    let peft_type = field("peft_type").and_then(|x| x.as_str()).unwrap_or("");
    if peft_type != "LORA" {
        return Err(bad("peft_type", format!("`{peft_type}`, expected `LORA`")));
    }
    for flag in ["use_rslora", "fan_in_fan_out", "use_dora"] {
        if field(flag).and_then(|x| x.as_bool()).unwrap_or(false) {
            return Err(bad(flag, "not supported".into()));
        }
    }
    let bias = field("bias").and_then(|x| x.as_str()).unwrap_or("none");
    if bias != "none" {
        return Err(bad("bias", format!("`{bias}`, only `none` is supported")));
    }
    let rank = field("r")
        .and_then(|x| x.as_u64())
        .ok_or_else(|| bad("r", "missing".into()))? as usize;
    let alpha = field("lora_alpha")
        .and_then(|x| x.as_f64())
        .ok_or_else(|| bad("lora_alpha", "missing".into()))?;
    let dropout = field("lora_dropout")
        .and_then(|x| x.as_f64())
        .unwrap_or(0.0);
    let weights = Weights::load_safetensors(&[dir.join(ADAPTER_WEIGHTS)], device)?;
    let target_modules = match field("target_modules") {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|t| t.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("target_modules", "not a list of names".into()))?,
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        // PEFT leaves it `null` when the adapter was not built by PEFT's model wrapper
        // (SkyRL's Tinker server saves its adapters so): the weights say which modules.
        Some(serde_json::Value::Null) | None => adapted_modules(&weights),
        Some(_) => return Err(bad("target_modules", "not a list of names".into())),
    };
    let config = LoraConfig {
        rank,
        alpha,
        dropout,
        target_modules,
    };
    config.validate(&path.display().to_string())?;
    Ok(Adapters { config, weights })
}

/// The projections an adapter's weights adapt: the module named before each `.lora_A.`, in
/// [`PROJECTIONS`]' order. An unknown one is kept, so validation names it.
fn adapted_modules(weights: &Weights) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for name in weights.names() {
        let Some(module) = name
            .split_once(".lora_A.")
            .and_then(|(path, _)| path.rsplit('.').next())
        else {
            continue;
        };
        if !found.iter().any(|m| m == module) {
            found.push(module.to_string());
        }
    }
    let order = |m: &String| PROJECTIONS.iter().position(|(n, _)| n == m);
    found.sort_by_key(|m| order(m).unwrap_or(usize::MAX));
    found
}

/// Inverted dropout of `x` with keep probability `1 − p`: each element kept (scaled by
/// `1/(1 − p)`) or zeroed by a draw of a stream seeded with `seed`, so a training forward is
/// reproducible and the finite-difference test sees the same mask every time.
pub(crate) fn dropout(x: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
    Ok((x * dropout_mask_tensor(x, p, seed)?)?)
}

/// The `n` mask values of [`dropout`]: `0` or `1/(1 − p)`, in element order.
pub(crate) fn dropout_mask(n: usize, p: f64, seed: u64) -> impl Iterator<Item = f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let keep = 1.0 / (1.0 - p);
    (0..n).map(move |_| if rng.random::<f64>() < p { 0.0 } else { keep })
}

/// [`dropout`]'s mask for `x`, in `x`'s shape, dtype and device.
pub(crate) fn dropout_mask_tensor(x: &Tensor, p: f64, seed: u64) -> candle_core::Result<Tensor> {
    let mask: Vec<f64> = dropout_mask(x.elem_count(), p, seed).collect();
    Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())
}

/// The dropout stream of one adapted projection in one forward: the forward's seed mixed
/// with the site (SplitMix64 finaliser), so sites draw independent masks.
pub(crate) fn site_seed(seed: u64, layer: usize, projection: usize) -> u64 {
    let site = ((layer as u64) << 8) | projection as u64;
    let mut z = seed ^ site.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
