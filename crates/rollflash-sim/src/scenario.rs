//! The experiments of the ROLL Flash paper, as functions from settings to tables: speed-up
//! vs α, throughput vs GPUs, the long-tail effect of batch-synchronous vs queue-scheduled
//! rollout, redundant environments vs failure rate, and prompt replication.
//!
//! "Same hardware" throughout: the synchronous baseline uses all `G` GPUs for generation
//! and then all `G` for training (colocated, as synchronous systems run); the asynchronous
//! runs split the `G` GPUs between rollout and training (disaggregated), with the split
//! chosen per run from a few candidates and reported.

use rollflash_core::buffer::BufferConfig;

use crate::config::{Batching, SchedConfig, SimConfig, Workload};
use crate::dist::{LatencyDist, LengthDist};
use crate::table::{Cell, Plot, Table};
use crate::{gpu, simulate, SimError, SimReport};

/// How much to simulate: `Full` for the published tables, `Quick` for tests and smoke runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Full,
    Quick,
}

impl Scale {
    fn steps(self) -> usize {
        match self {
            Scale::Full => 16,
            Scale::Quick => 5,
        }
    }
}

/// Single-turn math RLVR with a long tail: prompts ~300 tokens, responses log-normal with
/// median 1 k tokens and σ 0.9 (mean ~1.5 k, 1% above 8 k, cut at 8 k), a 50 ms verifier.
pub fn rlvr_workload() -> Workload {
    Workload {
        prompt_tokens: LengthDist::LogNormal {
            median: 300.0,
            sigma: 0.3,
        },
        response_tokens: LengthDist::LogNormal {
            median: 1000.0,
            sigma: 0.9,
        },
        max_new_tokens: 8192,
        max_total_tokens: 9000,
        max_turns: 1,
        end_prob: 0.0,
        observation_tokens: LengthDist::Fixed { tokens: 0 },
        reset_latency: LatencyDist::Fixed { secs: 0.0 },
        step_latency: LatencyDist::Fixed { secs: 0.05 },
        failure_rate: 0.0,
        hang_fraction: 0.0,
        step_timeout_s: 30.0,
        measured_groups: Vec::new(),
    }
}

/// Multi-turn agentic episodes: up to 10 turns (ending early with probability 0.1 per
/// turn), ~150-token actions, 50–200-token observations, environment steps log-normal with
/// mean 1.5 s and σ 1 (a heavy tail of slow tool calls), 1 s resets.
pub fn agentic_workload() -> Workload {
    Workload {
        prompt_tokens: LengthDist::LogNormal {
            median: 400.0,
            sigma: 0.2,
        },
        response_tokens: LengthDist::LogNormal {
            median: 150.0,
            sigma: 0.6,
        },
        max_new_tokens: 1024,
        max_total_tokens: 8192,
        max_turns: 10,
        end_prob: 0.1,
        observation_tokens: LengthDist::Uniform { min: 50, max: 200 },
        reset_latency: LatencyDist::Fixed { secs: 1.0 },
        step_latency: LatencyDist::LogNormal {
            mean: 1.5,
            sigma: 1.0,
            cap_secs: None,
        },
        failure_rate: 0.0,
        hang_fraction: 1.0,
        step_timeout_s: 30.0,
        measured_groups: Vec::new(),
    }
}

/// A GPU cluster config for `workload` with `groups` groups of 8 per step. `train_gpus`
/// `None` is the synchronous colocated baseline; `Some(t)` splits off `t` training GPUs
/// and runs asynchronously with `alpha`.
pub fn gpu_config(
    workload: Workload,
    gpus: usize,
    groups: usize,
    train_gpus: Option<usize>,
    alpha: f64,
    steps: usize,
) -> SimConfig {
    let (rollout, train, sync) = match train_gpus {
        None => (gpus, gpus, true),
        Some(t) => (gpus.saturating_sub(t).max(1), t.max(1), false),
    };
    // Lock-step generate-then-step is how a synchronous agentic rollout runs; for
    // single-turn tasks it only delays the verifier until the batch has generated.
    SimConfig {
        seed: 7,
        steps,
        cluster: gpu::cluster(rollout, train),
        inference: gpu::h800_7b_inference(),
        training: gpu::h800_7b_training(),
        sync: gpu::h800_7b_sync(),
        workload,
        sched: SchedConfig {
            buffer: BufferConfig {
                groups_per_batch: groups,
                group_size: 8,
                alpha: if sync { 0.0 } else { alpha },
                ..Default::default()
            },
            sync,
            lockstep: sync,
            ..Default::default()
        },
    }
}

/// The asynchronous run with the best of a few rollout/train splits of `gpus`.
fn best_split(
    make: &dyn Fn(usize) -> SimConfig,
    gpus: usize,
) -> Result<(usize, SimReport), SimError> {
    let candidates: Vec<usize> = [1, 2, 3, 4, 5, 6]
        .iter()
        .map(|&eighths| (gpus * eighths / 8).max(1))
        .filter(|&t| t < gpus)
        .collect();
    let mut best: Option<(usize, SimReport)> = None;
    for t in candidates {
        let r = simulate(&make(t))?;
        if best
            .as_ref()
            .is_none_or(|(_, b)| r.samples_per_s() > b.samples_per_s())
        {
            best = Some((t, r));
        }
    }
    best.ok_or(SimError::Config {
        field: "gpus".into(),
        message: "need at least 2 GPUs to split".into(),
    })
}

/// Speed-up over the synchronous baseline for each α, on `gpus` GPUs.
pub fn alpha_sweep(
    name: &str,
    label: &str,
    workload: Workload,
    gpus: usize,
    groups: usize,
    alphas: &[f64],
    scale: Scale,
) -> Result<Table, SimError> {
    let steps = scale.steps();
    let sync = simulate(&gpu_config(
        workload.clone(),
        gpus,
        groups,
        None,
        0.0,
        steps,
    ))?;
    let mut t = Table::new(
        name,
        &format!(
            "{label}: speed-up vs α ({gpus} GPUs, {} samples/step)",
            groups * 8
        ),
        &[
            "mode",
            "rollout+train GPUs",
            "samples/s",
            "speed-up",
            "mean staleness",
            "rollout util",
            "train util",
        ],
    );
    let row = |mode: String, split: String, r: &SimReport, base: f64| {
        let stale = r
            .staleness
            .iter()
            .map(|(k, v)| (*k * *v) as f64)
            .sum::<f64>()
            / r.trained_samples.max(1) as f64;
        vec![
            Cell::text(mode),
            Cell::text(split),
            Cell::num(r.samples_per_s(), 2),
            Cell::num(r.samples_per_s() / base, 2),
            Cell::num(stale, 2),
            Cell::num(r.rollout_util, 2),
            Cell::num(r.train_util, 2),
        ]
    };
    let base = sync.samples_per_s();
    t.rows.push(row(
        "sync (α=0)".into(),
        format!("{gpus} / {gpus} (colocated)"),
        &sync,
        base,
    ));
    // The synchronous run without lock step: how much of the gain is queue scheduling and
    // environment-level asynchrony alone, before any α.
    let mut unlocked = gpu_config(workload.clone(), gpus, groups, None, 0.0, steps);
    unlocked.sched.lockstep = false;
    let u = simulate(&unlocked)?;
    t.rows.push(row(
        "sync, no lock step".into(),
        format!("{gpus} / {gpus} (colocated)"),
        &u,
        base,
    ));
    let mut points = vec![(0.0, 1.0)];
    for &alpha in alphas {
        let make = |tr: usize| gpu_config(workload.clone(), gpus, groups, Some(tr), alpha, steps);
        let (tr, r) = best_split(&make, gpus)?;
        points.push((alpha, r.samples_per_s() / base));
        t.rows.push(row(
            format!("async α={alpha}"),
            format!("{} / {tr}", gpus - tr),
            &r,
            base,
        ));
    }
    t.note = format!(
        "Simulated {steps} steps each; samples/s over the whole run. The synchronous \
         baseline generates on all {gpus} GPUs, then trains on all {gpus}, its rollout in \
         lock step (all generate, then all step their environment or verifier); \
         \"no lock step\" is the same synchronous run with queue scheduling and \
         environment-level asynchrony. Asynchronous runs split the same {gpus} GPUs (best of \
         six splits shown). GPU costs: `gpu.rs` (H800, 7 B model)."
    );
    t.plots.push(Plot {
        name: name.to_string(),
        title: format!("{label}: speed-up over sync vs α ({gpus} GPUs)"),
        x_label: "α (0 = sync)".into(),
        y_label: "speed-up".into(),
        log_x: false,
        series: vec![("simulated".into(), points)],
    });
    Ok(t)
}

/// Throughput at 8, 64 and 512 GPUs with the batch scaled with the GPUs (weak scaling).
pub fn scaling(gpus_list: &[usize], alpha: f64, scale: Scale) -> Result<Table, SimError> {
    let steps = scale.steps();
    let groups_per_8 = 32;
    let mut t = Table::new(
        "scaling",
        "RLVR: throughput vs GPUs (batch grows with the GPUs)",
        &[
            "GPUs",
            "samples/step",
            "sync samples/s",
            "sync scaling",
            &format!("async α={alpha} samples/s"),
            "async rollout+train",
            "async scaling",
            "async efficiency",
        ],
    );
    // The split found best at the smallest size, kept in proportion.
    let first = gpus_list.first().copied().unwrap_or(8);
    let g0 = groups_per_8 * first / 8;
    let make0 = |tr: usize| gpu_config(rlvr_workload(), first, g0, Some(tr), alpha, steps);
    let (tr0, _) = best_split(&make0, first)?;
    let mut base: Option<(f64, f64)> = None;
    let mut sync_pts = Vec::new();
    let mut async_pts = Vec::new();
    for &g in gpus_list {
        let groups = groups_per_8 * g / 8;
        let s = simulate(&gpu_config(rlvr_workload(), g, groups, None, 0.0, steps))?;
        let tr = (tr0 * g / first).max(1);
        let a = simulate(&gpu_config(
            rlvr_workload(),
            g,
            groups,
            Some(tr),
            alpha,
            steps,
        ))?;
        let (bs, ba) = *base.get_or_insert((s.samples_per_s(), a.samples_per_s()));
        let ratio = g as f64 / first as f64;
        sync_pts.push((g as f64, s.samples_per_s() / bs));
        async_pts.push((g as f64, a.samples_per_s() / ba));
        t.rows.push(vec![
            Cell::num(g as f64, 0),
            Cell::num((groups * 8) as f64, 0),
            Cell::num(s.samples_per_s(), 2),
            Cell::num(s.samples_per_s() / bs, 2),
            Cell::num(a.samples_per_s(), 2),
            Cell::text(format!("{} / {tr}", g - tr)),
            Cell::num(a.samples_per_s() / ba, 2),
            Cell::num(a.samples_per_s() / ba / ratio, 2),
        ]);
    }
    t.note = format!(
        "{} groups of 8 per step per 8 GPUs; {steps} steps; scaling is throughput over the \
         {first}-GPU run of the same mode, efficiency is scaling / GPU ratio.",
        groups_per_8
    );
    t.plots.push(Plot {
        name: "scaling".into(),
        title: "RLVR: throughput scaling vs GPUs".into(),
        x_label: "GPUs".into(),
        y_label: format!("throughput / throughput at {first} GPUs"),
        log_x: true,
        series: vec![
            (
                "ideal".into(),
                gpus_list
                    .iter()
                    .map(|&g| (g as f64, g as f64 / first as f64))
                    .collect(),
            ),
            ("sync".into(), sync_pts),
            (format!("async α={alpha}"), async_pts),
        ],
    });
    Ok(t)
}

/// Batch-synchronous generation vs queue scheduling vs asynchrony as the response-length
/// tail grows. Two waves of requests per worker, so static batches matter.
pub fn long_tail(sigmas: &[f64], scale: Scale) -> Result<Table, SimError> {
    let steps = scale.steps();
    let (gpus, groups) = (8, 256);
    let mut t = Table::new(
        "long_tail",
        "RLVR: the long tail — batch-synchronous vs queue scheduling vs async (8 GPUs, 2048 samples/step)",
        &[
            "σ of log length",
            "mean / p99 tokens",
            "batch-sync samples/s",
            "queue-sched sync",
            "async α=2",
            "queue-sched speed-up",
            "async speed-up",
        ],
    );
    let mut q_pts = Vec::new();
    let mut a_pts = Vec::new();
    for &sigma in sigmas {
        let mut w = rlvr_workload();
        w.response_tokens = LengthDist::LogNormal {
            median: 1000.0,
            sigma,
        };
        let mut batch = gpu_config(w.clone(), gpus, groups, None, 0.0, steps);
        batch.cluster.batching = Batching::Static;
        let mut queue = batch.clone();
        queue.cluster.batching = Batching::Continuous;
        queue.sched.lockstep = false;
        let b = simulate(&batch)?;
        let q = simulate(&queue)?;
        let make = |tr: usize| gpu_config(w.clone(), gpus, groups, Some(tr), 2.0, steps);
        let (_, a) = best_split(&make, gpus)?;
        let mean = w.response_tokens.mean().min(8192.0);
        let p99 = (1000.0 * (2.326 * sigma).exp()).min(8192.0);
        let base = b.samples_per_s();
        q_pts.push((sigma, q.samples_per_s() / base));
        a_pts.push((sigma, a.samples_per_s() / base));
        t.rows.push(vec![
            Cell::num(sigma, 1),
            Cell::text(format!("{mean:.0} / {p99:.0}")),
            Cell::num(base, 2),
            Cell::num(q.samples_per_s(), 2),
            Cell::num(a.samples_per_s(), 2),
            Cell::num(q.samples_per_s() / base, 2),
            Cell::num(a.samples_per_s() / base, 2),
        ]);
    }
    t.note = "Batch-synchronous: static batches on each worker (a batch's slowest response \
              holds all its slots) and the verifier runs after the whole step has generated. \
              Queue scheduling: continuous batching, each response verified as it finishes \
              (still synchronous, α = 0). Async: queue scheduling plus α = 2 on split GPUs. \
              128 running requests per worker, so each step needs two waves of requests."
        .into();
    t.plots.push(Plot {
        name: "long_tail".into(),
        title: "Speed-up over batch-synchronous rollout vs length tail".into(),
        x_label: "σ of log response length".into(),
        y_label: "speed-up".into(),
        log_x: false,
        series: vec![
            ("queue scheduling (sync)".into(), q_pts),
            ("async α=2".into(), a_pts),
        ],
    });
    Ok(t)
}

/// Agentic rollouts whose environment steps fail (hang until the 30 s timeout) at a given
/// rate, with and without redundant trajectories per group.
pub fn redundancy(rates: &[f64], extra: usize, scale: Scale) -> Result<Table, SimError> {
    let steps = scale.steps();
    let (gpus, groups, train) = (8, 16, 4);
    let mut t = Table::new(
        "redundancy",
        &format!("Agentic: redundant environments vs failure rate (8 GPUs, async α=2, +{extra} trajectories per group)"),
        &[
            "step failure rate",
            "samples/s, no redundancy",
            &format!("samples/s, +{extra} per group"),
            "gain",
            "failed / aborted samples (redundant)",
        ],
    );
    let mut none_pts = Vec::new();
    let mut red_pts = Vec::new();
    for &rate in rates {
        let mut w = agentic_workload();
        w.failure_rate = rate;
        let base = gpu_config(w, gpus, groups, Some(train), 2.0, steps);
        let mut red = base.clone();
        red.sched.redundancy = extra;
        let a = simulate(&base)?;
        let b = simulate(&red)?;
        none_pts.push((rate, a.samples_per_s()));
        red_pts.push((rate, b.samples_per_s()));
        t.rows.push(vec![
            Cell::num(rate, 2),
            Cell::num(a.samples_per_s(), 2),
            Cell::num(b.samples_per_s(), 2),
            Cell::num(b.samples_per_s() / a.samples_per_s().max(1e-12), 2),
            Cell::text(format!(
                "{} / {}",
                b.accounting.failed, b.accounting.aborted
            )),
        ]);
    }
    t.note = "A failed step hangs until the 30 s step timeout; a group with fewer than 8 \
              usable trajectories cannot be trained on. Redundancy starts extra trajectories \
              per group and aborts the surplus once 8 have finished."
        .into();
    t.plots.push(Plot {
        name: "redundancy".into(),
        title: "Agentic throughput vs environment failure rate".into(),
        x_label: "failure rate per environment step".into(),
        y_label: "samples/s".into(),
        log_x: false,
        series: vec![
            ("no redundancy".into(), none_pts),
            (format!("+{extra} per group"), red_pts),
        ],
    });
    Ok(t)
}

/// Prompt replication on and off (a group's samples as independent requests vs one
/// `n`-per-request call on one worker).
pub fn replication(scale: Scale) -> Result<Table, SimError> {
    let steps = scale.steps();
    let mut t = Table::new(
        "replication",
        "RLVR: prompt replication (8 GPUs, 256 samples/step)",
        &[
            "mode",
            "samples/s, replication off",
            "samples/s, on",
            "gain",
        ],
    );
    for (label, train) in [("sync", None), ("async α=2", Some(4))] {
        let on = gpu_config(rlvr_workload(), 8, 32, train, 2.0, steps);
        let mut off = on.clone();
        off.sched.replication = false;
        let a = simulate(&off)?;
        let b = simulate(&on)?;
        t.rows.push(vec![
            Cell::text(label),
            Cell::num(a.samples_per_s(), 2),
            Cell::num(b.samples_per_s(), 2),
            Cell::num(b.samples_per_s() / a.samples_per_s().max(1e-12), 2),
        ]);
    }
    t.note = "Off: the 8 samples of a prompt are pinned to one worker, as a server runs an \
              `n = 8` request; on: 8 independent requests routed least-loaded."
        .into();
    Ok(t)
}

/// Every table, in the order `rollflash sim` prints them.
pub fn all(scale: Scale) -> Result<Vec<Table>, SimError> {
    let alphas = [1.0, 2.0, 4.0, 8.0];
    let (gpus_list, sigmas, rates): (Vec<usize>, Vec<f64>, Vec<f64>) = match scale {
        Scale::Full => (
            vec![8, 64, 512],
            vec![0.3, 0.6, 0.9, 1.2],
            vec![0.0, 0.01, 0.02, 0.05],
        ),
        Scale::Quick => (vec![8, 16], vec![0.3, 1.2], vec![0.0, 0.05]),
    };
    Ok(vec![
        alpha_sweep("alpha_rlvr", "RLVR", rlvr_workload(), 8, 32, &alphas, scale)?,
        alpha_sweep(
            "alpha_agentic",
            "Agentic",
            agentic_workload(),
            8,
            16,
            &alphas,
            scale,
        )?,
        scaling(&gpus_list, 2.0, scale)?,
        long_tail(&sigmas, scale)?,
        redundancy(&rates, 4, scale)?,
        replication(scale)?,
    ])
}
