//! Integration tests of the `rollflash` crate: the binary as real processes on loopback
//! ports (training, serving, evaluating, killed and interrupted), and `rollflash bench`'s
//! workloads (`bench_rl`). Tests of runs through the library's API (resume, crash safety,
//! LoRA, the algorithms, the plan) are `rollflash-run`'s.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bad_models;
mod bench_engine;
mod bench_rl;
mod crash;
mod dashboard;
mod dataset;
mod env_serve;
mod eval;
mod fleet;
mod interrupt;
mod remote_env;
mod secrets;
mod serve;
mod serve_faults;
mod tensorboard;
mod tinker;
// The tiny run and its checks have one home, in `rollflash-run`'s tests (whose runs through
// the API use them too); this binary's process tests include the same file.
#[path = "../../../rollflash-run/tests/it/tiny_run.rs"]
mod tiny_run;
mod util;
mod verify;
mod verl;
mod warmup_cache;
