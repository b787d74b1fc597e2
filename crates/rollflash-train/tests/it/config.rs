//! Configuration: serde names, defaults, and validation errors that name the field.

use rollflash_train::{
    AdvantageEstimator, CorrectionConfig, CorrectionFilter, IsWeightConfig, KlEstimator, LossAgg,
    LossConfig, PgVariant, TrainError,
};

use crate::common::cfg_with;

/// Asserts that `cfg` fails validation naming exactly `field`.
#[track_caller]
fn rejects(cfg: &LossConfig, field: &str) {
    match cfg.validate() {
        Err(TrainError::Config { field: f, reason }) => {
            assert_eq!(f, field, "wrong field (reason: {reason})")
        }
        other => panic!("expected an error on `{field}`, got {other:?}"),
    }
}

#[test]
fn defaults_are_valid_and_follow_roll() {
    let c = LossConfig::default();
    c.validate().unwrap();
    assert_eq!(c.pg_variant, PgVariant::Ppo);
    assert_eq!(c.loss_agg, LossAgg::SeqMeanTokenMean);
    assert_eq!((c.clip_low, c.clip_high, c.dual_clip), (0.2, 0.2, None));
    assert_eq!(c.kl_estimator, KlEstimator::K3);
    assert_eq!(c.behav_imp_weight_cap, Some(5.0));
    assert!(!c.correction.is_active());
    // An empty JSON object is the default config.
    assert_eq!(LossConfig::from_json("{}").unwrap(), c);
}

#[test]
fn every_bad_field_is_named() {
    rejects(&cfg_with(|c| c.clip_low = 1.0), "clip_low");
    rejects(&cfg_with(|c| c.clip_low = -0.1), "clip_low");
    rejects(&cfg_with(|c| c.clip_high = f64::NAN), "clip_high");
    rejects(&cfg_with(|c| c.dual_clip = Some(1.0)), "dual_clip");
    rejects(&cfg_with(|c| c.gspo_clip_low = 1.5), "gspo_clip_low");
    rejects(&cfg_with(|c| c.gspo_clip_high = -1.0), "gspo_clip_high");
    rejects(&cfg_with(|c| c.tis_low = -0.5), "tis_low");
    rejects(
        &cfg_with(|c| c.tis_high = 0.5 * c.tis_low - 1.0),
        "tis_high",
    );
    rejects(
        &cfg_with(|c| c.topr_positive_weight = -1.0),
        "topr_positive_weight",
    );
    rejects(
        &cfg_with(|c| c.topr_negative_weight = f64::INFINITY),
        "topr_negative_weight",
    );
    rejects(&cfg_with(|c| c.cispo_clip_low = -0.1), "cispo_clip_low");
    rejects(&cfg_with(|c| c.cispo_clip_high = -0.1), "cispo_clip_high");
    rejects(&cfg_with(|c| c.kimi15_tau = -0.1), "kimi15_tau");
    rejects(
        &cfg_with(|c| c.behav_imp_weight_cap = Some(0.0)),
        "behav_imp_weight_cap",
    );
    rejects(&cfg_with(|c| c.agg_norm_len = Some(0)), "agg_norm_len");
    rejects(&cfg_with(|c| c.kl_coef = -1.0), "kl_coef");
    rejects(&cfg_with(|c| c.entropy_coef = f64::NAN), "entropy_coef");
    rejects(
        &cfg_with(|c| {
            c.correction.is_weight = Some(IsWeightConfig {
                upper_bound: Some(0.0),
                ..IsWeightConfig::default()
            })
        }),
        "correction.is_weight.upper_bound",
    );
    rejects(
        &cfg_with(|c| {
            c.correction.filters = vec![
                CorrectionFilter::default(),
                CorrectionFilter {
                    diff_range: Some([0.2, -0.2]),
                    ..CorrectionFilter::default()
                },
            ]
        }),
        "correction.filters[1].diff_range",
    );
    rejects(
        &cfg_with(|c| {
            c.pg_variant = PgVariant::DecoupledPpo;
            c.correction = CorrectionConfig {
                is_weight: Some(IsWeightConfig::default()),
                filters: vec![],
            };
        }),
        "correction.is_weight",
    );
}

#[test]
fn json_names_are_snake_case_with_roll_aliases() {
    for (name, v) in [
        ("vanilla", PgVariant::Vanilla),
        ("ppo", PgVariant::Ppo),
        ("tis", PgVariant::Tis),
        ("topr", PgVariant::Topr),
        ("cispo", PgVariant::Cispo),
        ("kimi15", PgVariant::Kimi15),
        ("gspo", PgVariant::Gspo),
        ("decoupled_ppo", PgVariant::DecoupledPpo),
    ] {
        assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{name}\""));
        let cfg = LossConfig::from_json(&format!(r#"{{"pg_variant": "{name}"}}"#)).unwrap();
        assert_eq!(cfg.pg_variant, v);
    }
    for (name, alias, agg) in [
        ("token_mean", "token-mean", LossAgg::TokenMean),
        (
            "seq_mean_token_sum",
            "seq-mean-token-sum",
            LossAgg::SeqMeanTokenSum,
        ),
        (
            "seq_mean_token_mean",
            "seq-mean-token-mean",
            LossAgg::SeqMeanTokenMean,
        ),
        (
            "seq_mean_token_sum_norm",
            "seq-mean-token-sum-norm",
            LossAgg::SeqMeanTokenSumNorm,
        ),
    ] {
        assert_eq!(serde_json::to_string(&agg).unwrap(), format!("\"{name}\""));
        let parsed: LossAgg = serde_json::from_str(&format!("\"{alias}\"")).unwrap();
        assert_eq!(parsed, agg);
    }
    let k: KlEstimator = serde_json::from_str("\"mse\"").unwrap();
    assert_eq!(k, KlEstimator::K2);
    let k: KlEstimator = serde_json::from_str("\"kl\"").unwrap();
    assert_eq!(k, KlEstimator::K1);
}

#[test]
fn json_errors_are_reported() {
    // Unknown field (a typo) is rejected rather than ignored.
    let err = LossConfig::from_json(r#"{"clip_hihg": 0.3}"#).unwrap_err();
    assert!(matches!(err, TrainError::Json(_)));
    let err = LossConfig::from_json(r#"{"pg_variant": "reinforce"}"#).unwrap_err();
    assert!(matches!(err, TrainError::Json(_)));
    // Parses but is invalid: the validation error names the field.
    let err = LossConfig::from_json(r#"{"dual_clip": 0.5}"#).unwrap_err();
    assert!(err.to_string().contains("`dual_clip`"), "{err}");
}

#[test]
fn full_config_round_trips() {
    let cfg = cfg_with(|c| {
        c.pg_variant = PgVariant::Gspo;
        c.dual_clip = Some(3.0);
        c.agg_norm_len = Some(4096);
        c.correction.is_weight = Some(IsWeightConfig::default());
        c.correction.filters = vec![CorrectionFilter::default()];
    });
    let text = serde_json::to_string(&cfg).unwrap();
    assert_eq!(LossConfig::from_json(&text).unwrap(), cfg);
}

#[test]
fn advantage_estimator_serde_and_validation() {
    let e: AdvantageEstimator = serde_json::from_str(r#"{"name": "grpo"}"#).unwrap();
    assert_eq!(e, AdvantageEstimator::default());
    assert_eq!(
        e,
        AdvantageEstimator::Grpo {
            norm_by_std: true,
            eps: 1e-6
        }
    );
    let e: AdvantageEstimator = serde_json::from_str(r#"{"name": "rloo"}"#).unwrap();
    assert_eq!(e, AdvantageEstimator::Rloo);
    let e: AdvantageEstimator =
        serde_json::from_str(r#"{"name": "reinforce_plus_plus", "kl_coef": 0.01}"#).unwrap();
    assert_eq!(
        e,
        AdvantageEstimator::ReinforcePlusPlus {
            gamma: 1.0,
            kl_coef: 0.01,
            baseline: false,
            whiten: true,
            eps: 1e-8
        }
    );
    assert_eq!(
        serde_json::to_value(AdvantageEstimator::reinforce_plus_plus()).unwrap()["name"],
        "reinforce_plus_plus"
    );
    let field = |e: AdvantageEstimator| match e.validate() {
        Err(TrainError::Config { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field(AdvantageEstimator::Grpo {
            norm_by_std: true,
            eps: -1.0
        }),
        "grpo.eps"
    );
    let AdvantageEstimator::ReinforcePlusPlus {
        kl_coef,
        baseline,
        whiten,
        eps,
        ..
    } = AdvantageEstimator::reinforce_plus_plus()
    else {
        unreachable!()
    };
    assert_eq!(
        field(AdvantageEstimator::ReinforcePlusPlus {
            gamma: 1.5,
            kl_coef,
            baseline,
            whiten,
            eps
        }),
        "reinforce_plus_plus.gamma"
    );
    assert_eq!(
        field(AdvantageEstimator::ReinforcePlusPlus {
            gamma: 1.0,
            kl_coef: -0.1,
            baseline,
            whiten,
            eps
        }),
        "reinforce_plus_plus.kl_coef"
    );
}
