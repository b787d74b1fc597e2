//! LoRA: adapter gradients match finite differences (f64, dropout on), a fresh adapter
//! changes nothing, the engine's log-probs with unmerged adapters equal the training
//! forward's, merging is exact, and PEFT's files round-trip.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use rollflash_core::{PolicyVersion, RequestId};
use rollflash_model::config::{Arch, ModelConfig};
use rollflash_model::engine::{Engine, EngineConfig, EngineRequest};
use rollflash_model::lora::{self, Adapters, LoraConfig};
use rollflash_model::model::Transformer;
use rollflash_model::sampling::SamplingParams;
use rollflash_model::train::{token_stats, TrainableModel};
use rollflash_model::weights::Weights;

use crate::common::{sharp_weights, ARCHS};

const SEQS: [&[u32]; 3] = [&[1, 5, 9, 2, 7], &[3, 12, 8], &[10, 4, 6, 1, 2, 9, 11]];

fn lora_cfg(dropout: f64) -> LoraConfig {
    LoraConfig {
        rank: 2,
        alpha: 3.0,
        dropout,
        ..LoraConfig::default()
    }
}

/// PEFT's initialisation with `B` replaced by fixed non-zero values (a fresh `B` is zero,
/// which would leave `A` without a gradient and the adapter without an effect).
fn trained_adapters(cfg: &ModelConfig, lora: &LoraConfig, seed: u64, dtype: DType) -> Weights {
    let init = lora::init_adapters(cfg, lora, seed, DType::F64, &Device::Cpu).unwrap();
    let mut out = Weights::default();
    for name in init.names() {
        let t = &init.tensors()[name];
        let t = if name.ends_with("lora_B.weight") {
            let n = t.elem_count();
            let v: Vec<f64> = (0..n)
                .map(|i| 0.15 * ((i as f64) * 1.7 + seed as f64).sin())
                .collect();
            Tensor::from_vec(v, t.shape(), &Device::Cpu).unwrap()
        } else {
            // Twice PEFT's ±1/√in, so the adapters visibly move the logits.
            (t * 2.0).unwrap()
        };
        out.insert(name, t.to_dtype(dtype).unwrap());
    }
    out
}

fn loss(model: &Transformer) -> Tensor {
    let s = token_stats(model, &SEQS, 0.7, false).unwrap();
    let n = s.logprobs.dim(0).unwrap();
    let coef: Vec<f64> = (0..n).map(|i| ((i * 37 % 11) as f64 - 5.0) / 5.0).collect();
    let coef = Tensor::from_vec(coef, n, &Device::Cpu).unwrap();
    let a = (&s.logprobs * &coef).unwrap().sum_all().unwrap();
    let b = (&s.entropy * 0.3).unwrap().sum_all().unwrap();
    (a + b).unwrap()
}

/// Central differences (f64, h = 1e-5) of the entry with the largest gradient and two fixed
/// ones of every adapter matrix, with dropout on (a fixed mask seed), for each architecture.
/// Only adapters are variables; the count is the adapters'.
#[test]
fn adapter_gradients_match_finite_differences() {
    for arch in ARCHS {
        let cfg = ModelConfig::tiny(arch, 16);
        let base = sharp_weights(&cfg, 21, 10.0, DType::F64);
        let lcfg = lora_cfg(0.25);
        let ad = trained_adapters(&cfg, &lcfg, 3, DType::F64);
        let model =
            TrainableModel::with_lora(&cfg, &base, &lcfg, Some(&ad), 0, DType::F64, &Device::Cpu)
                .unwrap();
        let want: usize = lora::adapter_shapes(&cfg, &lcfg)
            .values()
            .map(|s| s.iter().product::<usize>())
            .sum();
        let counted: usize = model
            .vars()
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count())
            .sum();
        assert_eq!(counted, want, "{arch:?}: only the adapters are trained");
        assert_eq!(model.vars().len(), cfg.num_hidden_layers * 7 * 2);
        let train = |m: &TrainableModel| loss(&m.model().with_dropout_seed(9));
        // Dropout is on: the loss differs from the one without it.
        let with = train(&model).to_scalar::<f64>().unwrap();
        let without = loss(model.model()).to_scalar::<f64>().unwrap();
        assert!(
            (with - without).abs() > 1e-6,
            "{arch:?}: dropout had no effect"
        );
        let grads = train(&model).backward().unwrap();
        for (name, var) in model.vars() {
            let g: Vec<f64> = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{arch:?}: no gradient for {name}"))
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert!(
                g.iter().any(|x| x.abs() > 1e-10),
                "{arch:?}: zero gradient for {name}"
            );
            let orig: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            let shape = var.as_tensor().shape().clone();
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
                    train(&model).to_scalar::<f64>().unwrap()
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

/// PEFT's initialisation: `A` uniform within ±1/√in (spread like it: std ≈ bound/√3), `B`
/// zero, so a fresh adapter leaves every log-prob exactly as the base gives it.
#[test]
fn fresh_adapters_are_peft_initialised_and_change_nothing() {
    let cfg = ModelConfig::tiny(Arch::Qwen2, 16);
    let lcfg = LoraConfig::default();
    let ad = lora::init_adapters(&cfg, &lcfg, 1, DType::F64, &Device::Cpu).unwrap();
    for name in ad.names() {
        let t = &ad.tensors()[name];
        let v: Vec<f64> = t.flatten_all().unwrap().to_vec1().unwrap();
        if name.ends_with("lora_B.weight") {
            assert!(v.iter().all(|&x| x == 0.0), "{name}");
        } else {
            let bound = 1.0 / (t.dim(1).unwrap() as f64).sqrt();
            assert!(v.iter().all(|x| x.abs() <= bound), "{name}");
            let std = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
            assert!(
                (std / (bound / 3f64.sqrt()) - 1.0).abs() < 0.2,
                "{name}: std {std}"
            );
        }
    }
    let base = sharp_weights(&cfg, 4, 10.0, DType::F32);
    let plain = Transformer::from_weights(&cfg, &base, DType::F32, &Device::Cpu).unwrap();
    let m =
        TrainableModel::with_lora(&cfg, &base, &lcfg, None, 1, DType::F32, &Device::Cpu).unwrap();
    let a: Vec<f32> = token_stats(&plain, &SEQS, 1.0, false)
        .unwrap()
        .logprobs
        .to_vec1()
        .unwrap();
    let b: Vec<f32> = token_stats(m.model(), &SEQS, 1.0, false)
        .unwrap()
        .logprobs
        .to_vec1()
        .unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-6, "{x} vs {y}");
    }
}

/// Continuous batching with unmerged adapters: every sampled token's log-prob equals the
/// training forward's (f32, 1e-4), and the merged weights give the same logits.
#[test]
fn engine_with_adapters_matches_training_forward_and_merge() {
    for arch in ARCHS {
        let cfg = ModelConfig::tiny(arch, 64);
        let base = sharp_weights(&cfg, 11, 10.0, DType::F32);
        let lcfg = lora_cfg(0.0);
        let ad = trained_adapters(&cfg, &lcfg, 5, DType::F32);
        let trainable =
            TrainableModel::with_lora(&cfg, &base, &lcfg, Some(&ad), 0, DType::F32, &Device::Cpu)
                .unwrap();
        let model = Arc::new(trainable.snapshot().unwrap());
        let plain = Transformer::from_weights(&cfg, &base, DType::F32, &Device::Cpu).unwrap();
        let mut engine = Engine::new(
            Arc::clone(&model),
            PolicyVersion(0),
            EngineConfig {
                max_running_requests: 3,
                max_prefill_tokens: 16,
                threads: 1,
            },
        )
        .unwrap();
        let prompts: Vec<Vec<u32>> = (0..5u32)
            .map(|i| (0..(2 + i * 3)).map(|j| (j * 7 + i * 3) % 60 + 1).collect())
            .collect();
        for (i, p) in prompts.iter().enumerate() {
            engine
                .submit(EngineRequest {
                    id: RequestId(i as u64),
                    prompt: p.clone(),
                    params: SamplingParams {
                        max_new_tokens: 6 + i,
                        seed: Some(40 + i as u64),
                        ..Default::default()
                    },
                    resume: None,
                })
                .unwrap();
        }
        let done = engine.run_to_completion().unwrap();
        assert_eq!(done.len(), prompts.len());
        let mut moved = 0.0f32;
        for c in &done {
            let prompt = &prompts[c.id.0 as usize];
            let seq: Vec<u32> = prompt.iter().chain(&c.output.tokens).copied().collect();
            let lp: Vec<f32> = token_stats(trainable.model(), &[&seq], 1.0, false)
                .unwrap()
                .logprobs
                .to_vec1()
                .unwrap();
            let base_lp: Vec<f32> = token_stats(&plain, &[&seq], 1.0, false)
                .unwrap()
                .logprobs
                .to_vec1()
                .unwrap();
            for (i, &got) in c.output.logprobs.iter().enumerate() {
                let want = lp[prompt.len() + i];
                assert!(
                    (got - want).abs() < 1e-4,
                    "{arch:?} {}: token {i}: {got} vs {want}",
                    c.id
                );
                moved = moved.max((want - base_lp[prompt.len() + i]).abs());
            }
        }
        assert!(
            moved > 1e-2,
            "{arch:?}: the adapters do not change the log-probs"
        );
        let merged = model.merged_weights().unwrap();
        let merged = Transformer::from_weights(&cfg, &merged, DType::F32, &Device::Cpu).unwrap();
        let a = model.forward_logits(&prompts[4]).unwrap();
        let b = merged.forward_logits(&prompts[4]).unwrap();
        let diff = (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap();
        assert!(
            diff.to_scalar::<f32>().unwrap() < 1e-4,
            "{arch:?}: merged logits differ"
        );
    }
}

/// The snapshot copies the adapters (a later step does not show in it) and shares the base.
#[test]
fn snapshot_copies_adapters_only() {
    let cfg = ModelConfig::tiny(Arch::Llama, 16);
    let base = sharp_weights(&cfg, 2, 10.0, DType::F32);
    let lcfg = lora_cfg(0.0);
    let ad = trained_adapters(&cfg, &lcfg, 5, DType::F32);
    let m = TrainableModel::with_lora(&cfg, &base, &lcfg, Some(&ad), 0, DType::F32, &Device::Cpu)
        .unwrap();
    let snap = m.snapshot().unwrap();
    let (name, var) = &m.vars()[0];
    var.set(&var.as_tensor().zeros_like().unwrap()).unwrap();
    let kept = &snap.adapters().unwrap().weights.tensors()[name];
    assert!(
        kept.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            > 0.0
    );
    assert_eq!(snap.weights().max_abs_diff(&m.weights()).unwrap(), 0.0);
}

/// `adapter_config.json` has PEFT's fields; the saved tensors carry PEFT's names and load back
/// unchanged; bad settings are refused with the field named.
#[test]
fn peft_files_round_trip() {
    let cfg = ModelConfig::tiny(Arch::Qwen3, 16);
    let lcfg = LoraConfig {
        target_modules: vec!["q_proj".into(), "down_proj".into()],
        ..lora_cfg(0.1)
    };
    let ad = trained_adapters(&cfg, &lcfg, 2, DType::F32);
    let dir = tempfile::tempdir().unwrap();
    let adapters = Adapters {
        config: lcfg.clone(),
        weights: ad.clone(),
    };
    lora::save_peft(dir.path(), &adapters, "/models/base").unwrap();
    let text = std::fs::read_to_string(dir.path().join(lora::ADAPTER_CONFIG)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["peft_type"], "LORA");
    assert_eq!(v["task_type"], "CAUSAL_LM");
    assert_eq!(v["r"], 2);
    assert_eq!(v["lora_alpha"], 3.0);
    assert_eq!(v["lora_dropout"], 0.1);
    assert_eq!(v["bias"], "none");
    assert_eq!(v["fan_in_fan_out"], false);
    assert_eq!(v["use_rslora"], false);
    assert_eq!(v["base_model_name_or_path"], "/models/base");
    assert_eq!(
        v["target_modules"],
        serde_json::json!(["q_proj", "down_proj"])
    );
    let back = lora::load_peft(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(back.config, lcfg);
    assert_eq!(back.weights.max_abs_diff(&ad).unwrap(), 0.0);
    assert!(back
        .weights
        .contains("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
    assert_eq!(back.weights.names().len(), cfg.num_hidden_layers * 2 * 2);

    for (bad, field) in [
        (
            LoraConfig {
                rank: 0,
                ..lcfg.clone()
            },
            "train.lora.rank",
        ),
        (
            LoraConfig {
                alpha: -1.0,
                ..lcfg.clone()
            },
            "train.lora.alpha",
        ),
        (
            LoraConfig {
                dropout: 1.0,
                ..lcfg.clone()
            },
            "train.lora.dropout",
        ),
        (
            LoraConfig {
                target_modules: vec!["lm_head".into()],
                ..lcfg.clone()
            },
            "train.lora.target_modules",
        ),
    ] {
        let e = bad.validate("train.lora").unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
    }
}
