//! `rollflash-sim`: a discrete-event simulation of rollflash's own scheduler at cluster
//! scale. A virtual clock drives the real scheduling state machines of `rollflash-core` —
//! `ProxyScheduler`, `SampleBuffer`, `GroupProgress` — against modelled inference workers
//! (continuous batching with a batch- and context-dependent step cost), trainers, weight
//! syncs and environments. No I/O, no tensors: `rollflash sim` writes what it returns.
//! [`cpu`] models how generation and training share a CPU machine's cores and sweeps the
//! thread split.

pub mod config;
pub mod cpu;
pub mod dist;
mod error;
pub mod gpu;
mod report;
pub mod scenario;
mod sim;
pub mod table;
mod worker;

pub use config::{
    Batching, ClusterConfig, Contention, Episode, EpisodeTurn, InferenceCost, SchedConfig,
    SimConfig, SyncCost, TrainCost, Workload,
};
pub use cpu::{
    best_split, split_candidates, split_table, CpuFactors, CpuScaling, CpuSplit, SplitCandidate,
    SplitResult,
};
pub use dist::{LatencyDist, LengthDist};
pub use error::SimError;
pub use report::{SimReport, StepRecord};
pub use sim::simulate;
pub use table::{Cell, Plot, Table};
