//! `rollflash sim`: the discrete-event simulator's scenarios as tables (Markdown + CSV) and
//! PNG charts, and `rollflash sim validate`, which calibrates the simulator's cost model on
//! this machine and compares a simulated run with a measured `rollflash train` run
//! (`rollflash_bench::calibrate`; see `BENCHMARKS.md`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use rollflash_bench::calibrate::{self, ValidateOptions};
use rollflash_bench::tables;
use rollflash_sim::scenario::{self, Scale};

#[derive(Debug, Args)]
pub struct SimArgs {
    #[command(subcommand)]
    command: Option<SimCommand>,
    /// Where tables (`.md`, `.csv`) and charts (`.png`) go.
    #[arg(long, default_value = "runs/sim", global = true)]
    out: PathBuf,
    /// Fewer steps and points (a smoke run, seconds instead of minutes).
    #[arg(long)]
    quick: bool,
}

#[derive(Debug, Subcommand)]
enum SimCommand {
    /// Calibrate on this machine and compare a simulated run with a measured one.
    Validate(ValidateArgs),
}

#[derive(Debug, Args)]
struct ValidateArgs {
    /// `metrics.jsonl` of the `rollflash train` run (one run per invocation).
    #[arg(long)]
    metrics: PathBuf,
    /// The run's config file, if it had one.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The run's `--set` overrides (same syntax as `rollflash train`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Samples drawn for calibration: the run's first tasks, `group_size` samples each
    /// (multi-turn tasks: episodes, `group_size + rollout.group_size_redundancy` each).
    /// Default: 256 single-turn, 1024 multi-turn.
    #[arg(long)]
    prompts: Option<usize>,
}

pub fn run(a: SimArgs) -> Result<()> {
    match a.command {
        Some(SimCommand::Validate(v)) => validate(v, &a.out),
        None => scenarios(&a.out, a.quick),
    }
}

fn scenarios(out: &Path, quick: bool) -> Result<()> {
    let scale = if quick { Scale::Quick } else { Scale::Full };
    let t0 = Instant::now();
    let tables = scenario::all(scale)?;
    tables::write(out, &tables)?;
    println!(
        "simulated in {:.1} s; tables and charts in {}",
        t0.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

fn validate(a: ValidateArgs, out: &Path) -> Result<()> {
    let v = calibrate::validate(&ValidateOptions {
        config: a.config,
        sets: a.sets,
        metrics: a.metrics,
        samples: a.prompts,
    })?;
    tables::write(out, &[v.table])?;
    // The simulation as it ran (costs and workload), to re-run or vary it.
    let json = serde_json::to_string_pretty(&v.sim).context("cannot serialise the simulation")?;
    tables::write_text(&out.join("calibrated_sim.json"), &json)?;
    Ok(())
}
