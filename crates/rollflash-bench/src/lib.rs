//! `rollflash-bench`: measurement harnesses behind `rollflash bench`. Kept out of the run
//! crate's API: what it exposes is for measuring rollflash, not for running it.

pub mod rl;
