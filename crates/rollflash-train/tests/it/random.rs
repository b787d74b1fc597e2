//! Seeded random batches: autograd against central finite differences of the loss itself,
//! for every variant whose loss has no stop-gradient (there, the derivative of the value *is*
//! the gradient), and masking invariants for all variants.
//!
//! Each seed draws 2–6 sequences of 1–7 tokens, ~25% masked, log-ratios large enough that
//! clipping, the dual clip and the decoupled cap all fire. Tokens within h of a kink (the
//! one-sided differences disagree) are skipped. f64; tolerance 1e-6 absolute + 1e-5 relative
//! (h = 1e-6 central differences).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollflash_train::{LossAgg, LossConfig, PgVariant};

use crate::common::{cfg_with, run64, Data};

fn random_batch(rng: &mut ChaCha8Rng) -> Data {
    let lengths: Vec<usize> = (0..rng.random_range(2..=6))
        .map(|_| rng.random_range(1..=7))
        .collect();
    let n: usize = lengths.iter().sum();
    let mut data = Data::simple(&lengths, &vec![0.0; n]);
    for t in 0..n {
        data.logp[t] = -rng.random_range(0.05..4.0);
        data.old_logp[t] = data.logp[t] - rng.random_range(-0.8..0.8);
        data.behav_logp[t] = data.old_logp[t] - rng.random_range(-1.0..1.0);
        data.adv[t] = rng.random_range(-2.0..2.0);
        if rng.random_bool(0.25) {
            data.mask[t] = 0.0;
        }
    }
    data
}

fn loss_at(data: &Data, cfg: &LossConfig, t: usize, dx: f64) -> f64 {
    let mut d = data.clone();
    d.logp[t] += dx;
    run64(&d, cfg).loss
}

fn configs() -> Vec<LossConfig> {
    let mut out = Vec::new();
    for agg in [
        LossAgg::TokenMean,
        LossAgg::SeqMeanTokenSum,
        LossAgg::SeqMeanTokenMean,
        LossAgg::SeqMeanTokenSumNorm,
    ] {
        for variant in [
            PgVariant::Vanilla,
            PgVariant::Ppo,
            PgVariant::Kimi15,
            PgVariant::Gspo,
            PgVariant::DecoupledPpo,
        ] {
            out.push(cfg_with(|c| {
                c.pg_variant = variant;
                c.loss_agg = agg;
                c.clip_high = 0.28;
                c.dual_clip = Some(1.8);
                c.gspo_clip_low = 0.1;
                c.gspo_clip_high = 0.1;
                c.behav_imp_weight_cap = Some(1.6);
            }));
        }
    }
    out
}

#[test]
fn autograd_matches_finite_differences_on_random_batches() {
    let h = 1e-6;
    let mut checked = 0usize;
    for seed in 0..12u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let data = random_batch(&mut rng);
        for cfg in configs() {
            let base = run64(&data, &cfg);
            for t in 0..data.logp.len() {
                let (up, down) = (loss_at(&data, &cfg, t, h), loss_at(&data, &cfg, t, -h));
                let (fwd, bwd) = ((up - base.loss) / h, (base.loss - down) / h);
                if (fwd - bwd).abs() > 1e-3 * (1.0 + fwd.abs()) {
                    continue; // a clip boundary lies within h
                }
                let fd = (up - down) / (2.0 * h);
                let g = base.grad[t];
                assert!(
                    (g - fd).abs() <= 1e-6 + 1e-5 * fd.abs(),
                    "seed {seed}, {:?}/{:?}, token {t}: autograd {g}, fd {fd}",
                    cfg.pg_variant,
                    cfg.loss_agg
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "only {checked} gradients checked");
}

#[test]
fn random_batches_exercise_clipping_and_masking() {
    let (mut clipped, mut dual, mut capped) = (0.0, 0.0, 0.0);
    for seed in 0..12u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let data = random_batch(&mut rng);
        for cfg in configs() {
            let out = run64(&data, &cfg);
            clipped += out.metrics.clip_frac;
            dual += out.metrics.dual_clip_frac;
            capped += out.metrics.decoupled_cap_frac;
            for (t, g) in out.grad.iter().enumerate() {
                if data.mask[t] == 0.0 {
                    assert_eq!(*g, 0.0, "seed {seed}: masked token {t}");
                }
            }
        }
    }
    assert!(clipped > 0.0 && dual > 0.0 && capped > 0.0);
}
