//! `rollflash train`: asynchronous RL post-training from a TOML config (or the built-in
//! default), with `--set key=value` overrides, `--dry-run`, `--resume` and
//! `--metrics-addr`. Ctrl-C or SIGTERM stops the run cleanly (a second one exits at once).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use rollflash_dashboard::Live;
use rollflash_run::config::TrainConfig;
use rollflash_run::pipeline::{PipelineError, Resume, RunOptions};
use rollflash_run::plan::RunPlan;
use rollflash_trainer::StopFlag;

/// The exit status of a run stopped by a signal (128 + SIGINT, the shell's convention).
const EXIT_INTERRUPTED: i32 = 130;

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
    // `Option<Option<_>>`: clap's "flag with an optional value". (An empty default for the
    // missing value does not work: the path parser refuses empty values.)
    #[arg(long, value_name = "DIR", num_args = 0..=1)]
    resume: Option<Option<PathBuf>>,
    /// Serve Prometheus metrics here during the run (overrides `metrics.prometheus`).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Serve the live dashboard here during the run, e.g. `127.0.0.1:8686` (overrides
    /// `dashboard.addr`; port 0 picks a free one, printed as `dashboard: http://…/`).
    /// Beyond loopback it needs an API key (`dashboard.api_key_env` or ROLLFLASH_API_KEY).
    #[arg(long, value_name = "ADDR")]
    dashboard: Option<SocketAddr>,
    /// Keep serving the dashboard after the run ends, until Ctrl-C.
    #[arg(long, requires = "dashboard")]
    dashboard_keep: bool,
}

pub fn run(a: TrainArgs) -> Result<()> {
    let mut cfg = TrainConfig::load(a.config.as_deref(), &a.sets)?;
    if a.dashboard.is_some() {
        cfg.dashboard.addr = a.dashboard;
    }
    let plan = RunPlan::new(cfg.clone())?;
    if a.dry_run {
        print!("{}", cfg.to_toml()?);
        // The plan as comments, so the output still parses as the config it prints.
        for line in plan.describe() {
            println!("# {line}");
        }
        return Ok(());
    }
    let steps_total = cfg.train.steps;
    println!(
        "rollflash train: env `{}`, {} steps of {}×{} samples, α = {}{}",
        cfg.env.name(),
        cfg.train.steps,
        cfg.buffer.groups_per_batch,
        cfg.buffer.group_size,
        plan.alpha(),
        if plan.sync() {
            " (synchronous baseline)"
        } else {
            ""
        },
    );
    println!("{}", plan.cores().describe(plan.sync()));
    if !cfg.rollout.servers.is_empty() {
        println!(
            "rollout servers: {} (their threads are their own)",
            cfg.rollout
                .servers
                .iter()
                .map(|s| s.url.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let opts = RunOptions {
        resume: a.resume.map(|d| match d {
            None => Resume::Latest,
            Some(d) => Resume::Dir(d),
        }),
        metrics_addr: a.metrics_addr,
        metrics_bound: None,
        stop: StopFlag::new(),
        live: plan.dashboard().addr.map(|_| Live::default()),
    };
    let dash = plan
        .dashboard()
        .addr
        .map(|addr| (addr, plan.dashboard().api_key.clone()));
    let out_dir = cfg.output_dir.clone();
    let live = opts.live.clone();
    let stop = opts.stop.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // Set once the run is over: a signal then only ends the kept dashboard.
    let run_over = Arc::new(AtomicBool::new(false));
    let (outcome, server) = rt.block_on(async {
        tokio::spawn(watch_signals(stop.clone(), Arc::clone(&run_over)));
        // Up with the run: the page shows the warm-up and the first evaluation too.
        let server = match dash {
            Some((addr, key)) => {
                std::fs::create_dir_all(&out_dir)
                    .with_context(|| format!("cannot create {}", out_dir.display()))?;
                Some(crate::cmd::dashboard::start(addr, key, out_dir, live).await?)
            }
            None => None,
        };
        let outcome = rollflash_run::pipeline::run_plan(plan, opts).await;
        anyhow::Ok((outcome, server))
    })?;
    let summary = match outcome {
        Ok(s) => s,
        Err(e) => {
            if let Some(d) = server {
                rt.block_on(d.shutdown());
            }
            // Nothing the run started may outlive it: the runtime's drop waits for
            // blocking work.
            drop(rt);
            if let PipelineError::Interrupted { phase } = e {
                println!(
                    "interrupted during {phase}: stopped before RL training; nothing was saved"
                );
                std::process::exit(EXIT_INTERRUPTED);
            }
            return Err(e.into());
        }
    };
    print_summary(&summary, steps_total);
    // The summary first, then the kept page: what the run did is on the terminal while
    // the dashboard stays up, and Ctrl-C only ends the page.
    if let Some(d) = server {
        run_over.store(true, Ordering::SeqCst);
        if a.dashboard_keep && !summary.interrupted && !stop.is_stopped() {
            println!("run finished; the dashboard stays up until Ctrl-C");
            rt.block_on(stop.stopped());
        }
        rt.block_on(d.shutdown());
    }
    drop(rt);
    if summary.interrupted {
        std::process::exit(EXIT_INTERRUPTED);
    }
    Ok(())
}

/// What the run did: the per-step table (the first and last steps of a long run; every
/// step is in `metrics.jsonl`), the sample accounting, throughput, the evaluations, and
/// where the report and the checkpoint are.
fn print_summary(summary: &rollflash_run::pipeline::TrainSummary, steps_total: usize) {
    /// A longer run's table shows its first and last steps only.
    const HEAD: usize = 3;
    const TAIL: usize = 8;
    let r = &summary.report;
    println!(
        "{:>4} {:>8} {:>6} {:>6} {:>9} {:>8} {:>7} {:>7}",
        "step", "reward", "acc", "stale", "loss", "wall s", "train s", "wait s"
    );
    let n = r.steps.len();
    for (i, s) in r.steps.iter().enumerate() {
        if n > HEAD + TAIL + 1 && (HEAD..n - TAIL).contains(&i) {
            if i == HEAD {
                println!(
                    "{:>4} ({} more steps in metrics.jsonl)",
                    "…",
                    n - HEAD - TAIL
                );
            }
            continue;
        }
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
    if let Some(p) = &summary.report_path {
        println!("report: {}", p.display());
    }
    if summary.interrupted {
        println!(
            "interrupted after {} of {} steps: rollout in flight was aborted (counted above), the running step was published",
            r.cursor.steps_done, steps_total
        );
        if let Some(c) = &summary.checkpoint {
            println!(
                "checkpoint: {} (continue with the same config and `--resume`)",
                c.display()
            );
        }
    } else {
        match &summary.checkpoint {
            Some(c) => println!("checkpoint: {}", c.display()),
            None => println!("checkpoint: none (checkpoint.final = false)"),
        }
    }
}

/// First Ctrl-C / SIGTERM: ask the run to stop cleanly (once the run is over, only the
/// kept dashboard is left to stop). Second: exit at once.
async fn watch_signals(stop: StopFlag, run_over: Arc<AtomicBool>) {
    crate::signal::shutdown_signal().await;
    if run_over.load(Ordering::SeqCst) {
        eprintln!("stopping the dashboard");
    } else {
        eprintln!(
            "stopping: aborting rollout, finishing the running training step, saving a checkpoint (signal again to exit at once)"
        );
    }
    stop.stop();
    crate::signal::shutdown_signal().await;
    eprintln!("second signal: exiting without saving");
    std::process::exit(EXIT_INTERRUPTED);
}
