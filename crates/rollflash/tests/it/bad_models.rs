//! Bad model directories, in the library and through `rollflash serve --model`: an
//! unsupported tensor dtype, a truncated safetensors file and a `config.json` that is not
//! JSON each get an error naming the file or tensor, and the server refuses to start with
//! that message instead of crashing.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use candle_core::{DType, Device, Tensor};
use rollflash_model::config::ModelConfig;
use rollflash_model::hf::{load_dir, save_dir};
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;

fn good_dir(dir: &Path) {
    let tok = Tokenizer::builtin();
    let cfg = ModelConfig::builtin_default(tok.vocab_size(), tok.eos_token_id().unwrap());
    let w = Weights::random(&cfg, 1, DType::F32, &Device::Cpu).unwrap();
    save_dir(dir, &cfg, &w, Some(&tok)).unwrap();
}

/// The error `load_dir` gives, and the stderr of `rollflash serve --model dir` (which must
/// exit unsuccessfully, without a panic).
fn errors(dir: &Path) -> (String, String) {
    let lib = match load_dir(dir, DType::F32, &Device::Cpu) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(c) = src {
                s.push_str(": ");
                s.push_str(&c.to_string());
                src = c.source();
            }
            s
        }
    };
    let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args(["serve", "--port", "0", "--model"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve started on a bad model");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (lib, stderr)
}

#[test]
fn unsupported_dtype_is_named_with_its_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    good_dir(&dir);
    let file = dir.join("model.safetensors");
    let mut tensors: HashMap<String, Tensor> =
        candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    let name = "model.norm.weight".to_string();
    let shape = tensors[&name].dims().to_vec();
    tensors.insert(
        name.clone(),
        Tensor::zeros(shape, DType::I64, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&tensors, &file).unwrap();
    let (lib, cli) = errors(&dir);
    for e in [&lib, &cli] {
        assert!(e.contains(&name) && e.contains("I64"), "{e}");
    }
}

#[test]
fn truncated_weights_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    good_dir(&dir);
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let (lib, cli) = errors(&dir);
    for e in [&lib, &cli] {
        assert!(e.contains("model.safetensors"), "{e}");
    }
}

#[test]
fn config_that_is_not_json_names_the_file_and_position() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    good_dir(&dir);
    std::fs::write(dir.join("config.json"), "{\"hidden_size\": 64,,}").unwrap();
    let (lib, cli) = errors(&dir);
    for e in [&lib, &cli] {
        assert!(e.contains("config.json") && e.contains("line 1"), "{e}");
    }
}

/// `rollflash train --set model.path=` a directory that is not there: one message naming
/// the directory, said once (not again under "Caused by"), before any warm-up.
#[test]
fn a_model_path_that_does_not_exist_is_named_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model");
    let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args(["train", "--set"])
        .arg(format!("model.path={:?}", missing.display().to_string()))
        .args(["--set", "metrics.progress=false"])
        .arg("--set")
        .arg(format!(
            "output_dir={:?}",
            dir.path().join("run").display().to_string()
        ))
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shown = missing.display().to_string();
    assert!(stderr.contains("model directory"), "{stderr}");
    assert_eq!(stderr.matches(&shown).count(), 1, "said once: {stderr}");
    assert!(!stderr.contains("tokenizer"), "{stderr}");
    assert!(!stderr.contains("warm-up"), "{stderr}");
}
