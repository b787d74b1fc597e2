//! The end-of-run report: `output_dir/report/` with PNG plots (reward and accuracy against
//! step and wall time, staleness, throughput, idle ratios) and `report.md`, built only from
//! the files a run leaves (`metrics.jsonl`, `summary.json`), so `rollflash report DIR`
//! regenerates it for any run, finished or killed.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use rollflash_core::buffer::Accounting;
use rollflash_plot::{line_chart, Chart, Series};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::eval::EvalResult;

/// `summary.json`: what a finished run adds to its per-step metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The environment's name.
    pub env: String,
    /// α in force (0 for the synchronous baseline).
    pub alpha: f64,
    pub sync: bool,
    pub steps: usize,
    pub eval_before: Option<EvalResult>,
    pub eval_after: Option<EvalResult>,
    pub accounting: Accounting,
    /// Wall time of this process's part of the run (a resumed run counts from the resume).
    pub wall_s: f64,
    pub samples_per_s: f64,
    pub tokens_per_s: f64,
    /// Trained samples by staleness over this process's steps.
    pub staleness: Vec<(u64, u64)>,
    /// The run was stopped early (Ctrl-C, SIGTERM) and not evaluated after RL.
    #[serde(default)]
    pub interrupted: bool,
}

/// The report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("summary {path}: {source}")]
    Summary {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Plot(#[from] rollflash_plot::PlotError),
}

/// Writes `summary.json` into `output_dir`.
pub fn write_summary(output_dir: &Path, s: &RunSummary) -> Result<(), ReportError> {
    let path = output_dir.join("summary.json");
    let text = serde_json::to_string_pretty(s).map_err(|source| ReportError::Summary {
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, text).map_err(|source| ReportError::Io {
        what: "cannot write",
        path,
        source,
    })
}

/// Builds `output_dir/report/` from `metrics.jsonl` and (when present) `summary.json`;
/// returns the path of `report.md`.
pub fn write(output_dir: &Path) -> Result<PathBuf, ReportError> {
    let rows = crate::metrics::read(&output_dir.join("metrics.jsonl"))?;
    let summary_path = output_dir.join("summary.json");
    let summary: Option<RunSummary> = match std::fs::read_to_string(&summary_path) {
        Ok(t) => Some(
            serde_json::from_str(&t).map_err(|source| ReportError::Summary {
                path: summary_path.clone(),
                source,
            })?,
        ),
        Err(_) => None,
    };
    let dir = output_dir.join("report");
    std::fs::create_dir_all(&dir).map_err(|source| ReportError::Io {
        what: "cannot create",
        path: dir.clone(),
        source,
    })?;
    let plots = plot(&dir, &rows)?;
    let md = markdown(output_dir, &rows, summary.as_ref(), &plots);
    let path = dir.join("report.md");
    std::fs::write(&path, md).map_err(|source| ReportError::Io {
        what: "cannot write",
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

fn col(rows: &[Value], x: &str, y: &str) -> Vec<(f64, f64)> {
    rows.iter()
        .filter_map(|r| Some((r.get(x)?.as_f64()?, r.get(y)?.as_f64()?)))
        .collect()
}

/// Draws every chart that has data; returns the file names written.
fn plot(dir: &Path, rows: &[Value]) -> Result<Vec<String>, ReportError> {
    let series = |x: &str, ys: &[(&str, &str)]| -> Vec<Series> {
        ys.iter()
            .map(|(key, name)| Series::new(*name, col(rows, x, key)))
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let charts = [
        (
            "reward_vs_step.png",
            "Reward and accuracy by step",
            "step",
            "",
            series(
                "step",
                &[("reward", "mean reward"), ("accuracy", "accuracy")],
            ),
        ),
        (
            "reward_vs_time.png",
            "Reward and accuracy by wall time",
            "wall time (s)",
            "",
            series(
                "elapsed_s",
                &[("reward", "mean reward"), ("accuracy", "accuracy")],
            ),
        ),
        (
            "staleness.png",
            "Staleness of trained samples",
            "step",
            "policy versions",
            series("step", &[("staleness", "mean"), ("staleness_max", "max")]),
        ),
        (
            "throughput.png",
            "Throughput",
            "step",
            "samples/s",
            series("step", &[("samples_per_s", "trained samples/s")]),
        ),
        (
            "tokens.png",
            "Token throughput",
            "step",
            "tokens/s",
            series("step", &[("tokens_per_s", "trained tokens/s")]),
        ),
        (
            "idle.png",
            "Idle ratios",
            "step",
            "fraction of step time",
            series(
                "step",
                &[
                    ("rollout_idle", "rollout idle"),
                    ("trainer_idle", "trainer idle"),
                ],
            ),
        ),
    ];
    let mut written = Vec::new();
    for (file, title, x, y, s) in charts {
        if s.is_empty() {
            continue;
        }
        let mut chart = Chart::new(title, x, y);
        chart.series = s;
        line_chart(&dir.join(file), &chart)?;
        written.push(file.to_string());
    }
    Ok(written)
}

fn mean(xs: &[(f64, f64)]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().map(|p| p.1).sum::<f64>() / xs.len() as f64)
}

fn markdown(
    output_dir: &Path,
    rows: &[Value],
    summary: Option<&RunSummary>,
    plots: &[String],
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Run report: {}\n", output_dir.display());
    if let Some(s) = summary {
        let _ = writeln!(
            md,
            "Environment `{}`, {} steps, α = {}{}.\n",
            s.env,
            s.steps,
            s.alpha,
            if s.sync {
                " (synchronous baseline)"
            } else {
                ""
            }
        );
        if s.interrupted {
            let _ = writeln!(
                md,
                "**Interrupted** after step {}: not evaluated after RL; `rollflash train --resume` continues it.\n",
                s.steps
            );
        }
        let _ = writeln!(md, "## Held-out evaluation (greedy)\n");
        let _ = writeln!(md, "| | tasks | success rate | mean reward |");
        let _ = writeln!(md, "| --- | ---: | ---: | ---: |");
        for (name, e) in [("before RL", &s.eval_before), ("after RL", &s.eval_after)] {
            match e {
                Some(e) => {
                    let _ = writeln!(
                        md,
                        "| {name} | {} | {:.3} | {:.3} |",
                        e.tasks, e.success_rate, e.mean_reward
                    );
                }
                None => {
                    let _ = writeln!(md, "| {name} | – | – | – |");
                }
            }
        }
        let a = s.accounting;
        let _ = writeln!(md, "\n## Samples\n");
        let _ = writeln!(
            md,
            "started {} = trained {} + filtered {} + dropped-stale {} + aborted {} + failed {} \
             (+ running {} + buffered {}); balanced: {}.\n",
            a.started,
            a.trained,
            a.filtered,
            a.dropped_stale,
            a.aborted,
            a.failed,
            a.running,
            a.buffered,
            a.balanced()
        );
        let _ = writeln!(md, "## Throughput\n");
        let _ = writeln!(
            md,
            "{:.2} trained samples/s, {:.0} trained tokens/s over {:.1} s of wall time.\n",
            s.samples_per_s, s.tokens_per_s, s.wall_s
        );
    } else {
        let _ = writeln!(
            md,
            "No `summary.json`: the run did not finish; this report covers its metrics.\n"
        );
    }
    let _ = writeln!(md, "## Per-step metrics\n");
    let max_stale = rows
        .iter()
        .filter_map(|r| r.get("staleness_max")?.as_u64())
        .max();
    let _ = writeln!(md, "- steps recorded: {}", rows.len());
    if let Some(m) = max_stale {
        let _ = writeln!(md, "- maximum staleness: {m}");
    }
    let reward = col(rows, "step", "reward");
    let acc = col(rows, "step", "accuracy");
    let k = 5.min(reward.len());
    if k > 0 {
        let _ = writeln!(
            md,
            "- mean batch reward, first {k} steps: {:.3}; last {k}: {:.3}",
            mean(&reward[..k]).unwrap_or(0.0),
            mean(&reward[reward.len() - k..]).unwrap_or(0.0)
        );
    }
    let k = 5.min(acc.len());
    if k > 0 {
        let _ = writeln!(
            md,
            "- batch accuracy, first {k} steps: {:.3}; last {k}: {:.3}",
            mean(&acc[..k]).unwrap_or(0.0),
            mean(&acc[acc.len() - k..]).unwrap_or(0.0)
        );
    }
    for (key, label) in [
        ("samples_per_s", "samples/s"),
        ("rollout_idle", "rollout idle ratio"),
        ("trainer_idle", "trainer idle ratio"),
        ("weight_sync_ms", "weight sync (ms)"),
    ] {
        if let Some(m) = mean(&col(rows, "step", key)) {
            let _ = writeln!(md, "- mean {label} per step: {m:.3}");
        }
    }
    let _ = writeln!(md, "\n## Plots\n");
    for p in plots {
        let _ = writeln!(md, "![{p}]({p})");
    }
    md
}
