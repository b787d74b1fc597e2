//! `rollflash-trainer`: the controller and the trainer. [`AsyncController`] drives the
//! controller core (`rollflash_core::controller`) with real tasks — group rollouts through
//! the [`GroupRunner`] seam, training steps through the [`Learner`] seam on blocking
//! threads, weight syncs through the proxy — and shows each published step to a
//! [`StepSink`]. [`PolicyLearner`] is the real training step ([`conformance`] the suite every
//! `Learner` passes); [`supervised_step`] the
//! warm-ups' step; [`StopFlag`] the one-way stop request every phase of a run watches.
//!
//! It depends on no command line, plotting or simulator crate: embed it to run the loop.

pub mod conformance;
pub mod controller;
pub mod learner;
pub mod stop;
pub mod supervised;
pub mod tinker;

pub use controller::{
    AsyncController, ControllerConfig, ControllerError, CoreConfig, Cursor, EnvGroups, GroupRunner,
    Learner, LearnerError, NoSink, ResumeFrom, RunReport, SinkError, StallReport, StepRecord,
    StepSink, StepStats, DEFAULT_PROGRESS_TIMEOUT, DEFAULT_SERVE_TIMEOUT, DEFAULT_STALL_REPORT,
};
pub use learner::{batch_advantages, Advantages, LearnerConfig, PackedBatch, PolicyLearner};
pub use rollflash_core::controller::RunEnd;
pub use stop::StopFlag;
pub use supervised::supervised_step;
pub use tinker::{TinkerLearner, TinkerLearnerConfig, TinkerLossPath};
