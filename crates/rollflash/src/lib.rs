//! `rollflash` as a library: the pieces that join the rollout plane and the trainer — the
//! asynchronous controller (and, with α = 0 and a barrier, the synchronous baseline).
//! The command line in `main.rs` is built on it.

pub mod agentic_warmup;
pub mod bench_rl;
pub mod checkpoint;
pub mod config;
pub mod metrics;
pub mod pipeline;
pub mod progress;
pub mod prometheus;
pub mod report;
pub mod warmup;

// The controller and the learner live in `rollflash-trainer`; re-exported so callers of the
// run assembly see one set of names.
pub use rollflash_trainer::{
    controller, learner, stop, AsyncController, ControllerConfig, ControllerError, Cursor, Learner,
    LearnerError, NoSink, ResumeFrom, RunReport, SinkError, StepRecord, StepSink, StepStats,
    StopFlag,
};
