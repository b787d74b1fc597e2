//! Shared helpers for the model tests: random models with weights large enough that the
//! output distributions are far from uniform (so comparisons are sensitive).

use candle_core::{DType, Device};
use rollflash_model::config::{Arch, ModelConfig};
use rollflash_model::model::Transformer;
use rollflash_model::weights::Weights;

pub const ARCHS: [Arch; 3] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3];

/// Random weights for `cfg`, with matrices scaled up to std ≈ 0.02·`gain` and biases and norm
/// weights perturbed, so every parameter matters.
pub fn sharp_weights(cfg: &ModelConfig, seed: u64, gain: f64, dtype: DType) -> Weights {
    let base = Weights::random(cfg, seed, DType::F64, &Device::Cpu).unwrap();
    let noise = Weights::random(cfg, seed + 1, DType::F64, &Device::Cpu).unwrap();
    let mut out = Weights::default();
    for name in base.names() {
        let t = &base.tensors()[name];
        let n = &noise.tensors()[name];
        let t = if name.ends_with("norm.weight") || name.ends_with(".bias") {
            // ones/zeros + N(0, (0.02·10)²) jitter
            (t + (n * 10.0).unwrap()).unwrap()
        } else {
            (t * gain).unwrap()
        };
        out.insert(name, t.to_dtype(dtype).unwrap());
    }
    out
}

pub fn sharp_model(cfg: &ModelConfig, seed: u64, dtype: DType) -> Transformer {
    let w = sharp_weights(cfg, seed, 10.0, dtype);
    Transformer::from_weights(cfg, &w, dtype, &Device::Cpu).unwrap()
}
