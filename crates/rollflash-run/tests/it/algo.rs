//! The algorithm knobs in a real run: presets expand under explicit settings, `--dry-run`'s
//! output parses back, bad values name their field, and a short multi-turn run with a preset,
//! per-turn correction filters, rejection sampling and overlong shaping trains with finite
//! metrics and balanced accounting (about 10 s on 2 cores).

use rollflash_run::config::TrainConfig;
use rollflash_run::pipeline;
use rollflash_run::preset::Preset;
use rollflash_train::shaping::NormScope;
use rollflash_train::{AdvantageEstimator, LossAgg, PgVariant};

fn load(sets: &[&str]) -> Result<TrainConfig, String> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    TrainConfig::load(None, &sets).map_err(|e| rollflash_core::error_chain(&e))
}

#[test]
fn presets_expand_to_their_documented_settings() {
    let c = load(&["train.preset=dapo"]).unwrap();
    assert_eq!(c.train.loss.loss_agg, LossAgg::TokenMean);
    assert_eq!((c.train.loss.clip_low, c.train.loss.clip_high), (0.2, 0.28));
    assert_eq!(c.train.loss.pg_variant, PgVariant::DecoupledPpo);
    assert_eq!(
        c.buffer.filter,
        rollflash_core::buffer::GroupFilter::ZeroVariance
    );
    let s = c.shaping_resolved();
    assert_eq!(s.overlong.unwrap().max_len, Some(c.rollout.max_new_tokens));

    let c = load(&["train.preset=dr_grpo", "rollout.max_new_tokens=40"]).unwrap();
    assert_eq!(
        c.train.advantage,
        AdvantageEstimator::Grpo {
            norm_by_std: false,
            eps: 1e-6
        }
    );
    assert_eq!(c.train.loss.loss_agg, LossAgg::SeqMeanTokenSumNorm);
    assert_eq!(c.train.loss.agg_norm_len, Some(40));

    let c = load(&["train.preset=reinforce_pp"]).unwrap();
    assert!(matches!(
        c.train.advantage,
        AdvantageEstimator::ReinforcePlusPlus { whiten: false, .. }
    ));
    assert_eq!(
        (
            c.train.shaping.norm_mean_type,
            c.train.shaping.norm_std_type
        ),
        (NormScope::Batch, NormScope::Batch)
    );
    assert_eq!(
        (c.train.shaping.reward_clip, c.train.shaping.advantage_clip),
        (Some(10.0), Some(2.0))
    );
    assert_eq!(c.train.loss.dual_clip, Some(1.4));

    let c = load(&["train.preset=lite_ppo"]).unwrap();
    assert_eq!(
        (
            c.train.shaping.norm_mean_type,
            c.train.shaping.norm_std_type
        ),
        (NormScope::Group, NormScope::Batch)
    );
    assert_eq!(c.train.loss.loss_agg, LossAgg::TokenMean);

    let c = load(&["train.preset=gspo"]).unwrap();
    assert_eq!(c.train.loss.pg_variant, PgVariant::Gspo);

    let c = load(&["train.preset=grpo"]).unwrap();
    assert!(c.train.shaping.whiten_advantages);
    assert_eq!(c.train.loss.kl_coef, 0.001);
}

#[test]
fn explicit_settings_win_over_a_preset_and_dry_run_parses_back() {
    let c = load(&[
        "train.preset=dapo",
        "train.loss.clip_high=0.3",
        "buffer.filter=\"none\"",
        "train.shaping.overlong.max_len=50",
    ])
    .unwrap();
    assert_eq!(c.train.loss.clip_high, 0.3);
    assert_eq!(c.train.loss.loss_agg, LossAgg::TokenMean);
    assert_eq!(c.buffer.filter, rollflash_core::buffer::GroupFilter::None);
    assert_eq!(c.shaping_resolved().overlong.unwrap().max_len, Some(50));
    for p in Preset::ALL {
        let name = serde_json::to_value(p).unwrap();
        let set = format!("train.preset={name}");
        let c = load(&[set.as_str()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, c.to_toml().unwrap()).unwrap();
        let back = TrainConfig::load(Some(&path), &[]).unwrap();
        assert_eq!(back, c, "{p:?}");
        // The resolved algorithm is one of the plan's lines.
        let plan = rollflash_run::plan::RunPlan::new(c).unwrap();
        assert!(plan.describe().iter().any(|l| l.starts_with("algorithm:")));
    }
}

#[test]
fn algorithm_errors_name_the_field() {
    for (sets, needle) in [
        (vec!["train.preset=ppo2"], "train.preset"),
        (vec!["train.shaping.reward_clip=0"], "shaping.reward_clip"),
        (
            vec!["train.shaping.norm_mean_type=\"median\""],
            "norm_mean_type",
        ),
        (
            vec![
                "train.advantage.name=\"gigpo\"",
                "train.advantage.step_advantage_w=-1",
            ],
            "gigpo.step_advantage_w",
        ),
        (
            vec![
                "train.shaping.overlong.max_len=4",
                "train.shaping.overlong.cache_len=9",
            ],
            "shaping.overlong.cache_len",
        ),
        (
            vec!["train.loss.rejection_sampling.upper=-1"],
            "rejection_sampling.upper",
        ),
        (
            vec![
                "train.loss.pg_variant=ppo",
                "train.loss.rejection_sampling.upper=2",
            ],
            "rejection_sampling",
        ),
        (
            vec!["train.loss.correction.filters=[{level=\"turn\"}]"],
            "level",
        ),
    ] {
        let e = load(&sets).unwrap_err();
        assert!(e.contains(needle), "{sets:?}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_turn_run_with_the_new_knobs_trains_with_finite_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let mut sets = crate::tiny_run::tiny_lake_sets(dir.path());
    sets.extend([
        "seed=5".into(),
        "warmup.steps=0".into(),
        "train.steps=3".into(),
        "train.lr=1e-3".into(),
        "train.lr_warmup_steps=1".into(),
        "train.preset=reinforce_pp".into(),
        "train.shaping.reward_clip=0.8".into(),
        "train.shaping.overlong.max_len=12".into(),
        "train.loss.rejection_sampling.level=\"sequence\"".into(),
        "train.loss.rejection_sampling.upper=3.0".into(),
        "train.loss.correction.filters=[{level=\"segment\", ratio_range=[0.5, 2.0]}]".into(),
    ]);
    let cfg = TrainConfig::load(None, &sets).unwrap();
    let out = pipeline::run(cfg).await.unwrap();
    assert_eq!(out.report.steps.len(), 3);
    let a = out.report.accounting;
    assert!(a.balanced(), "{a:?}");
    let rows = rollflash_run::metrics::read(&dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(rows.len(), 3);
    for r in &rows {
        for key in [
            "reward",
            "ratio_mean_token",
            "ratio_mean_seq",
            "reward_clip_frac",
            "advantage_clip_frac",
            "overlong_frac",
            "overlong_penalty",
            "kl_ref",
            "grad_norm",
        ] {
            let v = r[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key} missing from {r}"));
            assert!(v.is_finite(), "{key} = {v}");
        }
        assert!(r.get("ratio_mean").is_none(), "the ambiguous name is gone");
    }
}
