//! `rollflash-model`: the embedded policy engine.
//!
//! One transformer implementation (Llama / Qwen2 / Qwen3 families, and the small built-in
//! default) serves generation with a KV cache and continuous batching, and the differentiable
//! training forward. Tensor code stays behind this crate's own types so that other crates never
//! touch candle directly.

pub mod chat;
pub mod config;
pub mod engine;
mod error;
pub mod gguf;
pub mod hf;
pub mod model;
mod ops;
pub mod sampling;
pub mod tokenizer;
pub mod train;
pub mod weights;

pub use error::{ModelError, Result};
