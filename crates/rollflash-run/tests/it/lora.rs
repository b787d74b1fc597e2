//! LoRA runs end to end: `[train.lora]` trains only adapters (the base in the checkpoint is
//! the starting weights bit for bit, the AdamW moments cover the adapters alone), checkpoints
//! carry PEFT's files, a resumed run ends with the adapters of the uninterrupted one, `final/`
//! is the merged model with the adapter beside it, and bad settings are refused by field.

use std::path::Path;

use candle_core::{DType, Device};
use rollflash_model::lora;
use rollflash_run::config::TrainConfig;
use rollflash_run::pipeline::{self, Resume, RunOptions};
use rollflash_run::plan::RunPlan;

use crate::tiny_run::{sync_sets, tiny_lake_sets};

fn cfg(dir: &Path, steps: usize, every: usize) -> TrainConfig {
    let mut sets = sync_sets(dir, steps, every);
    sets.extend([
        "train.lora.rank=4".into(),
        "train.lora.alpha=8".into(),
        "train.lr=1e-2".into(),
    ]);
    TrainConfig::load(None, &sets).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lora_run_trains_adapters_only_and_resumes_exactly() {
    const N: usize = 3;
    const K: usize = 1;
    let full = tempfile::tempdir().unwrap();
    let part = tempfile::tempdir().unwrap();
    let a = pipeline::run(cfg(full.path(), N, 0)).await.unwrap();
    assert_eq!(a.report.steps.len(), N);

    pipeline::run(cfg(part.path(), K, K)).await.unwrap();
    let ckpt = rollflash_run::checkpoint::latest(&part.path().join("checkpoints")).unwrap();
    for f in [
        lora::ADAPTER_CONFIG,
        lora::ADAPTER_WEIGHTS,
        "model.safetensors",
    ] {
        assert!(ckpt.join(f).exists(), "checkpoint lacks {f}");
    }
    let moments = rollflash_model::weights::Weights::load_safetensors(
        &[ckpt.join("optimizer.safetensors")],
        &Device::Cpu,
    )
    .unwrap();
    assert!(!moments.names().is_empty());
    for n in moments.names() {
        assert!(
            n.contains(".base_model.model.model.layers.") && n.contains(".lora_"),
            "{n}"
        );
    }
    // The checkpoint's base is the starting weights, unchanged.
    let c = cfg(part.path(), 1, 0);
    let tok = rollflash_model::tokenizer::Tokenizer::builtin();
    let mc = rollflash_model::config::ModelConfig::builtin_default(
        tok.vocab_size(),
        tok.eos_token_id().unwrap(),
    );
    let w0 =
        rollflash_model::weights::Weights::random(&mc, c.seed, DType::F32, &Device::Cpu).unwrap();
    let base = rollflash_model::hf::load_weights(&ckpt, &Device::Cpu).unwrap();
    assert_eq!(base.max_abs_diff(&w0).unwrap(), 0.0, "the base moved");
    let cfgjson: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join(lora::ADAPTER_CONFIG)).unwrap())
            .unwrap();
    assert_eq!(
        Path::new(cfgjson["base_model_name_or_path"].as_str().unwrap()),
        std::path::absolute(&ckpt).unwrap()
    );

    let b = pipeline::run_with(
        cfg(part.path(), N, K),
        RunOptions {
            resume: Some(Resume::Latest),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(b.report.steps.len(), N - K);
    let (fa, fb) = (full.path().join("final"), part.path().join("final"));
    let la = lora::load_peft(&fa.join("adapter"), &Device::Cpu).unwrap();
    let lb = lora::load_peft(&fb.join("adapter"), &Device::Cpu).unwrap();
    assert_eq!(
        la.weights.max_abs_diff(&lb.weights).unwrap(),
        0.0,
        "resumed adapters"
    );
    // The adapters were trained: B is no longer zero.
    let moved = la
        .weights
        .names()
        .iter()
        .filter(|n| n.ends_with("lora_B.weight"))
        .map(|n| {
            la.weights.tensors()[*n]
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        })
        .fold(0.0f32, f32::max);
    assert!(moved > 0.0, "B stayed zero");
    // final/ is the merged model; its adapter names final/base (the built-in base is saved).
    let merged = rollflash_model::hf::load_weights(&fa, &Device::Cpu).unwrap();
    let base_dir = fa.join("base");
    let fbase = rollflash_model::hf::load_weights(&base_dir, &Device::Cpu).unwrap();
    assert_eq!(fbase.max_abs_diff(&w0).unwrap(), 0.0);
    let want = la.merge_into(&mc, &fbase).unwrap();
    assert_eq!(merged.max_abs_diff(&want).unwrap(), 0.0);
    assert!(merged.max_abs_diff(&w0).unwrap() > 0.0);
}

#[test]
fn lora_settings_are_checked_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    for (set, field) in [
        ("train.lora.rank=0", "train.lora.rank"),
        ("train.lora.dropout=1.5", "train.lora.dropout"),
        ("train.lora.alpha=0", "train.lora.alpha"),
        (
            "train.lora.target_modules=[\"lm_head\"]",
            "train.lora.target_modules",
        ),
    ] {
        let mut sets = tiny_lake_sets(dir.path());
        sets.push(set.into());
        let e = TrainConfig::load(None, &sets)
            .map_err(|e| e.to_string())
            .and_then(|c| RunPlan::new(c).map(|_| ()).map_err(|e| e.to_string()))
            .unwrap_err();
        assert!(e.contains(field), "{set}: {e}");
    }
    let mut sets = tiny_lake_sets(dir.path());
    sets.push("train.lora.rank=16".into());
    let c = TrainConfig::load(None, &sets).unwrap();
    let l = c.train.lora.clone().unwrap();
    assert_eq!((l.rank, l.alpha, l.dropout), (16, 8.0, 0.0));
    assert_eq!(l.target_modules.len(), 7);
    let toml = c.to_toml().unwrap();
    assert!(toml.contains("[train.lora]"), "{toml}");
    let plan = RunPlan::new(c).unwrap();
    assert!(plan
        .describe()
        .iter()
        .any(|l| l.contains("LoRA adapters (PEFT), rank 16")));
    let plain =
        RunPlan::new(TrainConfig::load(None, &tiny_lake_sets(dir.path())).unwrap()).unwrap();
    assert!(plain
        .describe()
        .iter()
        .any(|l| l.contains("full fine-tuning")));
}
