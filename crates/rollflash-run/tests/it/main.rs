//! Integration tests of `rollflash-run`'s API: the run plan and the stack it builds.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod config;
mod fuzz_config;
mod openenv;
mod prometheus;
mod python_reward;
mod shutdown;
mod stop_tokens;

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
