//! The training side: every parameter gets a gradient that matches finite differences (f64),
//! the optimizer over-fits a tiny data set, the schedule is the documented one.

use candle_core::{DType, Device, Tensor};
use rollflash_model::config::{Arch, ModelConfig};
use rollflash_model::train::{
    token_stats, AdamW, GradAccumulator, OptimizerConfig, TrainableModel,
};

use crate::common::{sharp_weights, ARCHS};

const SEQS: [&[u32]; 3] = [&[1, 5, 9, 2, 7], &[3, 12, 8], &[10, 4, 6, 1, 2, 9, 11]];

/// A scalar that touches log-probs and entropies of every position with distinct weights.
fn loss(model: &TrainableModel) -> Tensor {
    let s = token_stats(model.model(), &SEQS, 0.7, false).unwrap();
    let n = s.logprobs.dim(0).unwrap();
    let coef: Vec<f64> = (0..n).map(|i| ((i * 37 % 11) as f64 - 5.0) / 5.0).collect();
    let coef = Tensor::from_vec(coef, n, &Device::Cpu).unwrap();
    let a = (&s.logprobs * &coef).unwrap().sum_all().unwrap();
    let b = (&s.entropy * 0.3).unwrap().sum_all().unwrap();
    (a + b).unwrap()
}

/// Finite-difference check (f64, central differences, h = 1e-5) of a few entries of every
/// parameter, for each architecture, and once with a vocabulary large enough for the blocked
/// output layer (Qwen3: tied embeddings, so the head's gradient joins the embedding's).
/// Tolerance: |analytic − numeric| ≤ 1e-6 + 1e-4·|numeric|.
#[test]
fn every_parameter_gets_the_right_gradient() {
    let cases = ARCHS
        .map(|a| (a, 16))
        .into_iter()
        .chain([(Arch::Qwen3, 4096)]);
    for (arch, vocab) in cases {
        let cfg = ModelConfig::tiny(arch, vocab);
        let w = sharp_weights(&cfg, 21, 10.0, DType::F64);
        let model = TrainableModel::new(&cfg, &w, DType::F64, &Device::Cpu).unwrap();
        let grads = loss(&model).backward().unwrap();
        let expected = cfg.num_parameters();
        let counted: usize = model
            .vars()
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count())
            .sum();
        assert_eq!(counted, expected, "{arch:?}: parameter count");
        for (name, var) in model.vars() {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{arch:?}: no gradient for {name}"))
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            assert!(
                g.iter().any(|x| x.abs() > 1e-10),
                "{arch:?}: zero gradient for {name}"
            );
            let orig = var
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            let shape = var.as_tensor().shape().clone();
            // Check the entry with the largest gradient plus two fixed ones.
            let top = (0..g.len())
                .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
                .unwrap();
            for idx in [top, 0, g.len() / 2] {
                let h = 1e-5;
                let at = |delta: f64| {
                    let mut p = orig.clone();
                    p[idx] += delta;
                    var.set(&Tensor::from_vec(p, shape.clone(), &Device::Cpu).unwrap())
                        .unwrap();
                    loss(&model).to_scalar::<f64>().unwrap()
                };
                let numeric = (at(h) - at(-h)) / (2.0 * h);
                var.set(&Tensor::from_vec(orig.clone(), shape.clone(), &Device::Cpu).unwrap())
                    .unwrap();
                let analytic = g[idx];
                assert!(
                    (analytic - numeric).abs() <= 1e-6 + 1e-4 * numeric.abs(),
                    "{arch:?} {name}[{idx}]: analytic {analytic} vs numeric {numeric}"
                );
            }
        }
    }
}

/// The differentiable forward and the fused inference forward give the same log-probs.
#[test]
fn fused_and_differentiable_forwards_agree() {
    for arch in ARCHS {
        let cfg = ModelConfig::tiny(arch, 16);
        let w = sharp_weights(&cfg, 4, 10.0, DType::F32);
        let m = TrainableModel::new(&cfg, &w, DType::F32, &Device::Cpu).unwrap();
        let a: Vec<f32> = token_stats(m.model(), &SEQS, 1.0, false)
            .unwrap()
            .logprobs
            .to_vec1()
            .unwrap();
        let b: Vec<f32> = token_stats(m.model(), &SEQS, 1.0, true)
            .unwrap()
            .logprobs
            .to_vec1()
            .unwrap();
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-4, "{arch:?}: {x} vs {y}");
        }
    }
}

/// A tiny model memorises three sequences: mean NLL falls from ~ln(V) to near zero, using
/// two micro-batches per step (gradient accumulation) and clipping.
#[test]
fn tiny_model_overfits() {
    let cfg = ModelConfig::tiny(Arch::Qwen3, 16);
    let w = rollflash_model::weights::Weights::random(&cfg, 7, DType::F32, &Device::Cpu).unwrap();
    let model = TrainableModel::new(&cfg, &w, DType::F32, &Device::Cpu).unwrap();
    let mut opt = AdamW::new(OptimizerConfig {
        lr: 3e-2,
        weight_decay: 0.0,
        warmup_steps: 5,
        total_steps: 300,
        ..Default::default()
    });
    let nll = |m: &TrainableModel, seqs: &[&[u32]]| -> Tensor {
        let s = token_stats(m.model(), seqs, 1.0, false).unwrap();
        let n_pred: usize = seqs.iter().map(|s| s.len() - 1).sum();
        (s.logprobs.sum_all().unwrap().neg().unwrap() / n_pred as f64).unwrap()
    };
    let first = nll(&model, &SEQS).to_scalar::<f32>().unwrap();
    let mut last = first;
    for _ in 0..300 {
        let mut acc = GradAccumulator::default();
        acc.add(&model, &nll(&model, &SEQS[..1]).backward().unwrap())
            .unwrap();
        acc.add(&model, &nll(&model, &SEQS[1..]).backward().unwrap())
            .unwrap();
        assert_eq!(acc.micro_batches(), 2);
        let stats = opt.step(&model, &acc).unwrap();
        assert!(stats.grad_norm.is_finite());
        last = nll(&model, &SEQS).to_scalar::<f32>().unwrap();
    }
    assert!(first > 2.0, "starts near ln(16) = 2.77, got {first}");
    assert!(last < 0.05, "over-fitting failed: NLL {first} -> {last}");
}

/// Warm-up is linear from lr/warmup; cosine ends at min_lr_ratio·lr.
#[test]
fn lr_schedule() {
    let c = OptimizerConfig {
        lr: 1.0,
        warmup_steps: 4,
        total_steps: 14,
        min_lr_ratio: 0.1,
        ..Default::default()
    };
    assert!((c.lr_at(0) - 0.25).abs() < 1e-12);
    assert!((c.lr_at(3) - 1.0).abs() < 1e-12);
    assert!((c.lr_at(4) - 1.0).abs() < 1e-12);
    assert!((c.lr_at(9) - 0.55).abs() < 1e-12);
    assert!((c.lr_at(14) - 0.1).abs() < 1e-12);
    assert!((c.lr_at(100) - 0.1).abs() < 1e-12);
}

/// One AdamW step on a single parameter against the closed form of torch.optim.AdamW's first
/// step: w ← w·(1 − lr·wd) − lr·g/(|g| + eps), since m̂ = g and v̂ = g².
#[test]
fn adamw_first_step_closed_form() {
    let cfg = ModelConfig::tiny(Arch::Llama, 16);
    let w = rollflash_model::weights::Weights::random(&cfg, 1, DType::F64, &Device::Cpu).unwrap();
    let model = TrainableModel::new(&cfg, &w, DType::F64, &Device::Cpu).unwrap();
    let before: Vec<Vec<f64>> = model
        .vars()
        .iter()
        .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect();
    let s = token_stats(model.model(), &SEQS, 1.0, false).unwrap();
    let grads = s.logprobs.sum_all().unwrap().backward().unwrap();
    let mut acc = GradAccumulator::default();
    acc.add(&model, &grads).unwrap();
    let (lr, wd, eps) = (0.1, 0.5, 1e-8);
    let mut opt = AdamW::new(OptimizerConfig {
        lr,
        weight_decay: wd,
        eps,
        max_grad_norm: None,
        ..Default::default()
    });
    opt.step(&model, &acc).unwrap();
    for ((name, var), b) in model.vars().iter().zip(&before) {
        let g: Vec<f64> = acc
            .get(name)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let after: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let decay = if var.as_tensor().rank() >= 2 { wd } else { 0.0 };
        for i in [0, b.len() - 1] {
            let want = b[i] * (1.0 - lr * decay) - lr * g[i] / (g[i].abs() + eps);
            assert!(
                (after[i] - want).abs() < 1e-9,
                "{name}[{i}]: {} vs {want}",
                after[i]
            );
        }
    }
}
