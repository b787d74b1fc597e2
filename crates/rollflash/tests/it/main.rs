//! Integration tests of the `rollflash` crate: the binary as real processes on loopback
//! ports, and the runs whose helpers those share (resume, LoRA, algorithms; the run API's
//! own tests are `rollflash-run`'s).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod algo;
mod bad_models;
mod bench_rl;
mod crash;
mod dashboard;
mod dataset;
mod env_serve;
mod eval;
mod fleet;
mod interrupt;
mod lora;
mod remote_env;
mod resume;
mod secrets;
mod serve;
mod serve_faults;
mod tensorboard;
mod tinker;
mod util;
mod verify;
mod verl;
mod warmup_cache;
