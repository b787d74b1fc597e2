//! The model crate's one integration-test binary.

mod common;
mod gguf;
mod load;
mod model;
mod reference;
mod tokenizer;
mod train;
