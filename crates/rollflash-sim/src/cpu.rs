//! The CPU core split: how many threads generation and training get on a machine whose cores
//! they share, what that does to each phase's cost and to their [`Contention`], and a sweep
//! that says which split trains the most samples per second for a given model and batch.
//!
//! ## The model (every formula is in this module, and only here)
//! - A phase's speed on `k` effective cores, relative to one core, is Amdahl's law with its
//!   parallel fraction `p`: `1 / ((1 − p) + p / k)` for `k ≥ 1`. Below one core (a thread
//!   time-shared with others) the whole phase runs at `k` of a core's speed: speed `k`.
//!   See [`amdahl`].
//! - A side with `n` runnable threads among `total` runnable threads on `c` cores gets
//!   `min(n, c·n / total)` effective cores ([`core_share`]): its own threads while they fit,
//!   otherwise the OS time-shares the cores in proportion to runnable threads.
//! - Generation is `engines` engines (`cluster.inference_workers`) of `gen_threads` threads
//!   each; during a rollout they are all busy, so one engine alone gets
//!   `core_share(g, engines·g, c)`. Training is one process of `train_threads` threads:
//!   alone it gets `core_share(t, t, c) = min(t, c)`.
//! - While both run, everything is runnable at once: an engine gets
//!   `core_share(g, engines·g + t, c)`, training `core_share(t, engines·g + t, c)`.
//! - A phase's stand-alone cost scales by `speed(calibrated cores) / speed(cores alone)`
//!   (the costs were fitted with one engine, and the trainer, each timed alone at
//!   [`CpuScaling::calibrated`]); its contention factor is
//!   `speed(cores alone) / speed(cores shared)`, times [`CpuScaling::interference`].
//!
//! ## Assumptions, stated
//! - Processor sharing: the OS divides cores evenly among runnable threads, instantly.
//! - No penalty for oversubscription beyond the share itself (context switches, cache
//!   thrashing and lock holders preempted mid-section cost nothing extra); what shared
//!   caches and memory bandwidth cost while both run is [`CpuScaling::interference`], a
//!   measured residual, not modelled.
//! - Idle threads do not spin: a phase that is not running takes no core time, so a phase
//!   alone gets every core its threads can use.
//! - The share is computed from thread counts, not from which threads are runnable at an
//!   instant (a phase's serial part leaves its other threads idle, which this ignores).
//! - Training is one process (`cluster.train_workers` is left as it is; on a CPU it is 1).
//! - All of a phase's cost terms (per step, per sequence, per token, the first step's
//!   one-time cost) scale alike; the weight sync (an in-process hand-over) does not scale.

use serde::{Deserialize, Serialize};

use crate::config::{invalid, Contention, SimConfig};
use crate::table::{Cell, Table};
use crate::{simulate, SimError, SimReport};

/// Threads per phase on a machine of `cores` cores: `rollout.engine_threads` and
/// `train.threads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CpuSplit {
    /// Cores of the machine (or of the set the run is pinned to).
    pub cores: usize,
    /// Threads of one inference engine (`rollout.engine_threads`).
    pub gen_threads: usize,
    /// Threads of the trainer (`train.threads`).
    pub train_threads: usize,
}

impl Default for CpuSplit {
    fn default() -> Self {
        // The config defaults' costs: the built-in model on one core of the development
        // machine (see `InferenceCost`).
        CpuSplit {
            cores: 1,
            gen_threads: 1,
            train_threads: 1,
        }
    }
}

impl CpuSplit {
    /// Checks every count is at least 1; errors name `{field}.cores` and so on.
    pub fn validate(&self, field: &str) -> Result<(), SimError> {
        for (name, v) in [
            ("cores", self.cores),
            ("gen_threads", self.gen_threads),
            ("train_threads", self.train_threads),
        ] {
            if v == 0 {
                return Err(invalid(&format!("{field}.{name}"), "must be at least 1"));
            }
        }
        Ok(())
    }
}

/// How generation and training scale with cores, and what their costs were measured at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CpuScaling {
    /// Amdahl parallel fraction of an engine step, in [0, 1].
    pub gen_parallel: f64,
    /// Amdahl parallel fraction of a training step, in [0, 1].
    pub train_parallel: f64,
    /// The split the config's `inference` and `training` costs were calibrated at: one
    /// engine of `gen_threads` threads timed alone, the trainer of `train_threads` timed
    /// alone, on `cores` cores.
    pub calibrated: CpuSplit,
    /// Extra slow-down while both run that the core share does not explain (shared caches,
    /// memory bandwidth), multiplied onto the derived contention. 1 and 1 (the default):
    /// cores are all that is shared. [`CpuScaling::residual`] fits it from a measurement.
    pub interference: Contention,
}

impl Default for CpuScaling {
    fn default() -> Self {
        // Both phases are mostly matrix products spread over threads; 0.9 is a typical
        // fraction, to be replaced by a measured one.
        CpuScaling {
            gen_parallel: 0.9,
            train_parallel: 0.9,
            calibrated: CpuSplit::default(),
            interference: Contention::default(),
        }
    }
}

/// What a split does to one simulation, derived by [`CpuScaling::factors`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuFactors {
    /// Effective cores of one engine running alone (all engines busy, training idle).
    pub gen_cores_alone: f64,
    /// Effective cores of the trainer running alone.
    pub train_cores_alone: f64,
    /// Effective cores of one engine while training runs too.
    pub gen_cores_shared: f64,
    /// Effective cores of the trainer while generation runs too.
    pub train_cores_shared: f64,
    /// Multiplier on every inference cost term: calibrated speed / speed alone here.
    pub gen_cost_scale: f64,
    /// Multiplier on every training cost term: calibrated speed / speed alone here.
    pub train_cost_scale: f64,
    /// The slow-downs while both run: speed alone / speed shared, times the interference.
    pub contention: Contention,
}

/// Speed-up of a phase with parallel fraction `p` on `k` effective cores, over one core:
/// Amdahl's `1 / ((1 − p) + p / k)` from one core up; below one core (time-shared), `k`.
pub fn amdahl(p: f64, k: f64) -> f64 {
    if k <= 1.0 {
        // A fraction of one core runs serial and parallel parts alike at that fraction.
        k
    } else {
        1.0 / ((1.0 - p) + p / k)
    }
}

/// Effective cores of a side with `threads` runnable threads when `total` threads (its own
/// included) are runnable on `cores` cores: all its threads while they fit, otherwise a
/// share of the cores in proportion to its threads (processor sharing).
pub fn core_share(threads: usize, total: usize, cores: usize) -> f64 {
    let (n, total, c) = (threads as f64, total.max(1) as f64, cores as f64);
    n.min(c * n / total)
}

impl CpuScaling {
    /// Checks the fractions, the calibrated split and the interference; errors name
    /// `{field}.gen_parallel` and so on.
    pub fn validate(&self, field: &str) -> Result<(), SimError> {
        for (name, v) in [
            ("gen_parallel", self.gen_parallel),
            ("train_parallel", self.train_parallel),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(invalid(
                    &format!("{field}.{name}"),
                    format!("must be in [0, 1], got {v}"),
                ));
            }
        }
        self.calibrated.validate(&format!("{field}.calibrated"))?;
        for (name, v) in [
            ("interference.gen", self.interference.gen),
            ("interference.train", self.interference.train),
        ] {
            if !(v > 0.0) || !v.is_finite() {
                return Err(invalid(
                    &format!("{field}.{name}"),
                    format!("must be finite and > 0, got {v}"),
                ));
            }
        }
        Ok(())
    }

    /// The factors of running `split` with `engines` engines (see the module docs). Errors
    /// name `split.*`, `scaling.*` or `engines`.
    pub fn factors(&self, split: &CpuSplit, engines: usize) -> Result<CpuFactors, SimError> {
        self.validate("scaling")?;
        split.validate("split")?;
        if engines == 0 {
            return Err(invalid("engines", "must be at least 1"));
        }
        let (pg, pt) = (self.gen_parallel, self.train_parallel);
        let (g, t, c) = (split.gen_threads, split.train_threads, split.cores);
        let all_gen = engines * g;
        let gen_alone = core_share(g, all_gen, c);
        let train_alone = core_share(t, t, c);
        let gen_shared = core_share(g, all_gen + t, c);
        let train_shared = core_share(t, all_gen + t, c);
        let cal = &self.calibrated;
        // Calibration timed one engine, and the trainer, each alone on the machine.
        let gen_cal = core_share(cal.gen_threads, cal.gen_threads, cal.cores);
        let train_cal = core_share(cal.train_threads, cal.train_threads, cal.cores);
        Ok(CpuFactors {
            gen_cores_alone: gen_alone,
            train_cores_alone: train_alone,
            gen_cores_shared: gen_shared,
            train_cores_shared: train_shared,
            gen_cost_scale: amdahl(pg, gen_cal) / amdahl(pg, gen_alone),
            train_cost_scale: amdahl(pt, train_cal) / amdahl(pt, train_alone),
            contention: Contention {
                gen: amdahl(pg, gen_alone) / amdahl(pg, gen_shared) * self.interference.gen,
                train: amdahl(pt, train_alone) / amdahl(pt, train_shared) * self.interference.train,
            },
        })
    }

    /// The interference that makes this model reproduce `measured`, the contention timed at
    /// the calibrated split with `engines` engines: measured / derived from the core share
    /// alone (this scaling's own interference ignored). Below 1 where the measurement was
    /// gentler than processor sharing predicts.
    pub fn residual(&self, measured: &Contention, engines: usize) -> Result<Contention, SimError> {
        let bare = CpuScaling {
            interference: Contention::default(),
            ..self.clone()
        };
        let f = bare.factors(&self.calibrated, engines)?;
        Ok(Contention {
            gen: measured.gen / f.contention.gen,
            train: measured.train / f.contention.train,
        })
    }
}

impl SimConfig {
    /// This config run at `split`: the inference and training costs (calibrated at
    /// `scaling.calibrated`) rescaled to the split's cores alone, and `cluster.contention`
    /// replaced by the split's derived contention. Generation is
    /// `cluster.inference_workers` engines of `split.gen_threads` threads each.
    pub fn with_cpu_split(
        &self,
        split: &CpuSplit,
        scaling: &CpuScaling,
    ) -> Result<SimConfig, SimError> {
        self.validate()?;
        let f = scaling.factors(split, self.cluster.inference_workers)?;
        Ok(self.with_factors(&f))
    }

    /// Applies derived factors: the one place costs and contention change with the split.
    fn with_factors(&self, f: &CpuFactors) -> SimConfig {
        let mut c = self.clone();
        let i = &mut c.inference;
        for v in [
            &mut i.step_s,
            &mut i.seq_s,
            &mut i.context_token_s,
            &mut i.prefill_token_s,
        ] {
            *v *= f.gen_cost_scale;
        }
        let t = &mut c.training;
        for v in [&mut t.step_s, &mut t.token_s, &mut t.first_step_s] {
            *v *= f.train_cost_scale;
        }
        c.cluster.contention = f.contention.clone();
        c
    }
}

/// One split to try: threads per engine and for the trainer, asynchronous (the base
/// config's scheduler with `sched.sync` off) or the synchronous baseline (α = 0 with the
/// barrier; its phases alternate, so each can have every core).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitCandidate {
    pub gen_threads: usize,
    pub train_threads: usize,
    pub sync: bool,
}

impl SplitCandidate {
    /// `async 2+1` (engine threads + trainer threads) or `sync 2+2`.
    pub fn label(&self) -> String {
        let mode = if self.sync { "sync" } else { "async" };
        format!("{mode} {}+{}", self.gen_threads, self.train_threads)
    }
}

/// Every asynchronous split with 1..=`cores` threads per engine and 1..=`cores` for the
/// trainer, then the synchronous baseline with each phase on all `cores`.
pub fn split_candidates(cores: usize) -> Vec<SplitCandidate> {
    let mut v = Vec::new();
    for gen_threads in 1..=cores {
        for train_threads in 1..=cores {
            v.push(SplitCandidate {
                gen_threads,
                train_threads,
                sync: false,
            });
        }
    }
    v.push(SplitCandidate {
        gen_threads: cores,
        train_threads: cores,
        sync: true,
    });
    v
}

/// One candidate's simulated run.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitResult {
    pub candidate: SplitCandidate,
    pub factors: CpuFactors,
    /// Trained samples per virtual second over the whole run ([`SimReport::samples_per_s`]).
    pub samples_per_s: f64,
    /// `samples_per_s` over the first synchronous candidate's; `None` without one.
    pub vs_sync: Option<f64>,
    pub report: SimReport,
}

/// Simulates `base` at every candidate split of `cores` cores and returns them best first
/// (most trained samples/s; ties keep the candidates' order). Asynchronous candidates run
/// `base`'s scheduler settings with `sched.sync` off (set α there); synchronous ones run
/// it with `sched.sync` on and α = 0. Same seed throughout, so every candidate sees the
/// same tasks.
pub fn best_split(
    base: &SimConfig,
    scaling: &CpuScaling,
    cores: usize,
    candidates: &[SplitCandidate],
) -> Result<Vec<SplitResult>, SimError> {
    base.validate()?;
    if candidates.is_empty() {
        return Err(invalid("candidates", "needs at least one split"));
    }
    let mut out = Vec::with_capacity(candidates.len());
    for cand in candidates {
        let split = CpuSplit {
            cores,
            gen_threads: cand.gen_threads,
            train_threads: cand.train_threads,
        };
        let factors = scaling.factors(&split, base.cluster.inference_workers)?;
        let mut cfg = base.with_factors(&factors);
        cfg.sched.sync = cand.sync;
        if cand.sync {
            cfg.sched.buffer.alpha = 0.0;
        }
        let report = simulate(&cfg)?;
        out.push(SplitResult {
            candidate: *cand,
            factors,
            samples_per_s: report.samples_per_s(),
            vs_sync: None,
            report,
        });
    }
    if let Some(sync) = out
        .iter()
        .find(|r| r.candidate.sync)
        .map(|r| r.samples_per_s)
    {
        for r in &mut out {
            r.vs_sync = Some(r.samples_per_s / sync.max(1e-12));
        }
    }
    // Stable: equal throughputs keep the order the candidates were given in.
    out.sort_by(|a, b| b.samples_per_s.total_cmp(&a.samples_per_s));
    Ok(out)
}

/// The sweep as a table, best first.
pub fn split_table(results: &[SplitResult], cores: usize) -> Table {
    let mut t = Table::new(
        "cpu_split",
        &format!("Core split: trained samples/s per split ({cores} cores)"),
        &[
            "split",
            "engine threads",
            "train threads",
            "samples/s",
            "vs sync",
            "gen slow-down shared",
            "train slow-down shared",
        ],
    );
    for r in results {
        // The synchronous baseline never runs both phases at once: no slow-down applies.
        let slowdown = |v: f64| {
            if r.candidate.sync {
                Cell::text("-")
            } else {
                Cell::num(v, 2)
            }
        };
        t.rows.push(vec![
            Cell::text(r.candidate.label()),
            Cell::num(r.candidate.gen_threads as f64, 0),
            Cell::num(r.candidate.train_threads as f64, 0),
            Cell::num(r.samples_per_s, 3),
            r.vs_sync
                .map_or_else(|| Cell::text("-"), |v| Cell::num(v, 2)),
            slowdown(r.factors.contention.gen),
            slowdown(r.factors.contention.train),
        ]);
    }
    t.note = "Each phase's cost scales with its effective cores by Amdahl's law; while both \
              run, the OS shares the cores in proportion to runnable threads (processor \
              sharing, no oversubscription penalty, idle threads do not spin). Sync: α = 0 \
              with the barrier, each phase on every core in turn. See `rollflash_sim::cpu`."
        .into();
    t
}
