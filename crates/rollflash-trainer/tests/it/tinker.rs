//! The Tinker learner's loss paths, without a server: which of our losses take the server's
//! built-in `importance_sampling`, `ppo` or `cispo`, and the custom path's surrogate, whose gradient under
//! SkyRL's reduction (`skyrl/backends/jax.py`: each sequence's loss summed over its weighted
//! tokens and divided by their count, then averaged over the datums) is ours.

use candle_core::{Device, Tensor, Var};
use rollflash_core::buffer::{Batch, BatchGroup, GroupKey};
use rollflash_core::{PolicyVersion, Trajectory};
use rollflash_train::loss::{LossConfig, OldPolicy, PgVariant};
use rollflash_train::LossAgg;
use rollflash_trainer::tinker::surrogate_advantages;
use rollflash_trainer::{PackedBatch, TinkerLossPath};

#[test]
fn decoupled_ppo_without_extras_takes_the_builtin_path_the_rest_the_custom_one() {
    // AReaL's cap (the default, 5) masks tokens the server's loss would keep: only an
    // uncapped decoupled PPO is the built-in.
    let decoupled = LossConfig {
        pg_variant: PgVariant::DecoupledPpo,
        loss_agg: LossAgg::SeqMeanTokenMean,
        behav_imp_weight_cap: None,
        ..Default::default()
    };
    assert_eq!(
        TinkerLossPath::of(&decoupled),
        Ok(TinkerLossPath::BuiltinImportanceSampling)
    );
    let capped = LossConfig {
        behav_imp_weight_cap: Some(5.0),
        ..decoupled.clone()
    };
    assert_eq!(
        LossConfig::default().behav_imp_weight_cap,
        Some(5.0),
        "the default cap this test relies on"
    );
    assert_eq!(TinkerLossPath::of(&capped), Ok(TinkerLossPath::Custom));
    // A cap that never binds (`behav_imp_weight_cap = inf` in TOML) is no cap.
    let never = LossConfig {
        behav_imp_weight_cap: Some(f64::INFINITY),
        ..decoupled.clone()
    };
    assert_eq!(
        TinkerLossPath::of(&never),
        Ok(TinkerLossPath::BuiltinImportanceSampling)
    );
    let token_mean = LossConfig {
        loss_agg: LossAgg::TokenMean,
        ..decoupled.clone()
    };
    assert_eq!(TinkerLossPath::of(&token_mean), Ok(TinkerLossPath::Custom));
    assert_eq!(
        TinkerLossPath::of(&LossConfig::default()),
        Ok(TinkerLossPath::Custom)
    );
    let kl = LossConfig {
        kl_coef: 0.1,
        ..decoupled.clone()
    };
    assert!(TinkerLossPath::of(&kl).unwrap_err().contains("kl_coef"));
    let entropy = LossConfig {
        entropy_coef: 0.01,
        ..decoupled
    };
    assert!(TinkerLossPath::of(&entropy)
        .unwrap_err()
        .contains("entropy_coef"));
}

#[test]
fn ppo_and_cispo_against_the_behaviour_policy_take_the_servers_ppo_and_cispo() {
    // The server's ratio is against the sampling log-probs: only `old_policy = "behaviour"`
    // is its loss; against the proximal policy the ratio is 1 at the step's start.
    let ppo = LossConfig {
        pg_variant: PgVariant::Ppo,
        old_policy: OldPolicy::Behaviour,
        clip_low: 0.2,
        clip_high: 0.28,
        ..Default::default()
    };
    assert_eq!(
        TinkerLossPath::of(&ppo),
        Ok(TinkerLossPath::BuiltinPpo {
            clip_low_threshold: 0.8,
            clip_high_threshold: 1.28
        })
    );
    let proximal = LossConfig {
        old_policy: OldPolicy::Proximal,
        ..ppo.clone()
    };
    assert_eq!(TinkerLossPath::of(&proximal), Ok(TinkerLossPath::Custom));
    // The server's ppo has no dual clip, and reduces seq-mean-token-mean only.
    let dual = LossConfig {
        dual_clip: Some(3.0),
        ..ppo.clone()
    };
    assert_eq!(TinkerLossPath::of(&dual), Ok(TinkerLossPath::Custom));
    let token_sum = LossConfig {
        loss_agg: LossAgg::SeqMeanTokenSum,
        ..ppo.clone()
    };
    assert_eq!(TinkerLossPath::of(&token_sum), Ok(TinkerLossPath::Custom));
    let cispo = LossConfig {
        pg_variant: PgVariant::Cispo,
        cispo_clip_low: 0.5,
        cispo_clip_high: 0.25,
        ..ppo
    };
    assert_eq!(
        TinkerLossPath::of(&cispo),
        Ok(TinkerLossPath::BuiltinCispo {
            clip_low_threshold: 0.5,
            clip_high_threshold: 1.25
        })
    );
    let unified = LossConfig {
        cispo_unified_mask: true,
        ..cispo
    };
    assert_eq!(TinkerLossPath::of(&unified), Ok(TinkerLossPath::Custom));
}

/// Two groups: sequences of 3 prompt tokens and 1–4 model tokens, one with none.
fn batch() -> Batch<Trajectory> {
    let mut groups = Vec::new();
    for g in 0..2u64 {
        let mut samples = Vec::new();
        for i in 0..3usize {
            let resp = (g as usize * 3 + i) % 5;
            let n = 3 + resp;
            let t = Trajectory {
                tokens: (0..n as u32).map(|k| 4 + k).collect(),
                loss_mask: (0..n).map(|k| u8::from(k >= 3)).collect(),
                logprobs: (0..n)
                    .map(|k| if k >= 3 { -1.0 - 0.1 * k as f32 } else { 0.0 })
                    .collect(),
                versions: vec![PolicyVersion(0); n],
                prompt_len: 3,
                index: i,
                ..Default::default()
            };
            samples.push((t, i as f64));
        }
        groups.push(samples);
    }
    batch_of(groups)
}

/// Groups of (trajectory, reward) as a batch of version 0, group `k` keyed `k`.
pub fn batch_of(groups: Vec<Vec<(Trajectory, f64)>>) -> Batch<Trajectory> {
    Batch {
        version: PolicyVersion(0),
        groups: groups
            .into_iter()
            .enumerate()
            .map(|(k, samples)| BatchGroup {
                key: GroupKey(k as u64),
                start: PolicyVersion(0),
                samples,
            })
            .collect(),
    }
}

/// The server's `importance_sampling` loss with SkyRL's reduction, computed here with
/// autograd: its gradient with respect to the current log-probs at ratio 1 must be `g`.
#[test]
fn the_surrogate_gradient_under_the_servers_reduction_is_ours() {
    let b = batch();
    let p = PackedBatch::new(&b).unwrap();
    let kept: Vec<usize> = (0..p.n_seq())
        .filter(|&i| p.mask[p.offsets[i]..p.offsets[i + 1]].iter().any(|&m| m))
        .collect();
    assert!(
        kept.len() < p.n_seq(),
        "the batch has a sequence without model tokens"
    );
    // Some gradient of ours: any values on the model's tokens, 0 elsewhere.
    let g: Vec<f64> = (0..p.total())
        .map(|t| {
            if p.mask[t] {
                0.37 * (t as f64 - 4.5)
            } else {
                0.0
            }
        })
        .collect();
    let adv = surrogate_advantages(&p, &kept, &g);
    let dev = Device::Cpu;
    let current: Vec<f64> = p.behav.iter().map(|&x| f64::from(x) + 0.05).collect();
    let logp = Var::from_tensor(&Tensor::new(current.as_slice(), &dev).unwrap()).unwrap();
    let q = logp.as_tensor().detach();
    let ratio = (logp.as_tensor() - &q).unwrap().exp().unwrap();
    let mut total = Tensor::new(0f64, &dev).unwrap();
    for &i in &kept {
        // Datum i: targets are tokens offsets[i]+1 .. offsets[i+1].
        let (a, e) = (p.offsets[i] + 1, p.offsets[i + 1]);
        let w: Vec<f64> = p.mask[a..e]
            .iter()
            .map(|&m| f64::from(u8::from(m)))
            .collect();
        let n_i: f64 = w.iter().sum();
        let a_t: Vec<f64> = adv[a..e].iter().map(|&x| f64::from(x)).collect();
        let r = ratio.narrow(0, a, e - a).unwrap();
        let w = Tensor::new(w.as_slice(), &dev).unwrap();
        let a_t = Tensor::new(a_t.as_slice(), &dev).unwrap();
        let seq = ((r * a_t).unwrap() * w)
            .unwrap()
            .neg()
            .unwrap()
            .sum_all()
            .unwrap();
        total = (total + (seq / n_i.max(1e-9)).unwrap()).unwrap();
    }
    let loss = (total / kept.len() as f64).unwrap();
    let grads = loss.backward().unwrap();
    let got = grads
        .get(logp.as_tensor())
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    for t in 0..p.total() {
        // f32 advantages: a relative error of about 1e-7.
        assert!(
            (got[t] - g[t]).abs() <= 1e-6 * (1.0 + g[t].abs()),
            "token {t}: the surrogate's gradient {} differs from ours {}",
            got[t],
            g[t]
        );
    }
}
