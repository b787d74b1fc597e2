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
    ///
    /// The draws are one ChaCha8 stream read in order: the `k`-th normal draw of the model
    /// (counting every `Normal` tensor's elements in `tensor_specs` order) reads words
    /// `4k..4k + 4`. Chunks of it are drawn in parallel by seeking there, which gives the same
    /// numbers as reading it in one pass (a 1.5B model's 1.5G draws take a minute on one core).
    pub fn random(cfg: &ModelConfig, seed: u64, dtype: DType, device: &Device) -> Result<Self> {
        let mut w = Weights::default();
        let mut drawn: u128 = 0;
        for (name, shape, kind) in tensor_specs(cfg) {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = match kind {
                Init::Normal => {
                    let d = normal_draws(seed, drawn, n);
                    drawn += n as u128;
                    d
                }
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

/// ChaCha8 words one `normal` draw reads: two `f64`s of one `u64` (two words) each.
const WORDS_PER_NORMAL: u128 = 4;
/// Draws per parallel chunk of [`normal_draws`].
const NORMAL_CHUNK: usize = 1 << 16;

/// `0.02 * normal` draws `first..first + n` of the stream `seed`, in parallel chunks that each
/// seek to their first draw.
fn normal_draws(seed: u64, first: u128, n: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let mut data = vec![0f32; n];
    data.par_chunks_mut(NORMAL_CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_word_pos(WORDS_PER_NORMAL * (first + (i * NORMAL_CHUNK) as u128));
            for x in chunk {
                *x = 0.02 * normal(&mut rng);
            }
        });
    data
}

/// One standard normal draw (Box–Muller), so initialisation depends only on our seeded RNG.
fn normal(rng: &mut ChaCha8Rng) -> f32 {
    use rand::Rng;
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parallel draws are the one-pass stream's, from any starting draw and across chunk
    /// boundaries: `Weights::random` (the built-in model's initialisation, every warm-up's
    /// start) gives the numbers it gave when it read the stream in order.
    #[test]
    fn parallel_draws_equal_one_pass_over_the_stream() {
        let (seed, first, n) = (7u64, 12_345u128, 3 * NORMAL_CHUNK + 17);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..first {
            normal(&mut rng);
        }
        let one_pass: Vec<f32> = (0..n).map(|_| 0.02 * normal(&mut rng)).collect();
        let parallel = normal_draws(seed, first, n);
        assert_eq!(one_pass, parallel);
    }
}
