//! The model crate's one integration-test binary.

mod gguf;
mod reference;
mod tokenizer;
