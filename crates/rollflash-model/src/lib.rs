//! `rollflash-model`: the embedded policy engine.
//!
//! One transformer implementation (Llama / Qwen2 / Qwen3 families, and the small built-in
//! default) serves generation with a KV cache and continuous batching, and the differentiable
//! training forward. Tensor code stays behind this crate's own types so that other crates never
//! touch candle directly.
//!
//! Generate with continuous batching, then score the same tokens with the training forward:
//!
//! ```
//! use std::sync::Arc;
//! use candle_core::{DType, Device};
//! use rollflash_core::{PolicyVersion, RequestId};
//! use rollflash_model::config::{Arch, ModelConfig};
//! use rollflash_model::engine::{Engine, EngineConfig, EngineRequest};
//! use rollflash_model::model::Transformer;
//! use rollflash_model::sampling::SamplingParams;
//! use rollflash_model::train::token_stats;
//! use rollflash_model::weights::Weights;
//!
//! # fn main() -> rollflash_model::Result<()> {
//! let cfg = ModelConfig::tiny(Arch::Qwen3, 32);
//! let weights = Weights::random(&cfg, 0, DType::F32, &Device::Cpu)?;
//! let model = Arc::new(Transformer::from_weights(&cfg, &weights, DType::F32, &Device::Cpu)?);
//! let mut engine = Engine::new(Arc::clone(&model), PolicyVersion(0), EngineConfig::default())?;
//! let prompt = vec![1, 2, 3];
//! engine.submit(EngineRequest {
//!     id: RequestId(7),
//!     prompt: prompt.clone(),
//!     params: SamplingParams { max_new_tokens: 5, seed: Some(1), ..Default::default() },
//!     resume: None,
//! })?;
//! let done = engine.run_to_completion()?;
//! let out = &done[0].output;
//! assert_eq!(out.len(), 5);
//!
//! // The trainer's log-prob of each sampled token equals the one recorded at generation.
//! let seq: Vec<u32> = prompt.iter().chain(&out.tokens).copied().collect();
//! let lp: Vec<f32> = token_stats(&model, &[&seq], 1.0, false)?.logprobs.to_vec1()?;
//! for (i, &behaviour) in out.logprobs.iter().enumerate() {
//!     assert!((lp[prompt.len() + i] - behaviour).abs() < 1e-4);
//! }
//! # Ok(())
//! # }
//! ```

pub mod chat;
pub mod config;
mod decode_attention;
pub mod engine;
mod error;
mod fused;
pub mod gguf;
pub mod hf;
pub mod lora;
mod lora_linear;
pub mod model;
mod ops;
pub mod sampling;
pub mod tokenizer;
mod tokenizer_config;
pub mod train;
pub mod weights;

pub use error::{ModelError, Result};

/// The instruction set this build's CPU kernels (gemm's matmuls and this crate's own) run with
/// on this machine: `"avx512"` where the CPU has AVX-512 and the `avx512` feature is built in,
/// `"avx2"` on x86-64 with AVX2 and FMA, else `"baseline"`. Benchmarks print it, because the
/// same build runs different kernels on the pool's AVX-512 and AVX2-only machines.
pub fn cpu_kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        #[cfg(feature = "avx512")]
        if pulp::x86::V4::try_new().is_some() {
            return "avx512";
        }
        if pulp::x86::V3::try_new().is_some() {
            return "avx2";
        }
    }
    "baseline"
}
