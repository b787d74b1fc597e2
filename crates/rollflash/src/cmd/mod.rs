//! One module per command: arguments (clap) and the calls into the library crates that
//! carry the command out.

pub mod bench;
pub mod bench_engine;
pub mod bench_proxy;
pub mod env_serve;
pub mod eval;
pub mod generate;
pub mod serve;
pub mod sim;
pub mod train;
