//! Integration tests of `rollflash-env`: verifiers, datasets, environments, remote envs.

mod dataset;
mod envs;
mod latency;
mod math_task;
mod remote;
mod verify;
