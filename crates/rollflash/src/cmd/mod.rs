//! One module per command: arguments (clap) and the calls into the library crates that
//! carry the command out.

pub mod bench;
pub mod bench_engine;
pub mod bench_proxy;
pub mod bench_sandbox;
pub mod dashboard;
pub mod env_serve;
pub mod eval;
pub mod generate;
pub mod serve;
pub mod sim;
pub mod train;
pub mod verify;

use rollflash_run::config::{DTypeSpec, DeviceSpec};
use rollflash_run::plan::Placement;

/// `--device` and `--dtype` of the commands that load a model outside a run config.
#[derive(Debug, clap::Args)]
pub struct PlacementArgs {
    /// Where tensors live: `cpu`, or `cuda:N` (a build with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Tensor precision: `f32` (`bf16`, `f16` on CUDA only).
    #[arg(long, default_value = "f32")]
    dtype: DTypeSpec,
}

impl PlacementArgs {
    /// Opens the device.
    pub fn open(&self) -> anyhow::Result<Placement> {
        Ok(Placement::new(self.device, self.dtype)?)
    }
}
