//! Hand-derived cases: values and gradients worked out on paper, and identities between
//! variants. All in `DType::F64` with tolerance 1e-12 unless a case says otherwise.

use candle_core::{DType, Device, Tensor, Var};
use rollflash_train::{
    policy_loss, CorrectionConfig, CorrectionFilter, CorrectionLevel, IsWeightConfig, LossAgg,
    OldPolicy, PgVariant, PolicyLossInputs, TrainError,
};

use crate::common::{assert_all_close, assert_close, cfg_with, run, run64, Data};

const TOL: f64 = 1e-12;
const ALL_VARIANTS: [PgVariant; 8] = [
    PgVariant::Vanilla,
    PgVariant::Ppo,
    PgVariant::Tis,
    PgVariant::Topr,
    PgVariant::Cispo,
    PgVariant::Kimi15,
    PgVariant::Gspo,
    PgVariant::DecoupledPpo,
];
const ALL_AGGS: [LossAgg; 4] = [
    LossAgg::TokenMean,
    LossAgg::SeqMeanTokenSum,
    LossAgg::SeqMeanTokenMean,
    LossAgg::SeqMeanTokenSumNorm,
];

#[test]
fn ppo_at_ratio_one_is_minus_mean_advantage() {
    let adv = [0.5, -1.0, 2.0, 0.25, -0.75];
    let data = Data::simple(&[2, 3], &adv);
    let cfg = cfg_with(|c| c.loss_agg = LossAgg::TokenMean);
    let out = run64(&data, &cfg);
    let mean: f64 = adv.iter().sum::<f64>() / 5.0;
    assert_close(out.loss, -mean, TOL, 0.0, "loss");
    // d(−A·r)/dlogπ = −A·r = −A at r = 1, over N = 5 tokens.
    let want: Vec<f64> = adv.iter().map(|a| -a / 5.0).collect();
    assert_all_close(&out.grad, &want, TOL, 0.0, "grad");
    let m = out.metrics;
    assert_eq!(
        (m.clip_frac, m.ratio_mean_token, m.ratio_max, m.ratio_min),
        (0.0, 1.0, 1.0, 1.0)
    );
    assert_close(m.approx_kl, 0.0, TOL, 0.0, "approx_kl");
}

#[test]
fn vanilla_gradient_is_minus_advantage_over_token_count() {
    let adv = [0.3, -0.2, 1.5, -2.0];
    let mut data = Data::simple(&[1, 3], &adv);
    data.logp = vec![-0.5, -2.0, -0.1, -3.0];
    data.old_logp = vec![-0.7, -1.0, -0.3, -2.5]; // vanilla ignores the ratio
    let cfg = cfg_with(|c| {
        c.pg_variant = PgVariant::Vanilla;
        c.loss_agg = LossAgg::TokenMean;
    });
    let out = run64(&data, &cfg);
    let want: Vec<f64> = adv.iter().map(|a| -a / 4.0).collect();
    assert_all_close(&out.grad, &want, TOL, 0.0, "grad");
    let loss: f64 = (0..4).map(|t| -adv[t] * data.logp[t]).sum::<f64>() / 4.0;
    assert_close(out.loss, loss, TOL, 0.0, "loss");
}

#[test]
fn seq_mean_token_mean_weighs_sequences_equally() {
    // Lengths 1 and 3: vanilla gradient is −A / (n_i · S).
    let adv = [1.0, 1.0, 1.0, 1.0];
    let data = Data::simple(&[1, 3], &adv);
    let cfg = cfg_with(|c| {
        c.pg_variant = PgVariant::Vanilla;
        c.loss_agg = LossAgg::SeqMeanTokenMean;
    });
    let out = run64(&data, &cfg);
    assert_all_close(
        &out.grad,
        &[-0.5, -1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
        TOL,
        0.0,
        "grad",
    );
    let sum = cfg_with(|c| {
        c.pg_variant = PgVariant::Vanilla;
        c.loss_agg = LossAgg::SeqMeanTokenSum;
    });
    assert_all_close(
        &run64(&data, &sum).grad,
        &[-0.5; 4],
        TOL,
        0.0,
        "seq_mean_token_sum",
    );
    let norm = cfg_with(|c| {
        c.pg_variant = PgVariant::Vanilla;
        c.loss_agg = LossAgg::SeqMeanTokenSumNorm;
    });
    // Default L = longest sequence = 3; with agg_norm_len = 8, L = 8.
    assert_all_close(
        &run64(&data, &norm).grad,
        &[-1.0 / 3.0; 4],
        TOL,
        0.0,
        "sum_norm",
    );
    let norm8 = cfg_with(|c| {
        c.pg_variant = PgVariant::Vanilla;
        c.loss_agg = LossAgg::SeqMeanTokenSumNorm;
        c.agg_norm_len = Some(8);
    });
    assert_all_close(
        &run64(&data, &norm8).grad,
        &[-1.0 / 8.0; 4],
        TOL,
        0.0,
        "sum_norm 8",
    );
}

/// One token with advantage `adv` at ratio `ratio`, PPO with `clip_low = 0.2`,
/// `clip_high = 0.28`: (loss, grad).
fn one_token_ppo(adv: f64, ratio: f64, dual: Option<f64>) -> (f64, f64) {
    let mut data = Data::simple(&[1], &[adv]);
    data.logp = vec![-1.0 + ratio.ln()];
    let cfg = cfg_with(|c| {
        c.clip_low = 0.2;
        c.clip_high = 0.28;
        c.dual_clip = dual;
    });
    let out = run64(&data, &cfg);
    (out.loss, out.grad[0])
}

#[test]
fn ppo_clipping_kicks_in_exactly_at_one_plus_minus_eps() {
    let d = 1e-9;
    // A > 0: unclipped just below 1 + ε_high, clipped (constant, zero gradient) just above.
    let (loss, grad) = one_token_ppo(2.0, 1.28 - d, None);
    assert_close(loss, -2.0 * (1.28 - d), 1e-12, 0.0, "A>0 below");
    assert_close(grad, -2.0 * (1.28 - d), 1e-12, 0.0, "A>0 below grad (−A·r)");
    let (loss, grad) = one_token_ppo(2.0, 1.28 + d, None);
    assert_close(loss, -2.0 * 1.28, 1e-15, 0.0, "A>0 above");
    assert_eq!(grad, 0.0, "A>0 above is clipped");
    // ... and the lower bound does not clip positive advantages.
    let (_, grad) = one_token_ppo(2.0, 0.5, None);
    assert_close(grad, -2.0 * 0.5, 1e-12, 0.0, "A>0 far below");
    // A < 0: clipped just below 1 − ε_low, live just above; the upper bound does not clip.
    let (loss, grad) = one_token_ppo(-1.0, 0.8 - d, None);
    assert_close(loss, 0.8, 1e-15, 0.0, "A<0 below");
    assert_eq!(grad, 0.0, "A<0 below is clipped");
    let (loss, grad) = one_token_ppo(-1.0, 0.8 + d, None);
    assert_close(loss, 0.8 + d, 1e-12, 0.0, "A<0 above");
    assert_close(grad, 0.8 + d, 1e-12, 0.0, "A<0 above grad");
    let (_, grad) = one_token_ppo(-1.0, 1.6, None);
    assert_close(grad, 1.6, 1e-12, 0.0, "A<0 far above is live");
}

#[test]
fn dual_clip_bounds_negative_advantage_loss() {
    // A = −1 at ratio 100: plain PPO's loss is 100, the dual clip holds it at c·|A| = 3.
    let (loss, grad) = one_token_ppo(-1.0, 100.0, None);
    assert_close(loss, 100.0, 1e-9, 0.0, "no dual clip");
    assert_close(grad, 100.0, 1e-9, 0.0, "no dual clip grad");
    let (loss, grad) = one_token_ppo(-1.0, 100.0, Some(3.0));
    assert_close(loss, 3.0, TOL, 0.0, "dual clip value");
    assert_eq!(grad, 0.0, "dual clip is constant");
    // Below c the dual clip changes nothing, and it never touches positive advantages.
    let (loss, grad) = one_token_ppo(-1.0, 2.5, Some(3.0));
    assert_close(loss, 2.5, 1e-12, 0.0, "below c");
    assert_close(grad, 2.5, 1e-12, 0.0, "below c grad");
    let (loss, _) = one_token_ppo(1.0, 100.0, Some(3.0));
    assert_close(loss, -1.28, TOL, 0.0, "A>0 unaffected");
}

/// A batch with ratios away from 1, mixed advantages and a masked token.
fn varied(lengths: &[usize]) -> Data {
    let n: usize = lengths.iter().sum();
    let mut data = Data::simple(lengths, &vec![0.0; n]);
    for t in 0..n {
        let x = t as f64;
        data.logp[t] = -0.3 - 0.17 * x;
        data.old_logp[t] = data.logp[t] - 0.25 * (1.3 * x).sin();
        data.behav_logp[t] = data.old_logp[t] + 0.3 * (0.7 * x + 1.0).cos();
        data.adv[t] = (0.9 * x + 0.4).sin() * 1.5;
    }
    data
}

#[test]
fn gspo_with_one_token_sequences_equals_ppo() {
    let data = varied(&[1; 7]);
    for agg in ALL_AGGS {
        for token_grad in [false, true] {
            let gspo = cfg_with(|c| {
                c.pg_variant = PgVariant::Gspo;
                c.gspo_clip_low = 0.1;
                c.gspo_clip_high = 0.15;
                c.gspo_token_grad = token_grad;
                c.dual_clip = Some(1.5);
                c.loss_agg = agg;
            });
            let ppo = cfg_with(|c| {
                c.clip_low = 0.1;
                c.clip_high = 0.15;
                c.dual_clip = Some(1.5);
                c.loss_agg = agg;
            });
            let (a, b) = (run64(&data, &gspo), run64(&data, &ppo));
            assert!(b.metrics.clip_frac > 0.0, "the batch must clip something");
            assert_close(a.loss, b.loss, TOL, 0.0, "loss");
            assert_all_close(&a.grad, &b.grad, TOL, 0.0, "grad");
        }
    }
}

#[test]
fn gspo_gradient_forms_agree_for_sequence_constant_advantages() {
    let mut data = varied(&[3, 4, 2]);
    let advs = [0.7, -1.1, 0.4];
    for (i, range) in [0..3, 3..7, 7..9].into_iter().enumerate() {
        for t in range {
            data.adv[t] = advs[i];
        }
    }
    for agg in ALL_AGGS {
        let cfg = |token_grad| {
            cfg_with(|c| {
                c.pg_variant = PgVariant::Gspo;
                c.gspo_clip_low = 0.05;
                c.gspo_clip_high = 0.05;
                c.gspo_token_grad = token_grad;
                c.loss_agg = agg;
            })
        };
        let (a, b) = (run64(&data, &cfg(false)), run64(&data, &cfg(true)));
        assert_close(a.loss, b.loss, TOL, 0.0, "loss");
        // Equal only when the per-token aggregation weight is constant within a sequence,
        // which holds for every mode.
        assert_all_close(&a.grad, &b.grad, TOL, 1e-12, "grad");
    }
}

#[test]
fn decoupled_ppo_with_behaviour_equal_to_old_is_ppo() {
    let mut data = varied(&[3, 4, 2]);
    data.behav_logp = data.old_logp.clone();
    for agg in ALL_AGGS {
        let ppo = cfg_with(|c| {
            c.loss_agg = agg;
            c.dual_clip = Some(2.0);
        });
        let dec = cfg_with(|c| {
            c.loss_agg = agg;
            c.dual_clip = Some(2.0);
            c.pg_variant = PgVariant::DecoupledPpo;
            c.behav_imp_weight_cap = Some(1.0); // w = 1 exactly: at the cap, kept
        });
        let (a, b) = (run64(&data, &dec), run64(&data, &ppo));
        assert_close(a.loss, b.loss, TOL, 0.0, "loss");
        assert_all_close(&a.grad, &b.grad, TOL, 0.0, "grad");
        assert_eq!(a.metrics.decoupled_cap_frac, 0.0);
    }
}

#[test]
fn behaviour_as_old_policy_is_the_proximal_loss_fed_the_behaviour_log_probs() {
    let data = varied(&[3, 4, 2]);
    let mut fed = data.clone();
    fed.old_logp = data.behav_logp.clone();
    for variant in ALL_VARIANTS {
        if variant == PgVariant::DecoupledPpo {
            continue; // refused with `behaviour` (its weight would be 1)
        }
        for agg in ALL_AGGS {
            let set = |old_policy| {
                cfg_with(|c| {
                    c.pg_variant = variant;
                    c.loss_agg = agg;
                    c.old_policy = old_policy;
                    c.dual_clip = Some(2.5);
                })
            };
            let (a, b) = (
                run64(&data, &set(OldPolicy::Behaviour)),
                run64(&fed, &set(OldPolicy::Proximal)),
            );
            assert_close(
                a.loss,
                b.loss,
                TOL,
                0.0,
                &format!("{variant:?} {agg:?} loss"),
            );
            assert_all_close(&a.grad, &b.grad, TOL, 0.0, &format!("{variant:?} grad"));
        }
    }
}

/// Tinker's built-in `ppo` and `cispo` as SkyRL 0.4.0 defines them
/// (`skyrl/tinker/loss_fns.py`: `ρ = exp(target − sampling log-probs)`; ppo
/// `−min(ρ·A, clip(ρ, lo, hi)·A)`, cispo `−sg(clip(ρ, lo, hi))·logπ·A`), reduced as its
/// backend reduces them (each sequence's sum over its weighted tokens divided by their
/// number, then the mean over sequences), with their gradients worked out by hand in f64.
fn tinker_builtin(data: &Data, cispo: bool, lo: f64, hi: f64) -> (f64, Vec<f64>) {
    let n = data.logp.len();
    let mut bounds = data.seq_offsets.clone();
    bounds.push(n);
    let seqs = data.seq_offsets.len() as f64;
    let (mut loss, mut grad) = (0.0, vec![0.0; n]);
    for w in bounds.windows(2) {
        let n_i: f64 = data.mask[w[0]..w[1]].iter().sum();
        #[allow(clippy::needless_range_loop)] // five parallel arrays, one index
        for t in w[0]..w[1] {
            if data.mask[t] == 0.0 {
                continue;
            }
            let (lp, a) = (data.logp[t], data.adv[t]);
            let rho = (lp - data.behav_logp[t]).exp();
            let clipped = rho.clamp(lo, hi);
            let (l, g) = if cispo {
                (-clipped * lp * a, -clipped * a)
            } else if rho * a <= clipped * a {
                (-rho * a, -rho * a) // the unclipped branch: d(ρ)/d(logπ) = ρ
            } else {
                (-clipped * a, if clipped == rho { -rho * a } else { 0.0 })
            };
            loss += l / n_i / seqs;
            grad[t] = g / n_i / seqs;
        }
    }
    (loss, grad)
}

#[test]
fn behaviour_ppo_and_cispo_equal_tinkers_builtin_losses() {
    let mut data = varied(&[3, 4, 2, 5]);
    // Ratios against the behaviour policy both inside and outside [0.8, 1.2].
    for (t, b) in data.behav_logp.iter_mut().enumerate() {
        *b = data.logp[t] + 0.35 * (1.1 * t as f64).sin();
    }
    data.mask[4] = 0.0;
    for (variant, cispo) in [(PgVariant::Ppo, false), (PgVariant::Cispo, true)] {
        let cfg = cfg_with(|c| {
            c.pg_variant = variant;
            c.old_policy = OldPolicy::Behaviour;
            c.clip_low = 0.2;
            c.clip_high = 0.28;
            c.cispo_clip_low = 0.2;
            c.cispo_clip_high = 0.28;
        });
        let ours = run64(&data, &cfg);
        let (loss, grad) = tinker_builtin(&data, cispo, 0.8, 1.28);
        assert_close(ours.loss, loss, TOL, 0.0, &format!("{variant:?} loss"));
        assert_all_close(&ours.grad, &grad, TOL, 0.0, &format!("{variant:?} grad"));
        assert!(ours.metrics.clip_frac > 0.0, "some ratios must be clipped");
    }
}

#[test]
fn behaviour_as_old_policy_refuses_settings_that_would_do_nothing() {
    let dec = cfg_with(|c| {
        c.pg_variant = PgVariant::DecoupledPpo;
        c.old_policy = OldPolicy::Behaviour;
    });
    let e = dec.validate().unwrap_err().to_string();
    assert!(e.contains("old_policy"), "{e}");
    let corr = cfg_with(|c| {
        c.old_policy = OldPolicy::Behaviour;
        c.correction.is_weight = Some(IsWeightConfig::default());
    });
    let e = corr.validate().unwrap_err().to_string();
    assert!(e.contains("correction"), "{e}");
}

#[test]
fn decoupled_cap_drops_tokens_but_keeps_them_in_the_denominator() {
    // Two tokens at ratio 1 with A = 1; the second one's behaviour weight is e ≈ 2.72 > cap 2.
    let mut data = Data::simple(&[2], &[1.0, 1.0]);
    data.behav_logp = vec![-1.0 - 0.5, -1.0 - 1.0];
    let cfg = cfg_with(|c| {
        c.pg_variant = PgVariant::DecoupledPpo;
        c.loss_agg = LossAgg::TokenMean;
        c.behav_imp_weight_cap = Some(2.0);
    });
    let out = run64(&data, &cfg);
    let w0 = 0.5f64.exp();
    assert_close(out.loss, -w0 / 2.0, TOL, 0.0, "loss: (−A·r·w₀ + 0) / 2");
    assert_all_close(&out.grad, &[-w0 / 2.0, 0.0], TOL, 0.0, "grad");
    assert_close(out.metrics.decoupled_cap_frac, 0.5, TOL, 0.0, "cap frac");
    // No cap: both tokens count with their weights.
    let nocap = cfg_with(|c| {
        c.pg_variant = PgVariant::DecoupledPpo;
        c.loss_agg = LossAgg::TokenMean;
        c.behav_imp_weight_cap = None;
    });
    let out = run64(&data, &nocap);
    assert_close(out.loss, -(w0 + 1f64.exp()) / 2.0, TOL, 0.0, "no cap");
}

#[test]
fn masked_tokens_get_zero_gradient_even_with_garbage() {
    let mut data = varied(&[3, 4, 2]);
    data.ref_logp = Some(data.logp.iter().map(|l| l - 0.1).collect());
    data.entropy = Some(vec![1.0; 9]);
    data.seq_scores = Some(vec![1.0, -1.0, 0.0]);
    let masked = [0usize, 4, 8];
    for &t in &masked {
        data.mask[t] = 0.0;
        data.logp[t] = f64::NEG_INFINITY;
        data.old_logp[t] = f64::NAN;
        data.behav_logp[t] = f64::INFINITY;
        data.adv[t] = f64::NAN;
        data.ref_logp.as_mut().unwrap()[t] = f64::NAN;
        data.entropy.as_mut().unwrap()[t] = f64::NAN;
    }
    for variant in ALL_VARIANTS {
        for agg in ALL_AGGS {
            let cfg = cfg_with(|c| {
                c.pg_variant = variant;
                c.loss_agg = agg;
                c.gspo_clip_low = 0.1;
                c.gspo_clip_high = 0.1;
                c.kl_coef = 0.1;
                c.entropy_coef = 0.01;
                if variant != PgVariant::DecoupledPpo {
                    c.correction.is_weight = Some(IsWeightConfig::default());
                }
            });
            let out = run64(&data, &cfg);
            let what = format!("{variant:?}/{agg:?}");
            assert!(out.loss.is_finite(), "{what}: loss {}", out.loss);
            for (t, g) in out.grad.iter().enumerate() {
                if masked.contains(&t) {
                    assert_eq!(*g, 0.0, "{what}: masked token {t}");
                } else {
                    assert!(g.is_finite(), "{what}: token {t} grad {g}");
                }
            }
            let m = out.metrics;
            for v in [
                m.approx_kl,
                m.ratio_mean_token,
                m.ratio_max,
                m.ratio_min,
                m.clip_frac,
            ] {
                assert!(v.is_finite(), "{what}: metric {v}");
            }
            assert_eq!((m.n_valid_tokens, m.n_valid_seqs), (6, 3));
        }
    }
}

#[test]
fn a_fully_masked_batch_gives_zero_loss_and_gradient() {
    let mut data = varied(&[2, 2]);
    data.mask = vec![0.0; 4];
    for variant in ALL_VARIANTS {
        let out = run64(&data, &cfg_with(|c| c.pg_variant = variant));
        assert_eq!(out.loss, 0.0);
        assert!(out.grad.iter().all(|&g| g == 0.0));
        assert_eq!(out.metrics.n_valid_tokens, 0);
        assert_eq!(out.metrics.ratio_mean_token, 1.0);
    }
}

#[test]
fn tis_topr_cispo_weights_are_detached_clamped_ratios() {
    // One token, A = 1, ratio 1.5 (π_θ above π_old): TIS/TOPR-negative weight min(r, 1) = 1,
    // CISPO weight 1 + ε_high; the gradient is −w·A and the value −w·A·logπ.
    let mut data = Data::simple(&[1], &[1.0]);
    data.logp = vec![-1.0 + 1.5f64.ln()];
    let lp = data.logp[0];
    let tis = run64(&data, &cfg_with(|c| c.pg_variant = PgVariant::Tis));
    assert_close(tis.grad[0], -1.0, TOL, 0.0, "tis grad");
    assert_close(tis.loss, -lp, TOL, 0.0, "tis loss");
    assert_eq!(tis.metrics.clip_frac, 1.0);
    let cispo = run64(
        &data,
        &cfg_with(|c| {
            c.pg_variant = PgVariant::Cispo;
            c.cispo_clip_high = 0.2;
        }),
    );
    assert_close(cispo.grad[0], -1.2, TOL, 0.0, "cispo grad");
    // Unified mask: A > 0 and r > 1 + ε_high drops the token.
    let unified = run64(
        &data,
        &cfg_with(|c| {
            c.pg_variant = PgVariant::Cispo;
            c.cispo_clip_high = 0.2;
            c.cispo_unified_mask = true;
        }),
    );
    assert_eq!(unified.grad[0], 0.0);
    // TOPR: a positive token is plain REINFORCE; with a non-positive score it is TIS.
    let topr = cfg_with(|c| {
        c.pg_variant = PgVariant::Topr;
        c.topr_positive_weight = 2.0;
        c.topr_negative_weight = 0.5;
    });
    assert_close(run64(&data, &topr).grad[0], -2.0, TOL, 0.0, "topr positive");
    data.seq_scores = Some(vec![0.0]);
    data.logp = vec![-1.0 + 0.5f64.ln()]; // ratio 0.5
    assert_close(
        run64(&data, &topr).grad[0],
        -0.5 * 0.5,
        TOL,
        0.0,
        "topr negative",
    );
}

#[test]
fn kimi15_gradient() {
    // ℓ = −A·logπ + τ/2·(logπ − logπ_old)²  ⇒  ∂ℓ/∂logπ = −A + τ·(logπ − logπ_old).
    let mut data = Data::simple(&[1], &[0.7]);
    data.logp = vec![-1.2];
    data.old_logp = vec![-1.5];
    let cfg = cfg_with(|c| {
        c.pg_variant = PgVariant::Kimi15;
        c.kimi15_tau = 0.4;
    });
    let out = run64(&data, &cfg);
    assert_close(out.grad[0], -0.7 + 0.4 * 0.3, TOL, 0.0, "grad");
    assert_close(out.loss, 0.7 * 1.2 + 0.2 * 0.09, TOL, 0.0, "loss");
}

#[test]
fn correction_weight_and_filters() {
    // Token ratios exp(old − behav): 2.0, 1.0, 0.5.
    let mut data = Data::simple(&[3], &[1.0, 1.0, 1.0]);
    data.behav_logp = vec![-1.0 - 2f64.ln(), -1.0, -1.0 + 2f64.ln()];
    let vanilla = |corr: CorrectionConfig| {
        cfg_with(|c| {
            c.pg_variant = PgVariant::Vanilla;
            c.loss_agg = LossAgg::TokenMean;
            c.correction = corr;
        })
    };
    // Token level, clamped at 1.2: weights 1.2, 1, 0.5.
    let token = run64(
        &data,
        &vanilla(CorrectionConfig {
            is_weight: Some(IsWeightConfig::default()),
            filters: vec![],
        }),
    );
    assert_all_close(
        &token.grad,
        &[-0.4, -1.0 / 3.0, -0.5 / 3.0],
        TOL,
        0.0,
        "token",
    );
    assert_close(
        token.metrics.correction_weight_mean,
        2.7 / 3.0,
        TOL,
        0.0,
        "mean w",
    );
    // Sequence level (sum of log-ratios = 0 ⇒ weight 1), unclamped.
    let seq = run64(
        &data,
        &vanilla(CorrectionConfig {
            is_weight: Some(IsWeightConfig {
                level: CorrectionLevel::Sequence,
                upper_bound: None,
            }),
            filters: vec![],
        }),
    );
    assert_all_close(&seq.grad, &[-1.0 / 3.0; 3], TOL, 0.0, "sequence");
    // A token filter keeping ratios in [0.8, 1.2] leaves only the middle token, and the
    // token-mean denominator shrinks with it.
    let filtered = run64(
        &data,
        &vanilla(CorrectionConfig {
            is_weight: None,
            filters: vec![CorrectionFilter::default()],
        }),
    );
    assert_all_close(&filtered.grad, &[0.0, -1.0, 0.0], TOL, 0.0, "filtered");
    assert_close(
        filtered.metrics.correction_filtered_frac,
        2.0 / 3.0,
        TOL,
        0.0,
        "frac",
    );
    assert_eq!(filtered.metrics.n_valid_tokens, 1);
}

#[test]
fn kl_and_entropy_terms_add_to_the_loss() {
    let mut data = Data::simple(&[2], &[0.0, 0.0]);
    data.ref_logp = Some(vec![-1.5, -0.5]);
    data.entropy = Some(vec![2.0, 4.0]);
    let cfg = cfg_with(|c| {
        c.loss_agg = LossAgg::TokenMean;
        c.kl_coef = 0.5;
        c.kl_estimator = rollflash_train::KlEstimator::K1;
        c.entropy_coef = 0.1;
    });
    let out = run64(&data, &cfg);
    // pg = 0 (A = 0); k1 = logπ − ref = 0.5, −0.5 ⇒ mean 0; entropy mean 3.
    assert_close(out.loss, -0.3, TOL, 0.0, "loss");
    assert_eq!(out.metrics.kl_loss, Some(0.0));
    assert_eq!(out.metrics.entropy, Some(3.0));
    // d(0.5·mean k1)/dlogπ = 0.5 / 2.
    assert_all_close(&out.grad, &[0.25, 0.25], TOL, 0.0, "grad");
}

#[test]
fn f32_matches_f64() {
    let data = varied(&[3, 4, 2]);
    for variant in ALL_VARIANTS {
        let cfg = cfg_with(|c| {
            c.pg_variant = variant;
            c.gspo_clip_low = 0.1;
            c.gspo_clip_high = 0.1;
        });
        let a = run64(&data, &cfg);
        let b = run(&data, &cfg, DType::F32).unwrap();
        assert_close(b.loss, a.loss, 1e-6, 1e-5, &format!("{variant:?} loss"));
        assert_all_close(&b.grad, &a.grad, 1e-6, 1e-5, &format!("{variant:?} grad"));
    }
}

#[test]
fn input_errors_name_the_input() {
    let dev = Device::Cpu;
    let logp = Var::from_slice(&[-1.0f64, -1.0, -1.0], 3, &dev).unwrap();
    let three = Tensor::new(&[-1.0f64, -1.0, -1.0], &dev).unwrap();
    let two = Tensor::new(&[1.0f64, 1.0], &dev).unwrap();
    let cfg = rollflash_train::LossConfig::default();
    let offsets = [0usize];

    let inputs = PolicyLossInputs::new(logp.as_tensor(), &three, &three, &two, &three, &offsets);
    match policy_loss(&inputs, &cfg) {
        Err(TrainError::Length {
            name: "adv",
            expected: 3,
            got: 2,
        }) => {}
        other => panic!("{other:?}"),
    }

    let bad_offsets = [1usize];
    let inputs = PolicyLossInputs::new(
        logp.as_tensor(),
        &three,
        &three,
        &three,
        &three,
        &bad_offsets,
    );
    assert!(matches!(
        policy_loss(&inputs, &cfg),
        Err(TrainError::Layout { .. })
    ));

    let matrix = Tensor::zeros((3, 1), DType::F64, &dev).unwrap();
    let inputs = PolicyLossInputs::new(logp.as_tensor(), &matrix, &three, &three, &three, &offsets);
    assert!(matches!(
        policy_loss(&inputs, &cfg),
        Err(TrainError::Rank {
            name: "old_logp",
            ..
        })
    ));

    let inputs = PolicyLossInputs::new(logp.as_tensor(), &three, &three, &three, &three, &offsets);
    let kl = cfg_with(|c| c.kl_coef = 0.1);
    let err = policy_loss(&inputs, &kl).unwrap_err();
    assert!(err.to_string().contains("ref_logp"), "{err}");
    let ent = cfg_with(|c| c.entropy_coef = 0.1);
    let err = policy_loss(&inputs, &ent).unwrap_err();
    assert!(err.to_string().contains("entropy"), "{err}");

    let empty = Tensor::zeros(0, DType::F64, &dev).unwrap();
    let none: [usize; 0] = [];
    let inputs = PolicyLossInputs::new(&empty, &empty, &empty, &empty, &empty, &none);
    assert!(matches!(
        policy_loss(&inputs, &cfg),
        Err(TrainError::EmptyBatch)
    ));
}

#[test]
fn segment_correction_is_per_turn_and_geometric_on_one_turn() {
    use rollflash_train::correction::{CorrectionConfig, CorrectionLevel, IsWeightConfig};
    let weight_at = |level, mask: Vec<f64>| {
        let mut d = Data::simple(&[6], &[1.0; 6]);
        d.mask = mask;
        // Turn 1 (tokens 0-1) drifted by +0.2 per token, turn 2 (tokens 4-5) by −0.1.
        d.behav_logp = vec![-1.2, -1.2, -1.0, -1.0, -0.9, -0.9];
        let cfg = cfg_with(|c| {
            c.pg_variant = PgVariant::Vanilla;
            c.correction = CorrectionConfig {
                is_weight: Some(IsWeightConfig {
                    level,
                    upper_bound: None,
                }),
                filters: vec![],
            };
        });
        run64(&d, &cfg).metrics.correction_weight_mean
    };
    let two_turns = vec![1.0, 1.0, 0.0, 0.0, 1.0, 1.0];
    let seg = weight_at(CorrectionLevel::Segment, two_turns.clone());
    // Each turn its own geometric mean: (e^0.2 + e^0.2 + e^−0.1 + e^−0.1) / 4.
    let want = (2.0 * 0.2f64.exp() + 2.0 * (-0.1f64).exp()) / 4.0;
    assert!((seg - want).abs() < 1e-12, "{seg} vs {want}");
    let geo = weight_at(CorrectionLevel::Geometric, two_turns);
    assert!((geo - 0.05f64.exp()).abs() < 1e-12);
    // One turn: segment = geometric.
    let one_turn = vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0];
    assert_eq!(
        weight_at(CorrectionLevel::Segment, one_turn.clone()),
        weight_at(CorrectionLevel::Geometric, one_turn)
    );
}

#[test]
fn rejection_sampling_on_all_masked_sequences_and_the_cap_it_replaces() {
    use rollflash_train::{RejectionAgg, RejectionLevel, RejectionSampling};
    let mut d = Data::simple(&[2, 2], &[1.0, 1.0, -1.0, -1.0]);
    d.mask = vec![0.0, 0.0, 1.0, 1.0];
    d.behav_logp = vec![-9.0, f64::NEG_INFINITY, -1.5, -1.0];
    for level in [RejectionLevel::Token, RejectionLevel::Sequence] {
        for agg in [RejectionAgg::Sum, RejectionAgg::Mean, RejectionAgg::Max] {
            let cfg = cfg_with(|c| {
                c.pg_variant = PgVariant::DecoupledPpo;
                c.rejection_sampling = Some(RejectionSampling {
                    level,
                    agg,
                    upper: 1.5,
                    ..Default::default()
                });
            });
            let out = run64(&d, &cfg);
            assert!(out.loss.is_finite() && out.grad.iter().all(|g| g.is_finite()));
            assert_eq!(&out.grad[..2], &[0.0, 0.0], "{level:?} {agg:?}");
        }
    }
    // Token level: token 2 has weight e^0.5 ≈ 1.65 > 1.5 and is rejected; the cap alone
    // (5.0) would keep it.
    let cfg = cfg_with(|c| {
        c.pg_variant = PgVariant::DecoupledPpo;
        c.rejection_sampling = Some(RejectionSampling {
            upper: 1.5,
            ..Default::default()
        });
    });
    let m = run64(&d, &cfg).metrics;
    assert_eq!(m.decoupled_cap_frac, 0.5);
    let capped = run64(&d, &cfg_with(|c| c.pg_variant = PgVariant::DecoupledPpo)).metrics;
    assert_eq!(capped.decoupled_cap_frac, 0.0);
    // Outside decoupled PPO it is refused, naming the field.
    let e = cfg_with(|c| {
        c.pg_variant = PgVariant::Ppo;
        c.rejection_sampling = Some(RejectionSampling::default());
    })
    .validate()
    .unwrap_err();
    assert!(e.to_string().contains("rejection_sampling"), "{e}");
}

#[test]
fn ratio_means_per_token_and_per_sequence_differ_as_named() {
    // Sequence 0: 3 tokens at ratio e^0.1; sequence 1: 1 token at ratio e^−0.3.
    let mut d = Data::simple(&[3, 1], &[1.0; 4]);
    d.logp = vec![-0.9, -0.9, -0.9, -1.3];
    let m = run64(&d, &cfg_with(|c| c.pg_variant = PgVariant::Ppo)).metrics;
    let (a, b) = (0.1f64.exp(), (-0.3f64).exp());
    assert!((m.ratio_mean_token - (3.0 * a + b) / 4.0).abs() < 1e-12);
    assert!((m.ratio_mean_seq - (a + b) / 2.0).abs() < 1e-12);
}
