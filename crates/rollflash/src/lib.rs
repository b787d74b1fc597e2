//! `rollflash` as a library: the pieces that join the rollout plane and the trainer — the
//! asynchronous controller (and, with α = 0 and a barrier, the synchronous baseline).
//! The command line in `main.rs` is built on it.

pub mod agentic_warmup;
pub mod bench_rl;
pub mod checkpoint;
pub mod config;
pub mod controller;
pub mod learner;
pub mod metrics;
pub mod pipeline;
pub mod progress;
pub mod prometheus;
pub mod report;
pub mod stop;
pub mod warmup;

pub use controller::{
    AsyncController, ControllerConfig, ControllerError, Cursor, Learner, LearnerError, NoSink,
    ResumeFrom, RunReport, SinkError, StepRecord, StepSink, StepStats,
};
pub use stop::StopFlag;
