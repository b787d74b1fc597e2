//! Named weight tensors with Hugging Face names: random init, safetensors load/save, deep copies.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rollflash_core::IoError;

use crate::config::ModelConfig;
use crate::{ModelError, Result};

/// A set of tensors keyed by their Hugging Face checkpoint names
/// (`model.layers.0.self_attn.q_proj.weight`, ...). Cloning is cheap (tensors are shared);
/// [`Weights::deep_copy`] makes an independent snapshot.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    tensors: HashMap<String, Tensor>,
}

impl Weights {
    /// Wraps an existing map.
    pub fn from_map(tensors: HashMap<String, Tensor>) -> Self {
        Weights { tensors }
    }

    /// The tensor called `name`, checked against the shape the config implies and cast to
    /// `dtype`.
    pub fn get(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
        if t.dims() != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.into(),
                expected: shape.to_vec(),
                got: t.dims().to_vec(),
            });
        }
        Ok(t.to_dtype(dtype)?)
    }

    /// Whether a tensor called `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Inserts or replaces a tensor.
    pub fn insert(&mut self, name: impl Into<String>, t: Tensor) {
        self.tensors.insert(name.into(), t);
    }

    /// Names in sorted order (stable across runs).
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// The underlying map.
    pub fn tensors(&self) -> &HashMap<String, Tensor> {
        &self.tensors
    }

    /// Number of scalar parameters.
    pub fn num_parameters(&self) -> usize {
        self.tensors.values().map(|t| t.elem_count()).sum()
    }

    /// An independent copy: later in-place updates of `self` (an optimizer step) do not show.
    pub fn deep_copy(&self) -> Result<Self> {
        let mut tensors = HashMap::with_capacity(self.tensors.len());
        for (k, v) in &self.tensors {
            tensors.insert(k.clone(), v.detach().copy()?);
        }
        Ok(Weights { tensors })
    }

    /// The largest absolute elementwise difference from `other` over all tensors (in f64):
    /// how far two checkpoints, or a model before and after a step, are apart. A tensor that
    /// only one side holds, or holds in another shape, counts as infinitely different.
    pub fn max_abs_diff(&self, other: &Weights) -> Result<f64> {
        let mut max = 0.0f64;
        let names = self.tensors.keys().chain(other.tensors.keys());
        for name in names {
            let (Some(a), Some(b)) = (self.tensors.get(name), other.tensors.get(name)) else {
                return Ok(f64::INFINITY);
            };
            if a.dims() != b.dims() {
                return Ok(f64::INFINITY);
            }
            let d = (a.to_dtype(DType::F64)? - b.to_dtype(DType::F64)?)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f64>()?;
            max = max.max(d);
        }
        Ok(max)
    }

    /// Casts every tensor.
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        let mut tensors = HashMap::with_capacity(self.tensors.len());
        for (k, v) in &self.tensors {
            tensors.insert(k.clone(), v.to_dtype(dtype)?);
        }
        Ok(Weights { tensors })
    }

    /// Random initialisation for `cfg`, seeded: matrices ~ N(0, 0.02²) (as `transformers`
    /// initialises Llama/Qwen), norms = 1, biases = 0.
    pub fn random(cfg: &ModelConfig, seed: u64, dtype: DType, device: &Device) -> Result<Self> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut w = Weights::default();
        for (name, shape, kind) in tensor_specs(cfg) {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = match kind {
                Init::Normal => (0..n).map(|_| 0.02 * normal(&mut rng)).collect(),
                Init::Ones => vec![1.0; n],
                Init::Zeros => vec![0.0; n],
            };
            let t = Tensor::from_vec(data, shape.as_slice(), device)?.to_dtype(dtype)?;
            w.insert(name, t);
        }
        Ok(w)
    }

    /// Loads one or more safetensors files (all tensors, in their stored dtype).
    pub fn load_safetensors(paths: &[PathBuf], device: &Device) -> Result<Self> {
        let mut tensors = HashMap::new();
        for p in paths {
            if !p.exists() {
                return Err(ModelError::MissingFile {
                    path: p.clone(),
                    what: "safetensors weights",
                });
            }
            let part = candle_core::safetensors::load(p, device).map_err(|e| match e {
                candle_core::Error::UnsupportedDTypeForOp(d, _) => ModelError::UnsupportedDtype {
                    name: p.display().to_string(),
                    dtype: format!("{d:?}"),
                },
                // Name the file: candle's message alone ("incomplete metadata") does not.
                source => ModelError::Safetensors {
                    path: p.clone(),
                    source: Box::new(source),
                },
            })?;
            for (k, t) in part {
                let t = match t.dtype() {
                    DType::F32 | DType::F64 | DType::BF16 | DType::F16 => t,
                    other => {
                        return Err(ModelError::UnsupportedDtype {
                            name: k,
                            dtype: format!("{other:?}"),
                        })
                    }
                };
                tensors.insert(k, t);
            }
        }
        Ok(Weights { tensors })
    }

    /// Writes all tensors to one safetensors file (contiguous copies, stored dtype).
    pub fn save_safetensors(&self, path: &Path) -> Result<()> {
        let mut map = HashMap::with_capacity(self.tensors.len());
        for (k, v) in &self.tensors {
            map.insert(k.clone(), v.detach().contiguous()?);
        }
        candle_core::safetensors::save(&map, path).map_err(|e| match e {
            candle_core::Error::Io(source) => IoError::new("cannot write", path, source).into(),
            other => ModelError::Tensor(other),
        })
    }
}

enum Init {
    Normal,
    Ones,
    Zeros,
}

/// Every tensor a model of `cfg` has, with its Hugging Face name and shape.
fn tensor_specs(cfg: &ModelConfig) -> Vec<(String, Vec<usize>, Init)> {
    let h = cfg.hidden_size;
    let q = cfg.num_attention_heads * cfg.head_dim;
    let kv = cfg.num_key_value_heads * cfg.head_dim;
    let i = cfg.intermediate_size;
    let mut v = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
        Init::Normal,
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        v.push((format!("{p}.input_layernorm.weight"), vec![h], Init::Ones));
        v.push((
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Init::Ones,
        ));
        for (n, out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            v.push((
                format!("{p}.self_attn.{n}.weight"),
                vec![out, h],
                Init::Normal,
            ));
            if cfg.attention_bias {
                v.push((format!("{p}.self_attn.{n}.bias"), vec![out], Init::Zeros));
            }
        }
        v.push((
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, q],
            Init::Normal,
        ));
        if cfg.qk_norm {
            v.push((
                format!("{p}.self_attn.q_norm.weight"),
                vec![cfg.head_dim],
                Init::Ones,
            ));
            v.push((
                format!("{p}.self_attn.k_norm.weight"),
                vec![cfg.head_dim],
                Init::Ones,
            ));
        }
        v.push((
            format!("{p}.mlp.gate_proj.weight"),
            vec![i, h],
            Init::Normal,
        ));
        v.push((format!("{p}.mlp.up_proj.weight"), vec![i, h], Init::Normal));
        v.push((
            format!("{p}.mlp.down_proj.weight"),
            vec![h, i],
            Init::Normal,
        ));
    }
    v.push(("model.norm.weight".to_string(), vec![h], Init::Ones));
    if !cfg.tie_word_embeddings {
        v.push((
            "lm_head.weight".to_string(),
            vec![cfg.vocab_size, h],
            Init::Normal,
        ));
    }
    v
}

/// One standard normal draw (Box–Muller), so initialisation depends only on our seeded RNG.
fn normal(rng: &mut ChaCha8Rng) -> f32 {
    use rand::Rng;
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}
