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
mod warmup_cache;
