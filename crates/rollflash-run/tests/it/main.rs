//! Integration tests of `rollflash-run`'s API: the run plan and the stack it builds, and whole
//! runs through `pipeline` (resume, crash safety, LoRA, the algorithms, OpenEnv, Prometheus,
//! shutdown). The tests of the `rollflash` binary as a process are that crate's.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agentic;
mod algo;
mod config;
mod crash;
mod eval;
mod fuzz_config;
mod lora;
mod openenv;
mod prometheus;
mod python_reward;
mod renderer;
mod resume;
mod shutdown;
mod stop_tokens;
// Shared with the `rollflash` binary's tests, which include this file by path (see its doc).
mod tiny_run;

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
