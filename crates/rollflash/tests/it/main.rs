//! Integration tests of the `rollflash` crate: the controller, and the binary as real
//! processes on loopback ports.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bad_models;
mod bench_rl;
mod config;
mod controller;
mod env_serve;
mod eval;
mod faults;
mod fuzz_config;
mod interrupt;
mod learner;
mod prometheus;
mod resume;
mod secrets;
mod serve;
mod serve_faults;
mod util;
