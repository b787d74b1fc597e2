//! `rollflash train`: asynchronous RL post-training from a TOML config (or the built-in
//! default), with `--set key=value` overrides, `--dry-run`, `--resume` and
//! `--metrics-addr`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rollflash::config::TrainConfig;
use rollflash::pipeline::{Resume, RunOptions};

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// A TOML config; the built-in default (tiny model, arithmetic RLVR, α = 1) when absent.
    /// `configs/frozenlake.toml` is the multi-turn agentic one.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one field, e.g. `--set buffer.alpha=2 --set train.steps=50`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Print the resolved config and exit.
    #[arg(long)]
    dry_run: bool,
    /// Continue from a checkpoint: the newest under `output_dir/checkpoints` when no
    /// directory is given (write them with `--set checkpoint.every=K`). Same config as the
    /// interrupted run; `train.steps` is the total, counting the steps already done.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "")]
    resume: Option<PathBuf>,
    /// Serve Prometheus metrics here during the run (overrides `metrics.prometheus`).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
}

pub fn run(a: TrainArgs) -> Result<()> {
    let cfg = TrainConfig::load(a.config.as_deref(), &a.sets)?;
    if a.dry_run {
        print!("{}", cfg.to_toml()?);
        return Ok(());
    }
    let threads = cfg.rollout.engines * cfg.rollout.engine_threads + cfg.train.threads;
    println!(
        "rollflash train: env `{}`, {} steps of {}×{} samples, α = {}{}, {} threads ({} engine × {} + {} trainer)",
        cfg.env.name(),
        cfg.train.steps,
        cfg.buffer.groups_per_batch,
        cfg.buffer.group_size,
        if cfg.controller.sync { 0.0 } else { cfg.buffer.alpha },
        if cfg.controller.sync { " (synchronous baseline)" } else { "" },
        threads,
        cfg.rollout.engines,
        cfg.rollout.engine_threads,
        cfg.train.threads
    );
    let opts = RunOptions {
        resume: a.resume.map(|d| {
            if d.as_os_str().is_empty() {
                Resume::Latest
            } else {
                Resume::Dir(d)
            }
        }),
        metrics_addr: a.metrics_addr,
        metrics_bound: None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let summary = rt.block_on(rollflash::pipeline::run_with(cfg, opts))?;
    let r = &summary.report;
    println!(
        "{:>4} {:>8} {:>6} {:>6} {:>9} {:>8} {:>7} {:>7}",
        "step", "reward", "acc", "stale", "loss", "wall s", "train s", "wait s"
    );
    for s in &r.steps {
        println!(
            "{:>4} {:>8.3} {:>6.3} {:>6.2} {:>9.4} {:>8.2} {:>7.2} {:>7.2}",
            s.step,
            s.mean_reward,
            s.accuracy,
            s.staleness,
            s.stats.loss,
            s.wall.as_secs_f64(),
            s.train.as_secs_f64(),
            s.wait.as_secs_f64()
        );
    }
    let a = r.accounting;
    println!(
        "samples: started {} = trained {} + filtered {} + dropped-stale {} + aborted {} + failed {} (+ running {} + buffered {})",
        a.started, a.trained, a.filtered, a.dropped_stale, a.aborted, a.failed, a.running, a.buffered
    );
    let max_stale = r.steps.iter().map(|s| s.staleness_max).max().unwrap_or(0);
    println!(
        "throughput: {:.2} trained samples/s, {:.0} trained tokens/s over {:.1} s; max staleness {max_stale}",
        r.samples_per_sec(),
        r.tokens_per_sec(),
        r.wall.as_secs_f64()
    );
    if let (Some(b), Some(af)) = (summary.eval_before, summary.eval_after) {
        println!(
            "greedy eval on {} held-out tasks: success {:.3} before RL → {:.3} after (mean reward {:.3} → {:.3})",
            af.tasks, b.success_rate, af.success_rate, b.mean_reward, af.mean_reward
        );
        if let (Some(fb), Some(fa)) = (b.format_free, af.format_free) {
            println!("  format-free greedy accuracy (answer only, `####` not required): {fb:.3} → {fa:.3}");
        }
        if let (Some(sb), Some(sa)) = (b.sampled, af.sampled) {
            println!(
                "  sampled pass@1 ({} per task, T={}): {:.3} → {:.3}",
                sa.samples, sa.temperature, sb.success_rate, sa.success_rate
            );
        }
    }
    println!("checkpoint: {}", summary.checkpoint.display());
    if let Some(p) = &summary.report_path {
        println!("report: {}", p.display());
    }
    Ok(())
}
