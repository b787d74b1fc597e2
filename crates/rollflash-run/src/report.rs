//! The end-of-run report: `output_dir/report/` with PNG plots (reward and accuracy against
//! step and wall time with the held-out evaluations marked, response length, staleness,
//! throughput, idle ratios: noisy per-step curves faint under their EMA; and the timeline of
//! what each backend and the trainer did) and `report.md`, built only from the files a run
//! leaves (`metrics.jsonl`, `summary.json`, `timeline.jsonl`), so `rollflash report DIR`
//! regenerates it for any run, finished or killed.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use rollflash_core::buffer::Accounting;
use rollflash_core::timeline::{EventKind, TimelineEvent, TRAINER_LANE};
use rollflash_plot::{gantt_chart, line_chart, Bar, Chart, Gantt, Series, Style};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::eval::EvalResult;
use rollflash_core::IoError;

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
    Io(#[from] IoError),
    #[error("summary {path}")]
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
    std::fs::write(&path, text)
        .map_err(|source| ReportError::Io(IoError::new("cannot write", path, source)))
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
    std::fs::create_dir_all(&dir).map_err(IoError::at("cannot create", dir.clone()))?;
    // The timeline is optional: runs before it existed have none, and a damaged file costs
    // only its plot.
    let timeline = rollflash_dashboard::RunDir::new(output_dir)
        .timeline()
        .unwrap_or_default();
    let plots = plot(&dir, &rows, summary.as_ref(), &timeline)?;
    let md = markdown(output_dir, &rows, summary.as_ref(), &plots);
    let path = dir.join("report.md");
    std::fs::write(&path, md).map_err(IoError::at("cannot write", path.clone()))?;
    Ok(path)
}

fn col(rows: &[Value], x: &str, y: &str) -> Vec<(f64, f64)> {
    rows.iter()
        .filter_map(|r| Some((r.get(x)?.as_f64()?, r.get(y)?.as_f64()?)))
        .collect()
}

/// Two curves that are the same numbers (reward and accuracy of a task whose reward is 1
/// for a success and 0 otherwise): drawn as one series, named for both.
fn same_curve(a: &[(f64, f64)], b: &[(f64, f64)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(p, q)| p.0 == q.0 && (p.1 - q.1).abs() <= 1e-12)
}

/// Per-step curves, raw and smoothed: one named pair, or the two series as one when they
/// coincide.
fn reward_chart(
    title: &str,
    x_label: &str,
    reward: Vec<(f64, f64)>,
    acc: Vec<(f64, f64)>,
) -> Chart {
    let mut chart = Chart::new(title, x_label, "");
    if same_curve(&reward, &acc) {
        chart = chart.with_smoothed("mean reward = accuracy", reward);
    } else {
        if !reward.is_empty() {
            chart = chart.with_smoothed("mean reward", reward);
        }
        if !acc.is_empty() {
            chart = chart.with_smoothed("accuracy", acc);
        }
    }
    chart
}

/// One number of an evaluation, where it has it.
type EvalMeasure = fn(&EvalResult) -> Option<f64>;

/// Held-out greedy points of one measure (`key` in a step's line, `of` an evaluation): before
/// RL at step 0 (the policy the first step's rollouts come from), the periodic ones
/// (`train.eval_every`) of the policy step `k` published at `k + 1`, after RL at the step
/// after the last (the policy every step trained).
fn eval_points(
    rows: &[Value],
    summary: Option<&RunSummary>,
    key: &str,
    of: EvalMeasure,
) -> Vec<(f64, f64)> {
    let periodic = col(rows, "step", key)
        .into_iter()
        .map(|(step, y)| (step + 1.0, y));
    let Some(s) = summary else {
        return periodic.collect();
    };
    let before = s.eval_before.as_ref().and_then(of).map(|y| (0.0, y));
    let after = s
        .eval_after
        .as_ref()
        .and_then(of)
        .map(|y| (s.steps as f64, y));
    before.into_iter().chain(periodic).chain(after).collect()
}

/// Draws every chart that has data; returns the file names written.
fn plot(
    dir: &Path,
    rows: &[Value],
    summary: Option<&RunSummary>,
    timeline: &[TimelineEvent],
) -> Result<Vec<String>, ReportError> {
    let smoothed = |title: &str, y: &str, ys: &[(&str, &str)]| -> Chart {
        let mut c = Chart::new(title, "step", y).integer_x();
        for (key, name) in ys {
            let pts = col(rows, "step", key);
            if !pts.is_empty() {
                c = c.with_smoothed(name, pts);
            }
        }
        c
    };
    let mut by_step = reward_chart(
        "Reward and accuracy by step",
        "step",
        col(rows, "step", "reward"),
        col(rows, "step", "accuracy"),
    )
    .integer_x();
    let held_out: [(&str, &str, EvalMeasure); 2] = [
        ("held-out greedy success", "eval_greedy", |e| {
            Some(e.success_rate)
        }),
        ("held-out greedy, format-free", "eval_format_free", |e| {
            e.format_free
        }),
    ];
    for (name, key, of) in held_out {
        let evals = eval_points(rows, summary, key, of);
        if !evals.is_empty() {
            by_step = by_step.with(Series::new(name, evals).styled(Style::Points));
        }
    }
    let mut staleness =
        Chart::new("Staleness of trained samples", "step", "policy versions").integer_x();
    for (key, name) in [("staleness", "mean"), ("staleness_max", "max")] {
        let pts = col(rows, "step", key);
        if !pts.is_empty() {
            staleness = staleness.with(Series::new(name, pts));
        }
    }
    let charts = [
        ("reward_vs_step.png", by_step),
        (
            "reward_vs_time.png",
            reward_chart(
                "Reward and accuracy by wall time",
                "wall time (s)",
                col(rows, "elapsed_s", "reward"),
                col(rows, "elapsed_s", "accuracy"),
            ),
        ),
        (
            "response_length.png",
            smoothed(
                "Response length",
                "model tokens",
                &[("response_len_mean", "mean"), ("response_len_max", "max")],
            ),
        ),
        ("staleness.png", staleness),
        (
            "throughput.png",
            smoothed(
                "Throughput",
                "samples/s",
                &[("samples_per_s", "trained samples/s")],
            ),
        ),
        (
            "tokens.png",
            smoothed(
                "Token throughput",
                "tokens/s",
                &[("tokens_per_s", "trained tokens/s")],
            ),
        ),
        (
            "idle.png",
            smoothed(
                "Idle ratios",
                "fraction of step time",
                &[
                    ("rollout_idle", "rollout idle"),
                    ("trainer_idle", "trainer idle"),
                ],
            ),
        ),
    ];
    let mut written = Vec::new();
    for (file, chart) in charts {
        if chart.series.is_empty() {
            continue;
        }
        line_chart(&dir.join(file), &chart)?;
        written.push(file.to_string());
    }
    if let Some(g) = timeline_gantt(timeline) {
        gantt_chart(&dir.join("timeline.png"), &g)?;
        written.push("timeline.png".into());
    }
    Ok(written)
}

/// The kinds of timeline bar in drawing order (a pause under the syncs inside it), with
/// their legend names and palette colours: the dashboard's (generate blue, train orange,
/// sync green, pause grey).
const KINDS: [(EventKind, &str, usize); 4] = [
    (EventKind::Pause, "paused for a weight sync", 7),
    (EventKind::Generate, "generating", 0),
    (EventKind::Sync, "loading weights", 2),
    (EventKind::Train, "training step", 1),
];

/// The run's timeline as a Gantt chart in seconds from its first event: one lane per
/// backend (in order of first appearance) and the trainer's lane last.
fn timeline_gantt(events: &[TimelineEvent]) -> Option<Gantt> {
    let t0 = events.iter().map(|e| e.start_ms).min()?;
    let mut lanes: Vec<String> = Vec::new();
    for e in events {
        if e.lane != TRAINER_LANE && !lanes.contains(&e.lane) {
            lanes.push(e.lane.clone());
        }
    }
    if events.iter().any(|e| e.lane == TRAINER_LANE) {
        lanes.push(TRAINER_LANE.into());
    }
    let mut bars = Vec::with_capacity(events.len());
    for (kind, (k, _, _)) in KINDS.iter().enumerate() {
        bars.extend(events.iter().filter(|e| e.kind == *k).filter_map(|e| {
            Some(Bar {
                lane: lanes.iter().position(|l| *l == e.lane)?,
                kind,
                start: (e.start_ms - t0) as f64 / 1e3,
                end: (e.end_ms.max(e.start_ms) - t0) as f64 / 1e3,
            })
        }));
    }
    Some(Gantt {
        title: "Timeline: what each backend and the trainer did".into(),
        x_label: "seconds since the first event".into(),
        lanes,
        kinds: KINDS.iter().map(|(_, n, c)| (n.to_string(), *c)).collect(),
        bars,
    })
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
