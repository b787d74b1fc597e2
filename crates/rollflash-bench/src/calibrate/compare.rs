//! The measured run (its `metrics.jsonl`, summed over steps) against the simulated one, as
//! a table.

use std::path::{Path, PathBuf};

use rollflash_sim::{Cell, SimReport, Table};

use super::plan::{Plan, TaskKind};
use super::CalibrateError;
use rollflash_core::IoError;

/// What the measured run reported, summed over its steps.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Measured {
    pub steps: usize,
    pub samples: f64,
    pub tokens: f64,
    pub wall: f64,
    pub train: f64,
    pub sync: f64,
    /// The first step's samples and wall time (its training pays one-time costs).
    pub first_samples: f64,
    pub first_wall: f64,
    /// Cumulative accounting at the last step (0 when the file predates it).
    pub started: f64,
    pub filtered: f64,
}

/// Reads a run's `metrics.jsonl`.
pub fn read_metrics(path: &Path) -> Result<Measured, CalibrateError> {
    let text = std::fs::read_to_string(path).map_err(IoError::at("cannot read", path))?;
    let mut m = Measured::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|source| CalibrateError::MetricsJson {
                path: path.to_path_buf(),
                line: i + 1,
                source,
            })?;
        let f = |k: &str| -> Result<f64, CalibrateError> {
            v[k].as_f64().ok_or_else(|| CalibrateError::MetricsField {
                path: path.to_path_buf(),
                line: i + 1,
                key: k.to_string(),
            })
        };
        if m.steps == 0 {
            m.first_samples = f("samples")?;
            m.first_wall = f("wall_s")?;
        }
        m.steps += 1;
        m.samples += f("samples")?;
        m.tokens += f("tokens")?;
        m.wall += f("wall_s")?;
        m.train += f("train_s")?;
        // Older runs wrote `sync_s`, newer ones `weight_sync_ms`.
        m.sync += f("sync_s").or_else(|_| f("weight_sync_ms").map(|ms| ms / 1e3))?;
        m.started = v["started"].as_f64().unwrap_or(0.0);
        m.filtered = v["filtered"].as_f64().unwrap_or(0.0);
    }
    if m.steps == 0 {
        return Err(CalibrateError::NoSteps(path.to_path_buf()));
    }
    Ok(m)
}

/// What the table's note says about the calibration.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// Samples (single-turn) or episodes (multi-turn) the workload was measured on.
    pub samples: usize,
    pub metrics: PathBuf,
}

/// Measured against simulated: throughput, time per step, tokens per sample, sync time (and
/// for multi-turn runs, what the buffer started and filtered).
pub fn table(plan: &Plan, measured: &Measured, r: &SimReport, from: &Provenance) -> Table {
    let real_sps = measured.samples / measured.wall;
    let sim_sps = r.samples_per_s();
    let err = (sim_sps - real_sps) / real_sps;
    let mode = if plan.sync {
        "sync (α=0, barrier)".to_string()
    } else {
        format!("async α={}", plan.buffer.alpha)
    };
    let mut t = Table::new(
        "validate",
        &format!(
            "Simulated vs measured: {mode}, {} steps of {}×{}",
            measured.steps, plan.buffer.groups_per_batch, plan.buffer.group_size
        ),
        &["quantity", "measured", "simulated", "sim / measured"],
    );
    let n = measured.steps as f64;
    let sim_steps = r.steps.len().max(1) as f64;
    let row = |name: &str, m: f64, s: f64, digits: usize| {
        vec![
            Cell::text(name),
            Cell::num(m, digits),
            Cell::num(s, digits),
            Cell::num(s / m, 2),
        ]
    };
    t.rows.push(row("samples/s", real_sps, sim_sps, 2));
    // Without the first step, whose training pays one-time costs (first-touching the
    // learner's memory) that vary between processes: the steady state the scheduler sets.
    let real_steady = (measured.samples - measured.first_samples)
        / (measured.wall - measured.first_wall).max(1e-9);
    let later = r.steps.get(1..).unwrap_or_default();
    let sim_steady = later.iter().map(|s| s.samples as f64).sum::<f64>()
        / later.iter().map(|s| s.wall_s).sum::<f64>().max(1e-9);
    if measured.steps > 1 {
        t.rows.push(row(
            "samples/s after the first step",
            real_steady,
            sim_steady,
            2,
        ));
    }
    t.rows.push(row(
        "wall s/step",
        measured.wall / n,
        r.steps.iter().map(|s| s.wall_s).sum::<f64>() / sim_steps,
        3,
    ));
    t.rows.push(row(
        "train s/step",
        measured.train / n,
        r.steps.iter().map(|s| s.train_s).sum::<f64>() / sim_steps,
        3,
    ));
    t.rows.push(row(
        "response tokens/sample",
        measured.tokens / measured.samples,
        r.trained_response_tokens as f64 / r.trained_samples.max(1) as f64,
        2,
    ));
    t.rows.push(row(
        "sync s/step",
        measured.sync / n,
        r.steps.iter().map(|s| s.sync_s).sum::<f64>() / sim_steps,
        4,
    ));
    let workload = match plan.kind {
        TaskKind::SingleTurn => {
            format!(
                "the workload is {} responses generated by its starting policy to the run's own \
                 first {} prompts",
                from.samples,
                from.samples.div_ceil(plan.buffer.group_size.max(1))
            )
        }
        TaskKind::Episodes => {
            // Where groups are filtered, how many the buffer had to start is part of the
            // throughput: compare it too.
            let last = r.steps.last().map(|s| s.accounting).unwrap_or_default();
            t.rows.push(row(
                "samples started",
                measured.started,
                last.started as f64,
                0,
            ));
            t.rows.push(row(
                "samples filtered",
                measured.filtered,
                last.filtered as f64,
                0,
            ));
            format!(
                "the workload replays {} real episodes of the run's own first tasks, rolled out \
                 turn by turn by its starting policy",
                from.samples
            )
        }
    };
    t.note = format!(
        "Throughput error {:+.1}% (aim: within 15%; after the first step {:+.1}%). Costs \
         calibrated on this machine just now; {workload}; only the step count comes from {}.",
        err * 100.0,
        (sim_steady - real_steady) / real_steady * 100.0,
        from.metrics.display()
    );
    t
}
