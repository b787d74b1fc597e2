//! Timing the real learner on batches of the calibration's own trajectories, and how much
//! engine and learner slow each other when they run at the same time on this machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rollflash_core::buffer::{Batch, BatchGroup, GroupKey};
use rollflash_core::{PolicyVersion, Trajectory};
use rollflash_model::config::ModelConfig;
use rollflash_model::model::Transformer;
use rollflash_model::train::TrainableModel;
use rollflash_model::weights::Weights;
use rollflash_sim::{InferenceCost, TrainCost};
use rollflash_trainer::learner::PolicyLearner;
use rollflash_trainer::Learner;

use super::engine::{generate_until, TurnRequest};
use super::fit::{fit_training, slowdown};
use super::plan::Plan;
use super::CalibrateError;

/// The learner after its timing, with the last (full-size) batch it trained on, for the
/// contention measurement.
pub struct TimedLearner {
    pub cost: TrainCost,
    pub learner: PolicyLearner,
    pub batch: Batch<Trajectory>,
    /// Tokens of `batch`.
    pub tokens: usize,
}

/// Times the run's learner on batches of `trajs` of two sizes (a full batch and half of
/// one), the largest first; fits `a + b·tokens` on all but the first step, whose excess
/// over the fit is the one-time cost of a run's first step.
pub fn time_learner(
    plan: &Plan,
    model_cfg: &ModelConfig,
    weights: &Weights,
    trajs: &[Trajectory],
) -> Result<TimedLearner, CalibrateError> {
    if trajs.is_empty() {
        return Err(CalibrateError::Invalid(
            "no trajectories to time the learner on".into(),
        ));
    }
    let model = TrainableModel::new(
        model_cfg,
        weights,
        plan.placement.dtype,
        &plan.placement.device,
    )?;
    let mut learner = PolicyLearner::new(model, plan.learner.clone())?;
    let group = plan.buffer.group_size.max(1);
    let full = plan.buffer.groups_per_batch.max(2);
    let mut batches: Vec<(Batch<Trajectory>, usize)> =
        [full, full / 2, full, full / 2, full, full / 2, full]
            .into_iter()
            .enumerate()
            .map(|(rep, groups)| {
                let mut batch = Batch {
                    version: PolicyVersion(0),
                    groups: Vec::new(),
                };
                let mut tokens = 0usize;
                for g in 0..groups {
                    let start = ((rep * 7 + g) * group) % trajs.len();
                    let samples: Vec<(Trajectory, f64)> = (0..group)
                        .map(|i| {
                            let t = trajs[(start + i) % trajs.len()].clone();
                            tokens += t.tokens.len();
                            // Mixed rewards, so advantages are non-zero as in a real batch.
                            (t, (i % 2) as f64)
                        })
                        .collect();
                    batch.groups.push(BatchGroup {
                        key: GroupKey(g as u64),
                        start: PolicyVersion(0),
                        samples,
                    });
                }
                (batch, tokens)
            })
            .collect();
    // The largest batch first: the fresh learner's first step then pays every one-time
    // cost — first-touching the memory of the largest footprint — and the fitted steps
    // none (a later, larger batch would pay for the memory it adds, and bias the fit).
    if let Some(i) = (0..batches.len()).max_by_key(|&i| batches[i].1) {
        let b = batches.remove(i);
        batches.insert(0, b);
    }
    let mut points = Vec::new();
    let mut first = (0.0, 0.0);
    let mut last = None;
    for (rep, (batch, tokens)) in batches.into_iter().enumerate() {
        let t0 = Instant::now();
        learner.train(&batch)?;
        let secs = t0.elapsed().as_secs_f64();
        if rep > 0 {
            points.push((tokens as f64, secs));
        } else {
            first = (tokens as f64, secs);
        }
        last = Some((batch, tokens));
    }
    let (batch, tokens) =
        last.ok_or_else(|| CalibrateError::Invalid("no calibration batch".into()))?;
    let mut cost = fit_training(&points);
    cost.first_step_s = (first.1 - cost.step_time(first.0 as u64, 1)).max(0.0);
    Ok(TimedLearner {
        cost,
        learner,
        batch,
        tokens,
    })
}

/// Runs the engine (generating continuously on `requests`, in its own thread) and the
/// learner at the same time, and returns how much slower each was than its fitted cost
/// alone: the contention of sharing this machine's cores, caches and memory bandwidth.
pub fn time_contention(
    model: &Arc<Transformer>,
    plan: &Plan,
    requests: &[TurnRequest],
    inference: &InferenceCost,
    timed: &mut TimedLearner,
) -> Result<(f64, f64), CalibrateError> {
    let stop = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    let learner = &mut timed.learner;
    let batch = &timed.batch;
    let (gen_steps, train_times) = std::thread::scope(|s| -> Result<_, CalibrateError> {
        let engine = s.spawn(|| {
            generate_until(
                model,
                plan.engine_threads,
                plan.max_running,
                requests,
                &stop,
                &started,
            )
        });
        while !started.load(Ordering::Relaxed) && !engine.is_finished() {
            std::thread::yield_now();
        }
        let mut times = Vec::new();
        let mut result = Ok(());
        for _ in 0..3 {
            let t0 = Instant::now();
            if let Err(e) = learner.train(batch) {
                result = Err(CalibrateError::from(e));
                break;
            }
            times.push(t0.elapsed().as_secs_f64());
        }
        stop.store(true, Ordering::Relaxed);
        let steps = engine.join().map_err(|_| CalibrateError::Panicked)??;
        result?;
        Ok((steps, times))
    })?;
    let train_alone = timed.cost.step_time(timed.tokens as u64, 1);
    let train_together = train_times.iter().sum::<f64>() / train_times.len().max(1) as f64;
    Ok((
        slowdown(&gen_steps, inference),
        (train_together / train_alone.max(1e-12)).max(1.0),
    ))
}
