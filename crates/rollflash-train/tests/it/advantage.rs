//! Advantage estimators against the NumPy reference, plus hand-derived cases.
//!
//! The arrays below were printed by `python scripts/reference_losses.py generate` (function
//! `advantages()`; regenerate with
//! `scripts/setup_python.sh && .venv/bin/python scripts/reference_losses.py generate` and
//! paste). Batch: 9 sequences in groups of 3, 1, 3, 2 (the 1-group is a singleton, the
//! second 3-group has zero reward variance), lengths 3, 2, 4, 1, 2, 3, 2, 2, 3, with masked
//! tokens inside and at the end of sequences; KL values on masked tokens are 9.0 and must not
//! matter.
//!
//! Tolerances: GRPO / RLOO 1e-12 absolute (same arithmetic); REINFORCE++ 1e-7 absolute,
//! because ROLL's `masked_mean` (which the reference follows) divides by `count + 1e-8`.

use rollflash_train::advantage::{
    broadcast_to_tokens, grpo_advantages, masked_whiten, reinforce_pp_advantages, rloo_advantages,
    sample_std, ReinforcePpParams,
};
use rollflash_train::{compute_advantages, AdvantageBatch, AdvantageEstimator, TrainError};

use crate::common::{assert_all_close, assert_close};

const REWARDS: [f64; 9] = [1.0, 0.0, 0.5, 2.0, 0.3, 0.3, 0.3, -1.0, 4.0];
const GROUPS: [usize; 4] = [3, 1, 3, 2];
const OFFSETS: [usize; 9] = [0, 3, 5, 9, 10, 12, 15, 17, 19];
const MASK01: [u8; 22] = [
    1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0,
];
const KL: [f64; 22] = [
    0.05, -0.02, 0.1, 0.0, 0.3, 9.0, 0.2, -0.1, 0.05, 0.4, 0.01, 0.02, 9.0, 0.03, 0.1, 0.2, 0.3,
    -0.05, 0.0, 0.15, 0.05, 9.0,
];

// Pasted from `python scripts/reference_losses.py generate` (its printed output).
#[rustfmt::skip]
const GRPO: [f64; 22] = [0.999998000004, 0.999998000004, 0.999998000004, -0.999998000004, -0.999998000004, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.7071065811866041, -0.7071065811866041, 0.7071065811866041, 0.7071065811866041, 0.0];
#[rustfmt::skip]
const GRPO_NO_STD: [f64; 22] = [0.5, 0.5, 0.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -2.5, -2.5, 2.5, 2.5, 0.0];
#[rustfmt::skip]
const RLOO: [f64; 22] = [0.75, 0.75, 0.75, -0.75, -0.75, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -5.0, -5.0, 5.0, 5.0, 0.0];
#[rustfmt::skip]
const RPP: [f64; 22] = [0.1869117691535629, 0.1869117691535629, 0.1869117691535629, -0.5686889985551189, -0.5686889985551189, -0.0, -0.190888614700778, -0.190888614700778, -0.190888614700778, 0.9425125368622447, -0.34200876824251436, -0.34200876824251436, -0.0, -0.34200876824251436, -0.34200876824251436, -0.34200876824251436, -0.34200876824251436, -1.3242897662638007, -1.3242897662638007, 2.4537140722796082, 2.4537140722796082, -0.0];
#[rustfmt::skip]
const RPP_KL: [f64; 22] = [0.18826989035277233, 0.19205360931947035, 0.19054012173279114, -0.5813385474736056, -0.5813385474736056, -0.0, -0.19161549390370922, -0.1764806180369171, -0.18404805597031315, 0.9245816012722077, -0.3338833270515549, -0.33312658325821526, -0.0, -0.3414507649849509, -0.3391805336049321, -0.36945028533851626, -0.3543154094717242, -1.311596308046324, -1.315380027013022, 2.4532040638182093, 2.464555220718303, -0.0];
#[rustfmt::skip]
const RPP_BASELINE_GAMMA: [f64; 22] = [0.3373532223774441, 0.38041391821890064, 0.4214656972158268, -0.42315281959327083, -0.46944525122810243, -0.0, -0.019666238579865804, -0.0017170032950395786, -0.010888145411374145, -0.04145861913248937, -0.008966572777475474, -0.008267819092421412, -0.0, -0.01700224015559719, -0.015255355942962033, -0.04757271387671241, -0.032724198069313586, -1.9673984635627482, -2.1901262006737303, 1.941691683261571, 2.17271712038257, -0.0];
#[rustfmt::skip]
const RPP_RAW: [f64; 22] = [0.987, 0.992, 0.99, -0.03, -0.03, 0.0, 0.485, 0.505, 0.495, 1.96, 0.297, 0.298, 0.0, 0.287, 0.29, 0.25, 0.27, -0.995, -1.0, 3.98, 3.995, 0.0];

fn mask() -> Vec<bool> {
    MASK01.iter().map(|&m| m == 1).collect()
}

/// Runs `estimator` on the reference batch.
fn check(estimator: AdvantageEstimator, want: &[f64], tol: f64, what: &str) {
    let mask = mask();
    let batch = AdvantageBatch {
        rewards: &REWARDS,
        group_sizes: &GROUPS,
        seq_offsets: &OFFSETS,
        mask: &mask,
        kl: Some(&KL),
    };
    let got = compute_advantages(&estimator, &batch).unwrap();
    assert_all_close(&got, want, tol, 0.0, what);
}

#[test]
fn grpo_matches_reference() {
    check(AdvantageEstimator::default(), &GRPO, 1e-12, "grpo");
    check(
        AdvantageEstimator::Grpo {
            norm_by_std: false,
            eps: 1e-6,
        },
        &GRPO_NO_STD,
        1e-12,
        "grpo without std",
    );
}

#[test]
fn rloo_matches_reference() {
    check(AdvantageEstimator::Rloo, &RLOO, 1e-12, "rloo");
}

#[test]
fn reinforce_pp_matches_reference() {
    let rpp = |gamma, kl_coef, baseline, whiten| AdvantageEstimator::ReinforcePlusPlus {
        gamma,
        kl_coef,
        baseline,
        whiten,
        eps: 1e-8,
    };
    check(rpp(1.0, 0.0, false, true), &RPP, 1e-7, "rpp");
    check(rpp(1.0, 0.1, false, true), &RPP_KL, 1e-7, "rpp kl");
    check(
        rpp(0.9, 0.1, true, true),
        &RPP_BASELINE_GAMMA,
        1e-7,
        "rpp baseline γ",
    );
    check(rpp(1.0, 0.1, false, false), &RPP_RAW, 1e-12, "rpp raw");
}

#[test]
fn grpo_uses_the_unbiased_std() {
    // Rewards 0, 1: mean 0.5, unbiased std sqrt(0.5) (population std would be 0.5).
    let a = grpo_advantages(&[0.0, 1.0], &[2], true, 0.0).unwrap();
    assert_all_close(
        &a,
        &[-0.5 / 0.5f64.sqrt(), 0.5 / 0.5f64.sqrt()],
        1e-12,
        0.0,
        "grpo",
    );
    assert_eq!(sample_std(&[3.0]), None);
    // Zero variance: 0 / eps = 0; singleton: 0.
    let a = grpo_advantages(&[2.0, 2.0, 7.0], &[2, 1], true, 1e-6).unwrap();
    assert_eq!(a, vec![0.0, 0.0, 0.0]);
}

#[test]
fn rloo_is_leave_one_out() {
    let r = [1.0, 2.0, 6.0];
    let a = rloo_advantages(&r, &[3]).unwrap();
    assert_all_close(&a, &[1.0 - 4.0, 2.0 - 3.5, 6.0 - 1.5], 1e-12, 0.0, "rloo");
    // = n/(n−1)·(r − mean)
    let mean = 3.0;
    for (ai, ri) in a.iter().zip(r) {
        assert_close(*ai, 1.5 * (ri - mean), 1e-12, 0.0, "n/(n−1) form");
    }
    assert_eq!(rloo_advantages(&[5.0], &[1]).unwrap(), vec![0.0]);
}

#[test]
fn reinforce_pp_without_kl_or_whitening_broadcasts_the_reward() {
    let mask = vec![true, true, false, true];
    let batch = AdvantageBatch {
        rewards: &[2.0, -1.0],
        group_sizes: &[2],
        seq_offsets: &[0, 3],
        mask: &mask,
        kl: None,
    };
    let params = ReinforcePpParams {
        gamma: 1.0,
        kl_coef: 0.0,
        baseline: false,
        whiten: false,
        eps: 1e-8,
        reward_clip: None,
    };
    let a = reinforce_pp_advantages(&batch, &params).unwrap();
    assert_eq!(a, vec![2.0, 2.0, 0.0, -1.0]);
    // Baseline: group mean 0.5 subtracted.
    let a = reinforce_pp_advantages(
        &batch,
        &ReinforcePpParams {
            baseline: true,
            ..params
        },
    )
    .unwrap();
    assert_eq!(a, vec![1.5, 1.5, 0.0, -1.5]);
    // KL penalty without KL values is an error naming the input.
    let err = reinforce_pp_advantages(
        &batch,
        &ReinforcePpParams {
            kl_coef: 0.1,
            ..params
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, TrainError::MissingInput { name: "kl", .. }),
        "{err}"
    );
}

#[test]
fn whitening_is_over_valid_tokens_with_unbiased_variance() {
    let mut v = vec![1.0, 3.0, 100.0];
    masked_whiten(&mut v, &[true, true, false], 0.0);
    // mean 2, unbiased var 2.
    let s = 2f64.sqrt();
    assert_all_close(&v, &[-1.0 / s, 1.0 / s, 0.0], 1e-12, 0.0, "whiten");
    // One valid token: whitening is skipped (ROLL), masked entries still zeroed.
    let mut v = vec![5.0, 7.0];
    masked_whiten(&mut v, &[true, false], 1e-8);
    assert_eq!(v, vec![5.0, 0.0]);
}

#[test]
fn broadcast_respects_mask_and_layout() {
    let a = broadcast_to_tokens(&[1.0, -2.0], &[0, 2], &[true, false, true, true]).unwrap();
    assert_eq!(a, vec![1.0, 0.0, -2.0, -2.0]);
    let err = broadcast_to_tokens(&[1.0], &[0, 2], &[true; 4]).unwrap_err();
    assert!(
        matches!(
            err,
            TrainError::Length {
                name: "seq_values",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_groups_are_reported() {
    let err = grpo_advantages(&[1.0, 2.0, 3.0], &[2], true, 1e-6).unwrap_err();
    assert!(err.to_string().contains("add up to 2"), "{err}");
    let err = rloo_advantages(&[1.0], &[0, 1]).unwrap_err();
    assert!(err.to_string().contains("group 0 is empty"), "{err}");
    let mask = [true, true];
    let batch = AdvantageBatch {
        rewards: &[1.0],
        group_sizes: &[1],
        seq_offsets: &[0, 1],
        mask: &mask,
        kl: None,
    };
    let err = compute_advantages(&AdvantageEstimator::Rloo, &batch).unwrap_err();
    assert!(
        matches!(
            err,
            TrainError::Length {
                name: "rewards",
                ..
            }
        ),
        "{err}"
    );
}
