//! A trained LoRA adapter, saved in PEFT's layout, loads with the real `peft` Python package
//! (`scripts/peft_check.py`: `transformers` + `peft.PeftModel.from_pretrained`, none of our
//! code) and gives our logits within 1e-4 (f32), for each family's reference checkpoint.
//! `scripts/setup_peft.sh` provides the Python (the cached vLLM venv plus peft, or the
//! project's `.venv`); the test skips, saying why, when that script cannot.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device, Tensor};
use rollflash_model::hf::load_dir;
use rollflash_model::lora::{self, LoraConfig};
use rollflash_model::train::{
    token_stats, AdamW, GradAccumulator, OptimizerConfig, TrainableModel,
};
use rollflash_model::weights::Weights;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A few AdamW steps of next-token loss on the adapters alone: a trained adapter, B non-zero.
fn train_adapter(dir: &Path, lcfg: &LoraConfig) -> TrainableModel {
    let loaded = load_dir(dir, DType::F32, &Device::Cpu).unwrap();
    let cfg = loaded.model.config().clone();
    let m = TrainableModel::with_lora(
        &cfg,
        &loaded.model.weights(),
        lcfg,
        None,
        17,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let mut opt = AdamW::new(OptimizerConfig {
        lr: 0.05,
        ..Default::default()
    });
    let seqs: [&[u32]; 2] = [&[1, 9, 30, 4, 17, 60, 2], &[5, 5, 40, 12, 33]];
    for _ in 0..4 {
        let s = token_stats(m.model(), &seqs, 1.0, false).unwrap();
        let loss = s.logprobs.sum_all().unwrap().neg().unwrap();
        let mut acc = GradAccumulator::default();
        acc.add(&m, &loss.backward().unwrap()).unwrap();
        opt.step(&m, &acc).unwrap();
    }
    m
}

#[test]
fn trained_adapter_loads_in_peft_with_the_same_logits() {
    let setup = Command::new(root().join("scripts/setup_peft.sh"))
        .output()
        .unwrap();
    if !setup.status.success() {
        eprintln!(
            "SKIPPED: peft check: scripts/setup_peft.sh could not provide transformers and peft:\n{}",
            String::from_utf8_lossy(&setup.stderr).trim()
        );
        return;
    }
    let py = PathBuf::from(String::from_utf8_lossy(&setup.stdout).trim());
    let lcfg = LoraConfig {
        rank: 4,
        alpha: 8.0,
        ..LoraConfig::default()
    };
    for family in ["llama", "qwen2", "qwen3"] {
        let base =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/ref_{family}"));
        let m = train_adapter(&base, &lcfg);
        let adapters = m.adapters().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        lora::save_peft(tmp.path(), adapters, &base.to_string_lossy()).unwrap();
        let tokens: Vec<u32> = vec![3, 14, 15, 9, 26, 53, 58, 9, 7, 32, 38, 46];
        let logits = m.snapshot().unwrap().forward_logits(&tokens).unwrap();
        let mut ours = Weights::default();
        let t: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
        ours.insert(
            "tokens",
            Tensor::from_vec(t, tokens.len(), &Device::Cpu).unwrap(),
        );
        ours.insert("logits", logits);
        let ours_path = tmp.path().join("ours.safetensors");
        ours.save_safetensors(&ours_path).unwrap();
        let out = Command::new(&py)
            .arg(root().join("scripts/peft_check.py"))
            .arg("--base")
            .arg(&base)
            .arg("--adapter")
            .arg(tmp.path())
            .arg("--ours")
            .arg(&ours_path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => eprintln!("{family}: {}", stdout.trim()),
            Some(77) => {
                eprintln!("SKIPPED peft check: {}", stdout.trim());
                return;
            }
            _ => panic!("{family}: peft_check.py failed:\n{stdout}\n{stderr}"),
        }
    }
}
