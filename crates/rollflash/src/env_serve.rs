//! `rollflash env-serve`: a built-in environment behind the remote-environment HTTP protocol.

/// Arguments of `rollflash env-serve`.
#[derive(Debug, clap::Args)]
pub struct EnvServeArgs {}

pub fn run(_args: EnvServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("`rollflash env-serve` is not implemented yet")
}
