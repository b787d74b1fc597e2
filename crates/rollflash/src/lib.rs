//! `rollflash` as a library: the pieces that join the rollout plane and the trainer — the
//! asynchronous controller (and, with α = 0 and a barrier, the synchronous baseline).
//! The command line in `main.rs` is built on it.

pub mod config;
pub mod controller;
pub mod learner;
pub mod pipeline;
pub mod warmup;

pub use controller::{
    AsyncController, ControllerConfig, ControllerError, Learner, LearnerError, RunReport,
    StepRecord, StepStats,
};
