//! `rollflash bench-sandbox`: the code sandbox's start-up overhead and executions/s at several
//! pool sizes, beside the same programs run by the bare interpreter.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rollflash_bench::sandbox::{self as bench, SandboxBenchOptions};
use rollflash_sandbox::SandboxConfig;

#[derive(Debug, Args)]
pub struct BenchSandboxArgs {
    /// Pool sizes (`sandbox.workers`) to measure; the bare interpreter runs as many at once.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pools: Vec<usize>,
    /// Executions per pool size and side.
    #[arg(long, default_value_t = 200)]
    executions: usize,
    /// Run HumanEval's canonical programs (the JSONL `scripts/make_humaneval_data.sh`
    /// prints) instead of the built-in assert check.
    #[arg(long)]
    humaneval: Option<PathBuf>,
    /// Empty-program runs, one at a time, for the start-up overhead.
    #[arg(long, default_value_t = 50)]
    startup_runs: usize,
}

pub fn run(a: BenchSandboxArgs) -> Result<()> {
    let programs = match &a.humaneval {
        Some(p) => bench::humaneval_programs(p)?,
        None => bench::default_programs(),
    };
    anyhow::ensure!(!programs.is_empty(), "no programs to run");
    let opts = SandboxBenchOptions {
        pools: a.pools,
        executions: a.executions,
        programs,
        config: SandboxConfig::default(),
        startup_runs: a.startup_runs,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let report = rt.block_on(bench::run(&opts))?;
    print!("{}", report.markdown());
    Ok(())
}
