//! `rollflash-env`: environments, verifiers and datasets — everything that turns model text
//! into observations and rewards. Knows nothing about tokens, tensors or backends: it speaks
//! text in and text out, so the same environment serves RLVR (one turn) and agentic
//! (many turns) rollouts, in process or behind `rollflash env-serve`.

pub mod dataset;
pub mod env;
pub mod envs;
pub mod latency;
pub mod math_task;
pub mod openenv;
pub mod remote;
pub mod verify;

pub use env::{BoxError, Env, EnvError, Info, OutOfOrder, RemoteFailure, Reset, Step};
