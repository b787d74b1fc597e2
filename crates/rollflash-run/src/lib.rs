//! `rollflash-run`: a whole run from a config. [`config::TrainConfig`] is what the user
//! wrote; the pipeline (`pipeline.rs`) builds the model, the rollout plane and the learner,
//! runs the cached warm-up, the evaluations and the controller (`rollflash-trainer`), and
//! writes checkpoints, metrics, the Prometheus endpoint and the report.

pub mod agentic_warmup;
pub mod checkpoint;
pub mod config;
pub mod cores;
pub mod dashboard;
pub mod eval;
pub mod metrics;
pub mod pipeline;
pub mod plan;
pub mod preset;
pub mod progress;
pub mod prometheus;
pub mod report;
pub mod stack;
pub mod tensorboard;
pub mod verdicts;
pub mod warmup;
