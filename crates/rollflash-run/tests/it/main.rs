//! Integration tests of `rollflash-run`'s API: the run plan and the stack it builds.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod python_reward;
mod shutdown;
mod stop_tokens;
