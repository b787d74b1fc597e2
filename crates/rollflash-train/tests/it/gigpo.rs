//! GiGPO against the float64 NumPy reference, and its layout and edge cases.
//!
//! `scripts/reference_losses.py generate` (`gigpo_cases()`, under `gigpo` in
//! `scripts/reference_losses.json`) computes verl-agent's `compute_gigpo_outcome_advantage`
//! in verl-agent's own layout — one row per environment step, anchor observations as labels —
//! and then lays the same trajectories out as packed token sequences (prompt, turns,
//! observation tokens). Here the anchors must be recovered from the tokens alone
//! ([`split_turns`]) and the per-token advantages must match: four prompt groups with shared
//! and revisited states, the same state in two groups (never merged), a trajectory without
//! turns, a one-turn group (episode mean 0, std 1) and a zero-variance group; both modes,
//! three discounts, a step weight, and the whole shaping pipeline (whitening, clipping).
//!
//! Tolerance: 1e-12 absolute.

use rollflash_train::advantage::{
    compute_advantages, compute_advantages_with_turns, AdvantageBatch, AdvantageEstimator,
};
use rollflash_train::gigpo::{gigpo_advantages, split_turns, GigpoMode, GigpoParams, Turn};
use rollflash_train::shaping::{compute_shaped_advantages_with, RunningMoments, ShapingConfig};
use rollflash_train::TrainError;
use serde::Deserialize;

use crate::common::assert_all_close;

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/reference_losses.json"
));

#[derive(Debug, Deserialize)]
struct Fixture {
    gigpo: GigpoFixture,
}

#[derive(Debug, Deserialize)]
struct GigpoFixture {
    sequences: Vec<Seq>,
    group_sizes: Vec<usize>,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Seq {
    tokens: Vec<u32>,
    mask: Vec<u8>,
    prompt_len: usize,
    turn_lengths: Vec<usize>,
    step_rewards: Vec<f64>,
    reward: f64,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    estimator: serde_json::Value,
    shaping: serde_json::Value,
    advantages: Vec<f64>,
}

/// The packed batch of the fixture: rewards, offsets, mask.
struct Packed {
    rewards: Vec<f64>,
    offsets: Vec<usize>,
    mask: Vec<bool>,
}

fn pack(seqs: &[Seq]) -> Packed {
    let mut p = Packed {
        rewards: Vec::new(),
        offsets: Vec::new(),
        mask: Vec::new(),
    };
    for s in seqs {
        p.rewards.push(s.reward);
        p.offsets.push(p.mask.len());
        p.mask.extend(s.mask.iter().map(|&m| m == 1));
    }
    p
}

fn turns_of<'a>(seqs: &'a [Seq], p: &Packed) -> Vec<Vec<Turn<'a>>> {
    seqs.iter()
        .zip(&p.offsets)
        .map(|(s, &off)| {
            let mask: Vec<bool> = s.mask.iter().map(|&m| m == 1).collect();
            split_turns(
                &s.tokens,
                &mask,
                off,
                s.prompt_len,
                &s.turn_lengths,
                &s.step_rewards,
            )
            .unwrap()
        })
        .collect()
}

#[test]
fn gigpo_matches_reference() {
    let fx: Fixture = serde_json::from_str(FIXTURE).unwrap();
    let f = &fx.gigpo;
    let p = pack(&f.sequences);
    let turns = turns_of(&f.sequences, &p);
    let batch = AdvantageBatch {
        rewards: &p.rewards,
        group_sizes: &f.group_sizes,
        seq_offsets: &p.offsets,
        mask: &p.mask,
        kl: None,
    };
    assert!(f.cases.len() >= 5);
    for case in &f.cases {
        let est: AdvantageEstimator = serde_json::from_value(case.estimator.clone())
            .unwrap_or_else(|e| panic!("{}: estimator: {e}", case.name));
        let sh: ShapingConfig = serde_json::from_value(case.shaping.clone())
            .unwrap_or_else(|e| panic!("{}: shaping: {e}", case.name));
        let out = compute_shaped_advantages_with(
            &est,
            &sh,
            &batch,
            Some(&turns),
            &mut RunningMoments::default(),
        )
        .unwrap();
        assert_all_close(&out.advantages, &case.advantages, 1e-12, 0.0, &case.name);
        let stats = out.gigpo.unwrap();
        // 17 turns; group 0 forms {p0 ×3, s1 ×3, s2, s3}, group 1 {p1 ×2, s1 ×2, s4, s0},
        // groups 2 and 3 one each ({p2}, {p3 ×2}).
        assert_eq!(stats.steps, 17, "{}", case.name);
        assert_eq!(stats.step_groups, 10, "{}", case.name);
        assert_eq!(stats.singleton_steps, 5, "{}", case.name);
    }
}

#[test]
fn gigpo_defaults_are_verl_agents() {
    let est: AdvantageEstimator = serde_json::from_str(r#"{"name": "gigpo"}"#).unwrap();
    assert_eq!(est, AdvantageEstimator::gigpo());
    assert_eq!(
        est,
        AdvantageEstimator::Gigpo {
            gamma: 0.95,
            step_advantage_w: 1.0,
            mode: GigpoMode::MeanNorm,
            eps: 1e-6,
        }
    );
    assert!(est.needs_turns() && !AdvantageEstimator::default().needs_turns());
    let est: AdvantageEstimator =
        serde_json::from_str(r#"{"name": "gigpo", "mode": "mean_std_norm"}"#).unwrap();
    assert!(matches!(
        est,
        AdvantageEstimator::Gigpo {
            mode: GigpoMode::MeanStdNorm,
            ..
        }
    ));
}

#[test]
fn gigpo_errors_name_the_field_or_input() {
    for (est, needle) in [
        (r#"{"name": "gigpo", "gamma": 1.5}"#, "gigpo.gamma"),
        (
            r#"{"name": "gigpo", "step_advantage_w": -1.0}"#,
            "gigpo.step_advantage_w",
        ),
        (r#"{"name": "gigpo", "eps": -1.0}"#, "gigpo.eps"),
    ] {
        let est: AdvantageEstimator = serde_json::from_str(est).unwrap();
        let e = est.validate().unwrap_err();
        assert!(
            matches!(&e, TrainError::Config { field, .. } if field == needle),
            "{e}"
        );
    }
    let e = serde_json::from_str::<AdvantageEstimator>(r#"{"name": "gigpo", "mode": "std"}"#)
        .unwrap_err();
    assert!(e.to_string().contains("mean_norm"), "{e}");
    // Without turns, GiGPO says what it needs.
    let batch = AdvantageBatch {
        rewards: &[1.0, 0.0],
        group_sizes: &[2],
        seq_offsets: &[0, 1],
        mask: &[true, true],
        kl: None,
    };
    let e = compute_advantages(&AdvantageEstimator::gigpo(), &batch).unwrap_err();
    assert!(
        matches!(e, TrainError::MissingInput { name: "turns", .. }),
        "{e}"
    );
    // The other estimators ignore turns.
    let (adv, stats) =
        compute_advantages_with_turns(&AdvantageEstimator::Rloo, &batch, Some(&[]), None).unwrap();
    assert_eq!(adv, vec![1.0, -1.0]);
    assert!(stats.is_none());
}

#[test]
fn split_turns_finds_anchors_and_refuses_bad_layouts() {
    // prompt [1 2], turn 0 (2 tokens), observation [7 8], turn 1 (1 token), observation [9].
    let tokens = [1, 2, 50, 51, 7, 8, 52, 9];
    let mask = [false, false, true, true, false, false, true, false];
    let turns = split_turns(&tokens, &mask, 10, 2, &[2, 1], &[0.5, 1.0]).unwrap();
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[0].tokens, 12..14);
    assert_eq!(turns[0].anchor, &[1, 2]);
    assert_eq!(turns[1].tokens, 16..17);
    assert_eq!(turns[1].anchor, &[7, 8]);
    assert_eq!(turns[1].reward, 1.0);
    // No turns: nothing, as long as no token is generated.
    assert!(split_turns(&tokens[..2], &mask[..2], 0, 2, &[], &[])
        .unwrap()
        .is_empty());
    // Step rewards and turns must pair up.
    let e = split_turns(&tokens, &mask, 0, 2, &[2, 1], &[0.5]).unwrap_err();
    assert!(
        matches!(
            e,
            TrainError::Length {
                name: "step_rewards",
                ..
            }
        ),
        "{e}"
    );
    // A turn over a masked token, a turn past the end, a generated token outside the turns.
    for (lengths, needle) in [
        (&[3usize, 1][..], "masked"),
        (&[2, 5][..], "past the sequence"),
        (&[2][..], "outside the sequence's turns"),
    ] {
        let rewards = vec![0.0; lengths.len()];
        let e = split_turns(&tokens, &mask, 0, 2, lengths, &rewards).unwrap_err();
        assert!(e.to_string().contains(needle), "{lengths:?}: {e}");
    }
}

#[test]
fn gigpo_step_groups_compare_anchors_exactly_within_a_group() {
    // Two trajectories of one group both see [7] before their second turn, a third sees
    // [7, 7]: same first token, different state.
    let seqs: [(&[u32], &[bool]); 3] = [
        (&[1, 50, 7, 51], &[false, true, false, true]),
        (&[1, 52, 7, 53], &[false, true, false, true]),
        (&[1, 54, 7, 7, 55], &[false, true, false, false, true]),
    ];
    let rewards_per_step = [[0.0, 1.0], [0.0, 0.0], [0.0, 2.0]];
    let mut offsets = Vec::new();
    let mut mask = Vec::new();
    let mut turns = Vec::new();
    for ((tokens, m), steps) in seqs.iter().zip(&rewards_per_step) {
        let off = mask.len();
        offsets.push(off);
        mask.extend_from_slice(m);
        turns.push(split_turns(tokens, m, off, 1, &[1, 1], steps).unwrap());
    }
    let rewards: Vec<f64> = rewards_per_step.iter().map(|s| s.iter().sum()).collect();
    let params = GigpoParams {
        gamma: 1.0,
        step_advantage_w: 1.0,
        mode: GigpoMode::MeanNorm,
        eps: 1e-6,
    };
    let (adv, stats) = gigpo_advantages(&rewards, &[3], &offsets, &mask, &turns, &params).unwrap();
    // Step groups: the prompt (3 turns), [7] (2 turns), [7, 7] (1 turn).
    assert_eq!(
        (stats.steps, stats.step_groups, stats.singleton_steps),
        (6, 3, 1)
    );
    // Episode mean over the six step rows: (1 + 1 + 0 + 0 + 2 + 2) / 6 = 1.
    // Returns (γ = 1): first turns 1, 0, 2 (mean 1); second turns 1, 0 (mean 0.5) and 2 alone.
    let want = [
        0.0, // prompt
        (1.0 - 1.0) + (1.0 - 1.0),
        0.0,
        (1.0 - 1.0) + (1.0 - 0.5),
        0.0,
        (0.0 - 1.0) + (0.0 - 1.0),
        0.0,
        (0.0 - 1.0) + (0.0 - 0.5),
        0.0,
        (2.0 - 1.0) + (2.0 - 1.0),
        0.0,
        0.0,
        (2.0 - 1.0) + 0.0, // a singleton step group adds nothing
    ];
    assert_all_close(&adv, &want, 1e-15, 0.0, "gigpo by hand");
    // A turn outside its sequence is a layout error.
    let mut bad = turns.clone();
    bad[0][0].tokens = 0..5;
    assert!(gigpo_advantages(&rewards, &[3], &offsets, &mask, &bad, &params).is_err());
}
