//! ROLL's `running` reward normalisation against the float64 NumPy reference.
//!
//! `scripts/reference_losses.py generate` (`running_cases()`, written under `running` in
//! `scripts/reference_losses.json`) runs ROLL's `RunningMoments` + `reward_norm` over streams
//! of batches — the statistics updated with each batch before it is normalised — and checks
//! there that the merged mean / std equal the closed form over everything seen. Here the
//! shaping pipeline, carrying one [`RunningMoments`] from batch to batch, must give the same
//! normalised rewards and the same state after every batch.
//!
//! Tolerance: 1e-12 relative plus 1e-12 absolute (the same arithmetic in the same order;
//! one case divides a zero-variance group's offset from the running mean by 1e-6).

use rollflash_train::advantage::{AdvantageBatch, AdvantageEstimator};
use rollflash_train::shaping::{
    compute_shaped_advantages, compute_shaped_advantages_with, normalize_rewards,
    normalize_rewards_running, NormScope, RunningMoments, ShapingConfig,
};
use serde::Deserialize;

use crate::common::{assert_all_close, assert_close};

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/reference_losses.json"
));

#[derive(Debug, Deserialize)]
struct Fixture {
    running: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    shaping: serde_json::Value,
    steps: Vec<Step>,
}

#[derive(Debug, Deserialize)]
struct Step {
    rewards: Vec<f64>,
    group_sizes: Vec<usize>,
    normalized: Vec<f64>,
    mean: f64,
    var: f64,
    count: f64,
    /// `None` where it is infinite (one reward seen in all).
    std: Option<f64>,
}

/// One token per sequence, all valid: the estimator is REINFORCE++ without whitening and γ = 1,
/// whose advantage on that token is the shaped reward itself.
fn one_token_batch<'a>(
    rewards: &'a [f64],
    groups: &'a [usize],
    offs: &'a [usize],
    mask: &'a [bool],
) -> AdvantageBatch<'a> {
    AdvantageBatch {
        rewards,
        group_sizes: groups,
        seq_offsets: offs,
        mask,
        kl: None,
    }
}

fn passthrough() -> AdvantageEstimator {
    AdvantageEstimator::ReinforcePlusPlus {
        gamma: 1.0,
        kl_coef: 0.0,
        baseline: false,
        whiten: false,
        eps: 1e-8,
    }
}

#[test]
fn running_normalisation_matches_reference_across_steps() {
    let fx: Fixture = serde_json::from_str(FIXTURE).unwrap();
    assert!(fx.running.len() >= 6);
    for case in &fx.running {
        let sh: ShapingConfig = serde_json::from_value(case.shaping.clone())
            .unwrap_or_else(|e| panic!("{}: shaping: {e}", case.name));
        assert!(sh.uses_running(), "{}", case.name);
        let mut running = RunningMoments::default();
        for (k, step) in case.steps.iter().enumerate() {
            let what = format!("{} step {k}", case.name);
            let n = step.rewards.len();
            let offs: Vec<usize> = (0..n).collect();
            let mask = vec![true; n];
            let batch = one_token_batch(&step.rewards, &step.group_sizes, &offs, &mask);
            let out =
                compute_shaped_advantages_with(&passthrough(), &sh, &batch, None, &mut running)
                    .unwrap();
            assert_all_close(&out.rewards, &step.normalized, 1e-12, 1e-12, &what);
            assert_all_close(&out.advantages, &step.normalized, 1e-12, 1e-12, &what);
            assert_close(
                running.mean,
                step.mean,
                1e-12,
                1e-12,
                &format!("{what}: mean"),
            );
            assert_close(running.var, step.var, 1e-12, 1e-12, &format!("{what}: var"));
            assert_close(
                running.count,
                step.count,
                0.0,
                1e-15,
                &format!("{what}: count"),
            );
            match step.std {
                Some(s) => assert_close(running.std(), s, 1e-12, 1e-12, &format!("{what}: std")),
                None => assert_eq!(running.std(), f64::INFINITY, "{what}: std"),
            }
            assert_eq!(running.batches, k as u64 + 1);
            assert_eq!(out.metrics.running, Some(running), "{what}: metrics");
        }
    }
}

#[test]
fn running_moments_follow_roll_from_its_prior() {
    // ROLL's initial state: mean 0, var 1, std 1, count 1e-24.
    let r = RunningMoments::default();
    assert_eq!((r.mean, r.var, r.count, r.std()), (0.0, 1.0, 1e-24, 1.0));
    // One batch takes over (the prior's count vanishes next to 4 samples); the std is the
    // batch's unbiased one, the variance its biased one plus a 1e-24-sized remnant.
    let mut r = RunningMoments::default();
    r.update(&[1.0, 2.0, 3.0, 6.0]);
    assert_eq!(r.mean, 3.0);
    assert_eq!(r.count, 4.0);
    assert_close(r.var, 3.5, 0.0, 1e-15, "var");
    assert_close(r.std(), (14.0f64 / 3.0).sqrt(), 0.0, 1e-15, "std");
    // Merging two batches equals one batch of both (the parallel-variance formula).
    let (mut a, mut b) = (RunningMoments::default(), RunningMoments::default());
    a.update(&[0.5, -1.0, 2.0]);
    a.update(&[4.0, 0.0]);
    b.update(&[0.5, -1.0, 2.0, 4.0, 0.0]);
    assert_close(a.mean, b.mean, 1e-15, 0.0, "merged mean");
    assert_close(a.std(), b.std(), 1e-15, 1e-15, "merged std");
    // An empty batch changes nothing.
    let before = a;
    a.update(&[]);
    assert_eq!(a, before);
}

#[test]
fn running_state_persists_only_through_the_caller() {
    // The stateless entry point starts every call from the prior: two calls on the same
    // batch agree, while a carried state normalises the second batch differently.
    let sh = ShapingConfig {
        norm_mean_type: NormScope::Running,
        norm_std_type: NormScope::Running,
        ..Default::default()
    };
    let rewards = [1.0, 0.0, 3.0, 1.0];
    let offs = [0, 1, 2, 3];
    let mask = [true; 4];
    let batch = one_token_batch(&rewards, &[2, 2], &offs, &mask);
    let a = compute_shaped_advantages(&passthrough(), &sh, &batch).unwrap();
    let b = compute_shaped_advantages(&passthrough(), &sh, &batch).unwrap();
    assert_eq!(a.advantages, b.advantages);
    let mut running = RunningMoments::default();
    let first =
        compute_shaped_advantages_with(&passthrough(), &sh, &batch, None, &mut running).unwrap();
    assert_eq!(first.advantages, a.advantages);
    let other = [10.0, 12.0, 8.0, 9.0];
    let batch2 = one_token_batch(&other, &[2, 2], &offs, &mask);
    compute_shaped_advantages_with(&passthrough(), &sh, &batch2, None, &mut running).unwrap();
    let third =
        compute_shaped_advantages_with(&passthrough(), &sh, &batch, None, &mut running).unwrap();
    assert_ne!(third.advantages, a.advantages);
    assert_eq!(running.batches, 3);
    // A step that fails after normalising (here the estimator's own check) leaves the state
    // as it was.
    let before = running;
    let bad = AdvantageEstimator::Grpo {
        norm_by_std: true,
        eps: -1.0,
    };
    assert!(compute_shaped_advantages_with(&bad, &sh, &batch, None, &mut running).is_err());
    assert_eq!(running, before);
    // Without a running scope the state is never touched.
    let mut untouched = RunningMoments::default();
    normalize_rewards_running(
        &rewards,
        &[2, 2],
        NormScope::Group,
        NormScope::Batch,
        1e-6,
        &mut untouched,
    )
    .unwrap();
    assert_eq!(untouched, RunningMoments::default());
    // A one-sample first batch: infinite running std, normalised reward 0 (as in ROLL).
    let r = normalize_rewards(&[2.0], &[1], NormScope::Running, NormScope::Running, 1e-6).unwrap();
    assert_eq!(r, vec![0.0]);
}

#[test]
fn running_scope_parses_and_a_bad_state_is_refused() {
    let sh: ShapingConfig =
        serde_json::from_str(r#"{"norm_mean_type": "running", "norm_std_type": "group"}"#).unwrap();
    assert_eq!(sh.norm_mean_type, NormScope::Running);
    assert!(sh.uses_running() && sh.is_active());
    assert!(!ShapingConfig::default().uses_running());
    // The state round-trips through JSON exactly (checkpoints store it so).
    let mut r = RunningMoments::default();
    r.update(&[0.1, 0.7, -0.3]);
    r.update(&[1.0 / 3.0, 2.0]);
    let back: RunningMoments = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
    let bad = RunningMoments {
        var: -1.0,
        ..RunningMoments::default()
    };
    let mut state = bad;
    let rewards = [1.0, 2.0];
    let batch = one_token_batch(&rewards, &[2], &[0, 1], &[true, true]);
    let e =
        compute_shaped_advantages_with(&passthrough(), &sh, &batch, None, &mut state).unwrap_err();
    assert!(e.to_string().contains("shaping.running"), "{e}");
}
