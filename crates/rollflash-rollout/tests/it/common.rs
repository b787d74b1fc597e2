//! Shared test fixtures: tiny random models and engine backends.

use std::sync::Arc;

use candle_core::{DType, Device};
use rollflash_core::PolicyVersion;
use rollflash_model::config::{Arch, ModelConfig};
use rollflash_model::engine::EngineConfig;
use rollflash_model::model::Transformer;
use rollflash_model::weights::Weights;
use rollflash_rollout::{EngineBackend, EngineBackendConfig};

/// Vocabulary of the tiny test models.
pub const VOCAB: usize = 64;

/// A tiny Qwen3-shaped model with random weights scaled up so greedy outputs vary.
pub fn tiny_model(seed: u64) -> Arc<Transformer> {
    tiny_model_with_vocab(seed, VOCAB)
}

/// As [`tiny_model`], with the given vocabulary (100 covers the built-in tokenizer).
pub fn tiny_model_with_vocab(seed: u64, vocab: usize) -> Arc<Transformer> {
    let cfg = ModelConfig::tiny(Arch::Qwen3, vocab);
    let w = Weights::random(&cfg, seed, DType::F32, &Device::Cpu).unwrap();
    let mut sharp = Weights::default();
    for name in w.names() {
        let t = &w.tensors()[name];
        let t = if name.ends_with("norm.weight") {
            t.clone()
        } else {
            (t * 20.0).unwrap()
        };
        sharp.insert(name, t);
    }
    Arc::new(Transformer::from_weights(&cfg, &sharp, DType::F32, &Device::Cpu).unwrap())
}

/// An engine worker over `tiny_model(seed)`.
pub fn engine_backend(name: &str, seed: u64, max_running: usize) -> Arc<EngineBackend> {
    engine_backend_over(name, tiny_model(seed), max_running)
}

/// An engine worker over `model`.
pub fn engine_backend_over(
    name: &str,
    model: Arc<Transformer>,
    max_running: usize,
) -> Arc<EngineBackend> {
    Arc::new(
        EngineBackend::start(
            model,
            PolicyVersion(0),
            EngineBackendConfig {
                name: name.into(),
                engine: EngineConfig {
                    max_running_requests: max_running,
                    max_prefill_tokens: 4096,
                    threads: 1,
                },
            },
        )
        .unwrap(),
    )
}
