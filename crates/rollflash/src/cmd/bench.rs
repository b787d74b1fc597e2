//! `rollflash bench`: the command line of [`rollflash_run::bench_rl`] — the synchronous
//! baseline against each ROLL Flash mechanism alone and combined, on the same resources,
//! printed as a table and written as Markdown, CSV and a chart.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use rollflash_bench::rl::{self as bench_rl, BenchOptions, Workload, MODE_NAMES};

#[derive(Debug, Args)]
pub struct BenchRlArgs {
    /// `rlvr` (long-tailed math, real engine and learner), `agentic` (multi-turn FrozenLake
    /// behind slow, failing environments), `agentic-gen` (the same game with long model
    /// turns and fast environments: generation-bound), `code` (the multi-turn coding
    /// environment: each turn's program runs in the code sandbox), `smollm2` (SmolLM2-135M on
    /// reasoning-gym chain_sum: training-bound; needs models/smollm2-hf and
    /// data/reasoning_gym), `both` (rlvr and agentic) or `all` (every one but smollm2).
    #[arg(long, default_value = "both")]
    workload: String,
    /// Runs per mode; the table shows min / median / max (1 keeps the default run within
    /// minutes on two cores; use 3 for the spread).
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Training steps per run (default 4; with 3 or more, samples/s is measured from the first
    /// weight publication to the last).
    #[arg(long)]
    steps: Option<usize>,
    /// Comma-separated modes (default: the workload's list). `sync` always runs. Known:
    /// sync, queue, replicate, env-async, redundant, alpha1, alpha2, alpha4, all-sync,
    /// all-a1, all.
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<String>>,
    /// Where the warm-up cache, bench.md, bench.csv and speedup_vs_alpha.png go.
    #[arg(long, default_value = "runs/bench")]
    out: PathBuf,
    /// Override a setting of every workload (`rollflash train` keys), after the
    /// workload's own; repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

pub fn run(a: BenchRlArgs) -> Result<()> {
    let Some(workloads) = Workload::parse_list(&a.workload) else {
        bail!(
            "unknown workload `{}` (rlvr, agentic, agentic-gen, code, smollm2, both, all)",
            a.workload
        );
    };
    if let Some(modes) = &a.modes {
        for m in modes {
            if bench_rl::mode(m).is_none() {
                bail!("unknown mode `{m}` (known: {})", MODE_NAMES.join(", "));
            }
        }
    }
    let opts = BenchOptions {
        workloads,
        modes: a.modes,
        repeats: a.repeats,
        steps: a.steps,
        sets: a.sets,
        out: a.out,
        verbose: true,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let report = rt.block_on(bench_rl::run(&opts))?;
    println!();
    print!("{}", report.markdown());
    for p in report.write(&opts.out)? {
        println!("wrote {}", p.display());
    }
    Ok(())
}
