//! `rollflash eval`: held-out greedy accuracy (or success rate) of a checkpoint on the task
//! a train config describes, with its standard error and, when asked, sampled pass@1; and
//! `rollflash report`, which rebuilds a run's report.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rollflash_run::config::TrainConfig;

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The checkpoint: a run's `final/` or `checkpoints/step-N/`, or any Hugging Face
    /// directory of the configured model's family.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The train config whose task (and rendering) to evaluate on; the built-in default
    /// when absent.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one field, e.g. `--set env.max_terms=4`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Held-out tasks (default: the config's `train.eval_problems`).
    #[arg(long)]
    problems: Option<usize>,
    /// Also sampled pass@1: this many trajectories per task at the config's
    /// `rollout.temperature` (`--set rollout.temperature=0.6` for another); 0 = greedy only.
    #[arg(long, default_value_t = 0)]
    samples: usize,
}

pub fn run(a: EvalArgs) -> Result<()> {
    let cfg = TrainConfig::load(a.config.as_deref(), &a.sets)?;
    let env = cfg.env.name();
    let plan = rollflash_run::plan::RunPlan::new(cfg)?;
    let n = a.problems.unwrap_or(plan.eval().problems).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let r = rt.block_on(rollflash_run::pipeline::evaluate_checkpoint(
        &plan,
        &a.checkpoint,
        n,
        a.samples,
    ))?;
    println!(
        "eval {} on `{}`: success rate {:.3} ± {:.3} ({} of {} tasks), mean reward {:.3}{}{}",
        a.checkpoint.display(),
        env,
        r.success_rate,
        r.success_se,
        (r.success_rate * r.tasks as f64).round() as usize,
        r.tasks,
        r.mean_reward,
        // The math task also says how often the answer was right with the format unchecked.
        r.format_free
            .map(|f| format!(", format-free {f:.3}"))
            .unwrap_or_default(),
        r.sampled
            .map(|p| format!(
                "; sampled pass@1 {:.3} ± {:.3} ({} per task, T={})",
                p.success_rate, p.success_se, p.samples, p.temperature
            ))
            .unwrap_or_default()
    );
    Ok(())
}

/// `rollflash report DIR`.
pub fn report(dir: PathBuf) -> Result<()> {
    let path = rollflash_run::report::write(&dir)?;
    println!("wrote {}", path.display());
    Ok(())
}
