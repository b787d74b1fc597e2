//! `rollflash bench-engine --random-weights`: a directory holding only a `config.json`
//! measures seeded random weights of its shapes (what the GPU bundle sends for real models),
//! the very weights `Weights::random(cfg, 0)` builds; without the flag the missing weights
//! are named.

use std::path::Path;
use std::process::Command;

use candle_core::{DType, Device};
use rollflash_model::config::ModelConfig;
use rollflash_model::hf::save_dir;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;

/// The training forward's log-probs `bench-engine` writes for `dir`, with `extra` flags.
fn logprobs(dir: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .arg("bench-engine")
        .arg("--model")
        .arg(dir)
        .args(["--no-decode", "--train-seqs", "2", "--train-len", "16"])
        .args(["--threads", "1", "--logprobs-only", "--logprobs-out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn random_weights_come_from_the_config_alone_and_match_the_seeded_initialisation() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = Tokenizer::builtin();
    let cfg = ModelConfig::builtin_default(tok.vocab_size(), tok.eos_token_id().unwrap());
    // A full directory whose weights are Weights::random(cfg, 0) ...
    let full = tmp.path().join("full");
    let w = Weights::random(&cfg, 0, DType::F32, &Device::Cpu).unwrap();
    save_dir(&full, &cfg, &w, Some(&tok)).unwrap();
    // ... and the same config.json with nothing else.
    let shapes = tmp.path().join("shapes");
    std::fs::create_dir_all(&shapes).unwrap();
    std::fs::copy(full.join("config.json"), shapes.join("config.json")).unwrap();

    let (a, b) = (tmp.path().join("a.json"), tmp.path().join("b.json"));
    let o = logprobs(&full, &a, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = logprobs(&shapes, &b, &["--random-weights"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("random weights"), "{stdout}");

    let read = |p: &Path| -> Vec<f64> {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let (la, lb) = (read(&a), read(&b));
    // 2 sequences of 16 tokens: the forward's whole 2 x 16 grid of log-probs.
    assert_eq!(la.len(), 32);
    assert!(la.iter().all(|x| x.is_finite() && *x <= 0.0), "{la:?}");
    // Same seed, same shapes, same kernels: the same numbers (the saved file holds f32s).
    assert_eq!(la, lb);

    // Without the flag a config-only directory names what is missing.
    let o = logprobs(&shapes, &tmp.path().join("c.json"), &[]);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("model.safetensors"), "{stderr}");
}
