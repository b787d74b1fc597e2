//! `rollflash-bench`: measurement harnesses behind `rollflash bench` and `rollflash sim
//! validate`. Kept out of the run crate's API: what it exposes is for measuring rollflash,
//! not for running it.

pub mod calibrate;
pub mod rl;
pub mod sandbox;
pub mod tables;
