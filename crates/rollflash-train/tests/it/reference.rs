//! Every loss variant × every aggregation, plus correction / KL / entropy combinations, against
//! the independent float64 NumPy reference.
//!
//! The numbers (inputs, each case's config in our serde form, loss and d loss / d logp) come
//! from `python scripts/reference_losses.py generate`, which writes
//! `scripts/reference_losses.json`; regenerate with
//! `scripts/setup_python.sh && .venv/bin/python scripts/reference_losses.py generate`
//! (and `... check` verifies the committed file). That script implements ROLL's / AReaL's /
//! verl's definitions in a padded `[batch, length]` layout and differentiates by central
//! finite differences in float64 (h = 1e-6, with a guard that no token sits on a kink), with
//! stop-gradients evaluated at the base point.
//!
//! The batch: 5 sequences (lengths 5, 1, 4, 3, 2; 15 tokens) with masked tokens holding
//! garbage, one sequence fully masked, and one negative-advantage token at ratio ≈ 3.7 for
//! the dual clip.
//!
//! Tolerances: in `DType::F64`, loss 1e-6 relative (the reference keeps ROLL's `+1e-8` in
//! denominators, ~1e-9 relative) and gradient 1e-8 absolute + 1e-6 relative (finite
//! differences are good to ~1e-10 here). In `DType::F32`, 1e-4 relative + 1e-5 absolute.

use candle_core::DType;
use rollflash_train::LossConfig;
use serde::Deserialize;

use crate::common::{assert_all_close, assert_close, run, Data};

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/reference_losses.json"
));

#[derive(Debug, Deserialize)]
struct Fixture {
    inputs: Inputs,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Inputs {
    logp: Vec<f64>,
    old_logp: Vec<f64>,
    behav_logp: Vec<f64>,
    ref_logp: Vec<f64>,
    entropy: Vec<f64>,
    adv: Vec<f64>,
    mask: Vec<f64>,
    seq_offsets: Vec<usize>,
    seq_scores: Vec<f64>,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    /// The config exactly as a user would write it (our serde names).
    config: serde_json::Value,
    use_scores: bool,
    loss: f64,
    pg_loss: f64,
    grad: Vec<f64>,
}

fn fixture() -> Fixture {
    serde_json::from_str(FIXTURE).unwrap()
}

fn data(inputs: &Inputs, use_scores: bool) -> Data {
    Data {
        logp: inputs.logp.clone(),
        old_logp: inputs.old_logp.clone(),
        behav_logp: inputs.behav_logp.clone(),
        adv: inputs.adv.clone(),
        mask: inputs.mask.clone(),
        seq_offsets: inputs.seq_offsets.clone(),
        ref_logp: Some(inputs.ref_logp.clone()),
        entropy: Some(inputs.entropy.clone()),
        seq_scores: use_scores.then(|| inputs.seq_scores.clone()),
    }
}

fn config(case: &Case) -> LossConfig {
    let cfg: LossConfig = serde_json::from_value(case.config.clone())
        .unwrap_or_else(|e| panic!("{}: config does not parse: {e}", case.name));
    cfg.validate().unwrap();
    cfg
}

#[test]
fn fixture_covers_every_variant_and_aggregation() {
    let fx = fixture();
    for variant in [
        "vanilla",
        "ppo",
        "ppo_dual",
        "tis",
        "topr",
        "topr_scores",
        "cispo",
        "cispo_unified",
        "kimi15",
        "gspo",
        "gspo_token",
        "decoupled_ppo",
    ] {
        for agg in [
            "token_mean",
            "seq_mean_token_sum",
            "seq_mean_token_mean",
            "seq_mean_token_sum_norm",
        ] {
            let name = format!("{variant}/{agg}");
            assert!(
                fx.cases.iter().any(|c| c.name == name),
                "missing case {name}"
            );
        }
    }
}

#[test]
fn losses_and_gradients_match_reference_f64() {
    let fx = fixture();
    for case in &fx.cases {
        let cfg = config(case);
        let out = run(&data(&fx.inputs, case.use_scores), &cfg, DType::F64).unwrap();
        let what = &case.name;
        assert_close(out.loss, case.loss, 1e-12, 1e-6, &format!("{what}: loss"));
        assert_close(
            out.metrics.pg_loss,
            case.pg_loss,
            1e-12,
            1e-6,
            &format!("{what}: pg_loss metric"),
        );
        assert_close(
            out.metrics.total_loss,
            out.loss,
            0.0,
            1e-12,
            &format!("{what}: total"),
        );
        assert_all_close(&out.grad, &case.grad, 1e-8, 1e-6, &format!("{what}: grad"));
    }
}

#[test]
fn losses_and_gradients_match_reference_f32() {
    let fx = fixture();
    for case in &fx.cases {
        let cfg = config(case);
        let out = run(&data(&fx.inputs, case.use_scores), &cfg, DType::F32).unwrap();
        let what = &case.name;
        assert_close(
            out.loss,
            case.loss,
            1e-5,
            1e-4,
            &format!("{what}: f32 loss"),
        );
        assert_all_close(
            &out.grad,
            &case.grad,
            1e-5,
            1e-4,
            &format!("{what}: f32 grad"),
        );
    }
}

#[test]
fn reference_variants_are_not_trivially_equal() {
    // Guards the fixture itself: if two variants produced the same numbers the comparison
    // above could not tell them apart.
    let fx = fixture();
    let get = |name: &str| fx.cases.iter().find(|c| c.name == name).unwrap();
    let pairs = [
        ("ppo/token_mean", "ppo_dual/token_mean"),
        ("ppo/token_mean", "decoupled_ppo/token_mean"),
        ("gspo/token_mean", "gspo_token/token_mean"),
        ("cispo/token_mean", "cispo_unified/token_mean"),
        ("topr/token_mean", "topr_scores/token_mean"),
        ("ppo/token_mean", "ppo/seq_mean_token_mean"),
        ("ppo/seq_mean_token_sum", "ppo/seq_mean_token_sum_norm"),
        ("ppo_corr_segment", "ppo_corr_token"),
        ("decoupled_rs_token_mask", "decoupled_rs_token_clamp"),
        ("decoupled_rs_seq_mask", "decoupled_rs_token_mask"),
    ];
    for (a, b) in pairs {
        let (a, b) = (get(a), get(b));
        let grad_diff: f64 = a.grad.iter().zip(&b.grad).map(|(x, y)| (x - y).abs()).sum();
        assert!(
            (a.loss - b.loss).abs() > 1e-6 || grad_diff > 1e-6,
            "{} and {} coincide",
            a.name,
            b.name
        );
    }
}

#[test]
fn reference_cases_exercise_what_they_test() {
    // Each feature is only checked if the fixture makes it fire: clipping, the dual clip, the
    // decoupled cap, the correction weight and the filters.
    let fx = fixture();
    let metrics = |name: &str| {
        let case = fx.cases.iter().find(|c| c.name == name).unwrap();
        run(
            &data(&fx.inputs, case.use_scores),
            &config(case),
            DType::F64,
        )
        .unwrap()
        .metrics
    };
    assert!(metrics("ppo/token_mean").clip_frac > 0.0);
    assert!(metrics("gspo/token_mean").clip_frac > 0.0);
    assert!(metrics("tis/token_mean").clip_frac > 0.0);
    assert!(metrics("cispo/token_mean").clip_frac > 0.0);
    assert!(metrics("ppo_dual/token_mean").dual_clip_frac > 0.0);
    let d = metrics("decoupled_ppo/token_mean");
    assert!(d.decoupled_cap_frac > 0.0 && d.dual_clip_frac > 0.0);
    assert!(metrics("ppo_corr_token").correction_weight_mean < 1.0);
    for name in [
        "ppo_corr_geometric_filter",
        "cispo_corr_sequence_diff",
        "kimi15_corr_seqsum_filter",
    ] {
        assert!(
            metrics(name).correction_filtered_frac > 0.0,
            "{name} filters nothing"
        );
    }
    assert!((metrics("ppo_corr_segment").correction_weight_mean - 1.0).abs() > 1e-3);
    assert!(metrics("ppo_corr_segment_filter").correction_filtered_frac > 0.0);
    for name in [
        "decoupled_rs_token_mask",
        "decoupled_rs_token_clamp",
        "decoupled_rs_seq_mask",
        "decoupled_rs_seq_clamp_sum",
        "decoupled_rs_seq_k3_max",
        "decoupled_rs_token_k1",
    ] {
        let m = metrics(name);
        assert!(
            m.decoupled_cap_frac > 0.0 && m.decoupled_cap_frac < 1.0,
            "{name} rejects or clamps {} of the tokens",
            m.decoupled_cap_frac
        );
    }
    let all = metrics("vanilla/token_mean");
    assert_eq!((all.n_valid_tokens, all.n_valid_seqs), (11, 4));
}
