//! Reward and advantage shaping against the float64 NumPy reference, and its edge cases.
//!
//! The reference cases come from `scripts/reference_losses.py generate` (`shaping_cases()`,
//! written into `scripts/reference_losses.json` under `shaping`): ROLL's `reward_norm` with
//! group / batch mean and std, reward clipping (per sequence, and REINFORCE++'s token
//! rewards), whitening after GRPO / RLOO / REINFORCE++, advantage clipping and DAPO's soft
//! overlong punishment, on the 9-sequence batch of `advantage.rs` (a singleton group, a
//! zero-variance group, masked tokens inside and at the ends of sequences).
//!
//! Tolerance: 1e-9 absolute (same formulas; whitening divides by sqrt(var + 1e-8) on both
//! sides).

use rollflash_train::advantage::{AdvantageBatch, AdvantageEstimator};
use rollflash_train::shaping::{
    compute_shaped_advantages, normalize_rewards, NormScope, OverlongConfig, ShapingConfig,
};
use rollflash_train::{compute_advantages, TrainError};
use serde::Deserialize;

use crate::common::assert_all_close;

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/reference_losses.json"
));

#[derive(Debug, Deserialize)]
struct Fixture {
    shaping: ShapingFixture,
}

#[derive(Debug, Deserialize)]
struct ShapingFixture {
    rewards: Vec<f64>,
    group_sizes: Vec<usize>,
    lengths: Vec<usize>,
    mask: Vec<u8>,
    kl: Vec<f64>,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    estimator: serde_json::Value,
    shaping: serde_json::Value,
    advantages: Vec<f64>,
}

fn offsets(lengths: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 0;
    for &l in lengths {
        out.push(at);
        at += l;
    }
    out
}

#[test]
fn shaped_advantages_match_reference() {
    let fx: Fixture = serde_json::from_str(FIXTURE).unwrap();
    let f = &fx.shaping;
    let mask: Vec<bool> = f.mask.iter().map(|&m| m == 1).collect();
    let offs = offsets(&f.lengths);
    assert!(f.cases.len() >= 9);
    for case in &f.cases {
        let est: AdvantageEstimator = serde_json::from_value(case.estimator.clone())
            .unwrap_or_else(|e| panic!("{}: estimator: {e}", case.name));
        let sh: ShapingConfig = serde_json::from_value(case.shaping.clone())
            .unwrap_or_else(|e| panic!("{}: shaping: {e}", case.name));
        let batch = AdvantageBatch {
            rewards: &f.rewards,
            group_sizes: &f.group_sizes,
            seq_offsets: &offs,
            mask: &mask,
            kl: Some(&f.kl),
        };
        let got = compute_shaped_advantages(&est, &sh, &batch).unwrap();
        assert_all_close(&got.advantages, &case.advantages, 1e-9, 0.0, &case.name);
    }
}

#[test]
fn reference_shaping_cases_exercise_what_they_test() {
    let fx: Fixture = serde_json::from_str(FIXTURE).unwrap();
    let f = &fx.shaping;
    let mask: Vec<bool> = f.mask.iter().map(|&m| m == 1).collect();
    let offs = offsets(&f.lengths);
    let run = |name: &str| {
        let case = f.cases.iter().find(|c| c.name == name).unwrap();
        let est: AdvantageEstimator = serde_json::from_value(case.estimator.clone()).unwrap();
        let sh: ShapingConfig = serde_json::from_value(case.shaping.clone()).unwrap();
        let batch = AdvantageBatch {
            rewards: &f.rewards,
            group_sizes: &f.group_sizes,
            seq_offsets: &offs,
            mask: &mask,
            kl: Some(&f.kl),
        };
        compute_shaped_advantages(&est, &sh, &batch)
            .unwrap()
            .metrics
    };
    let m = run("roll_reinforce_pp");
    assert!(
        m.reward_clip_frac > 0.0 && m.advantage_clip_frac > 0.0,
        "{m:?}"
    );
    assert!(run("grpo_whiten_clip").advantage_clip_frac > 0.0);
    assert!(run("std_only_clip").reward_clip_frac > 0.0);
    let m = run("dr_grpo_overlong");
    assert!(m.overlong_frac > 0.0 && m.overlong_frac < 1.0, "{m:?}");
    // ROLL's order (normalise, then clip the normalised reward) for the group estimators:
    // the clip bites, and the reference checked that clipping first would differ.
    for name in [
        "grpo_batch_norm_clip",
        "grpo_group_mean_batch_std_clip",
        "rloo_group_norm_clip",
    ] {
        let m = run(name);
        assert!(
            m.reward_clip_frac > 0.0 && m.reward_clip_frac < 1.0,
            "{name}: {m:?}"
        );
    }
}

#[test]
fn default_shaping_is_the_bare_estimator() {
    let rewards = [1.0, 0.0, 0.5, 2.0];
    let mask = [true, true, false, true, true, true];
    let offs = [0, 2, 3, 5];
    let batch = AdvantageBatch {
        rewards: &rewards,
        group_sizes: &[2, 2],
        seq_offsets: &offs,
        mask: &mask,
        kl: None,
    };
    for est in [
        AdvantageEstimator::default(),
        AdvantageEstimator::Rloo,
        AdvantageEstimator::reinforce_plus_plus(),
    ] {
        let shaped = compute_shaped_advantages(&est, &ShapingConfig::default(), &batch).unwrap();
        assert_eq!(shaped.advantages, compute_advantages(&est, &batch).unwrap());
        assert_eq!(shaped.rewards, rewards);
    }
}

#[test]
fn zero_variance_group_and_one_sample_batches_stay_finite() {
    // Group mean and std on a zero-variance group: (r − μ)/(0 + eps) = 0.
    let r = normalize_rewards(
        &[0.3, 0.3, 0.3, 1.0, 0.0],
        &[3, 2],
        NormScope::Group,
        NormScope::Group,
        1e-6,
    )
    .unwrap();
    assert_eq!(&r[..3], &[0.0, 0.0, 0.0]);
    assert!(r.iter().all(|x| x.is_finite()));
    // A one-sample batch: the std is undefined; the normalised reward is 0, not NaN.
    for (mean, std) in [
        (NormScope::Batch, NormScope::Batch),
        (NormScope::None, NormScope::Batch),
        (NormScope::Group, NormScope::Group),
    ] {
        let r = normalize_rewards(&[0.7], &[1], mean, std, 1e-6).unwrap();
        assert_eq!(r, vec![0.0], "{mean:?}/{std:?}");
    }
    // Mean only on one sample: r − r = 0.
    assert_eq!(
        normalize_rewards(&[0.7], &[1], NormScope::Batch, NormScope::None, 1e-6).unwrap(),
        vec![0.0]
    );
    // The whole pipeline on one sequence with everything on: finite, and one valid token
    // skips whitening as ROLL does.
    let sh = ShapingConfig {
        norm_mean_type: NormScope::Batch,
        norm_std_type: NormScope::Batch,
        reward_clip: Some(1.0),
        whiten_advantages: true,
        advantage_clip: Some(2.0),
        overlong: Some(OverlongConfig {
            max_len: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    };
    let batch = AdvantageBatch {
        rewards: &[1.0],
        group_sizes: &[1],
        seq_offsets: &[0],
        mask: &[false, true],
        kl: None,
    };
    let out =
        compute_shaped_advantages(&AdvantageEstimator::reinforce_plus_plus(), &sh, &batch).unwrap();
    assert!(out.advantages.iter().all(|a| a.is_finite()));
}

#[test]
fn all_masked_sequences_get_zero_advantages_and_no_length_penalty() {
    let sh = ShapingConfig {
        norm_mean_type: NormScope::Group,
        norm_std_type: NormScope::Batch,
        whiten_advantages: true,
        overlong: Some(OverlongConfig {
            max_len: Some(2),
            cache_len: Some(1),
            penalty_factor: 1.0,
        }),
        ..Default::default()
    };
    let mask = [false, false, true, true, true, false];
    let batch = AdvantageBatch {
        rewards: &[1.0, 0.0, 1.0],
        group_sizes: &[3],
        seq_offsets: &[0, 2, 5],
        mask: &mask,
        kl: None,
    };
    let out = compute_shaped_advantages(&AdvantageEstimator::Rloo, &sh, &batch).unwrap();
    // Sequence 0 and 2 have no valid token: zero advantages; sequence 1 (3 tokens > L_max)
    // is the one penalised.
    assert_eq!(&out.advantages[..2], &[0.0, 0.0]);
    assert_eq!(out.advantages[5], 0.0);
    assert!((out.metrics.overlong_frac - 1.0 / 3.0).abs() < 1e-12);
    assert!(out.advantages.iter().all(|a| a.is_finite()));
}

#[test]
fn overlong_punishment_follows_dapo() {
    // L_max = 20, L_cache = 4: no penalty up to 16, linear to −1 at 20, −1 beyond.
    let o = OverlongConfig {
        max_len: Some(20),
        cache_len: Some(4),
        penalty_factor: 1.0,
    };
    let p: Vec<f64> = [10, 16, 17, 18, 20, 21, 100]
        .iter()
        .map(|&l| o.penalty(l).unwrap())
        .collect();
    assert_eq!(p, vec![0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]);
    // The default buffer is a fifth of L_max; the factor scales.
    let o = OverlongConfig {
        max_len: Some(20),
        cache_len: None,
        penalty_factor: 0.5,
    };
    assert_eq!(o.penalty(18).unwrap(), -0.25);
    // Unresolved L_max is an error naming it.
    let e = OverlongConfig::default().penalty(3).unwrap_err();
    assert!(e.to_string().contains("overlong.max_len"), "{e}");
}

#[test]
fn shaping_errors_name_the_field() {
    for (sh, needle) in [
        (
            ShapingConfig {
                reward_clip: Some(0.0),
                ..Default::default()
            },
            "shaping.reward_clip",
        ),
        (
            ShapingConfig {
                advantage_clip: Some(f64::NAN),
                ..Default::default()
            },
            "shaping.advantage_clip",
        ),
        (
            ShapingConfig {
                norm_eps: -1.0,
                ..Default::default()
            },
            "shaping.norm_eps",
        ),
        (
            ShapingConfig {
                overlong: Some(OverlongConfig {
                    max_len: Some(4),
                    cache_len: Some(5),
                    penalty_factor: 1.0,
                }),
                ..Default::default()
            },
            "shaping.overlong.cache_len",
        ),
    ] {
        let e = sh.validate().unwrap_err();
        assert!(
            matches!(&e, TrainError::Config { field, .. } if field == needle),
            "{e}"
        );
    }
    // Unknown fields are refused.
    let e = serde_json::from_str::<ShapingConfig>(r#"{"whiten_advantage": true}"#).unwrap_err();
    assert!(e.to_string().contains("whiten_advantage"), "{e}");
}
