//! Integration tests of the `rollflash` crate: the run assembly, and the binary as real
//! processes on loopback ports.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod algo;
mod bad_models;
mod bench_rl;
mod config;
mod crash;
mod dashboard;
mod dataset;
mod env_serve;
mod eval;
mod fleet;
mod fuzz_config;
mod interrupt;
mod lora;
mod openenv;
mod prometheus;
mod remote_env;
mod resume;
mod secrets;
mod serve;
mod serve_faults;
mod tensorboard;
mod tinker;
mod util;
mod verl;
mod warmup_cache;

/// An error and its causes on one line, as the binary prints them: tests assert on what a
/// user reads, and a message names only its context (the cause is its source).
trait ChainText {
    fn chain_text(&self) -> String;
}

impl<E: std::error::Error> ChainText for E {
    fn chain_text(&self) -> String {
        rollflash_core::error_chain(self)
    }
}
