//! `rollflash-dashboard`: watch a run while it runs, or after. The page (HTML, JS and CSS
//! embedded in the binary: no CDN, no network), its HTTP routes (`server`), and the run
//! directory's files it reads: `metrics.jsonl`, `summary.json`, and the two this crate
//! writes for a run — `timeline.jsonl` (what each backend and the trainer did when, from
//! the drivers' timeline events) and `trajectories.jsonl` (a few trajectories of every
//! trained batch, token by token with the policy version of each).

pub mod files;
pub mod server;
pub mod trajectories;

pub use files::{FileError, RunDir, TimelineLog, TrajectoryLog};
pub use server::{Dashboard, DashboardConfig, DashboardError, Live, LiveSource};
pub use trajectories::{sample_batch, Piece, Role, TrajectoryRecord};
