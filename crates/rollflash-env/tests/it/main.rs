//! Integration tests of `rollflash-env`: verifiers, datasets, environments, remote envs.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod code;
mod dataset;
mod dataset_task;
mod envs;
mod fuzz_remote;
mod latency;
mod math_task;
mod openenv;
mod python_reward;
mod remote;
mod verify;
mod verl_format;
