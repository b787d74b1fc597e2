//! `rollflash serve`: the embedded engine behind the SGLang-native and OpenAI-compatible HTTP APIs.

/// Arguments of `rollflash serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {}

pub fn run(_args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("`rollflash serve` is not implemented yet")
}
