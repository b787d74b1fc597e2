//! The model crate's one integration-test binary.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod builtin_dir;
mod common;
mod gguf;
mod load;
mod lora;
mod model;
mod peft;
mod reference;
mod tokenizer;
mod train;
