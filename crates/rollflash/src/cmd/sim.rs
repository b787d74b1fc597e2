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
    /// Which division of CPU cores between the engines and the trainer is best for a
    /// simulation (by default `calibrated_sim.json` of `sim validate`): every split of
    /// `--cores`, asynchronous and synchronous, best first.
    Split(SplitArgs),
}

#[derive(Debug, Args)]
struct SplitArgs {
    /// The simulation (a `SimConfig` as JSON, e.g. the `calibrated_sim.json` that `sim
    /// validate` writes); default: `<out>/calibrated_sim.json` when it exists, else the
    /// simulator's built-in default.
    #[arg(long)]
    sim: Option<PathBuf>,
    /// Cores to divide (default: this machine's).
    #[arg(long)]
    cores: Option<usize>,
    /// Amdahl parallel fraction of an engine step.
    #[arg(long, default_value_t = 0.9)]
    gen_parallel: f64,
    /// Amdahl parallel fraction of a training step.
    #[arg(long, default_value_t = 0.9)]
    train_parallel: f64,
    /// Threads per engine the simulation's inference costs were measured at.
    #[arg(long, default_value_t = 1)]
    at_engine_threads: usize,
    /// Trainer threads its training costs were measured at.
    #[arg(long, default_value_t = 1)]
    at_train_threads: usize,
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
        Some(SimCommand::Split(s)) => split(s, &a.out),
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

fn split(a: SplitArgs, out: &Path) -> Result<()> {
    use rollflash_sim::cpu::{best_split, split_candidates, split_table, CpuScaling, CpuSplit};
    let path = a
        .sim
        .or_else(|| Some(out.join("calibrated_sim.json")).filter(|p| p.exists()));
    let base: rollflash_sim::SimConfig = match &path {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the simulation {}", p.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("{} is not a simulation config", p.display()))?
        }
        None => rollflash_sim::SimConfig::default(),
    };
    let cores = a
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let scaling = CpuScaling {
        gen_parallel: a.gen_parallel,
        train_parallel: a.train_parallel,
        calibrated: CpuSplit {
            cores,
            gen_threads: a.at_engine_threads,
            train_threads: a.at_train_threads,
        },
        ..CpuScaling::default()
    };
    println!(
        "simulation: {}; {cores} cores; parallel fractions: generation {}, training {}",
        path.as_ref().map_or_else(
            || "the built-in default".into(),
            |p| p.display().to_string()
        ),
        a.gen_parallel,
        a.train_parallel
    );
    let results = best_split(&base, &scaling, cores, &split_candidates(cores))?;
    tables::write(out, &[split_table(&results, cores)])?;
    Ok(())
}
