//! Hugging Face directories: each architecture round-trips (single file and sharded), and a
//! missing file, a shape mismatch or an unknown architecture gets an error that names it.

use candle_core::{DType, Device, Tensor};
use rollflash_model::config::ModelConfig;
use rollflash_model::hf::{load_dir, save_dir};
use rollflash_model::weights::Weights;
use rollflash_model::ModelError;

use crate::common::{sharp_weights, ARCHS};

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn every_architecture_round_trips() {
    for arch in ARCHS {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ModelConfig::tiny(arch, 32);
        let w = sharp_weights(&cfg, 3, 10.0, DType::F32);
        save_dir(dir.path(), &cfg, &w, None).unwrap();
        // Real HF names: spot-check the file's tensor names.
        let names =
            Weights::load_safetensors(&[dir.path().join("model.safetensors")], &Device::Cpu)
                .unwrap();
        assert!(names.contains("model.layers.1.mlp.down_proj.weight"));
        assert_eq!(names.contains("lm_head.weight"), !cfg.tie_word_embeddings);
        assert_eq!(
            names.contains("model.layers.0.self_attn.q_proj.bias"),
            cfg.attention_bias
        );
        assert_eq!(
            names.contains("model.layers.0.self_attn.k_norm.weight"),
            cfg.qk_norm
        );
        let loaded = load_dir(dir.path(), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(loaded.config, cfg);
        let orig =
            rollflash_model::model::Transformer::from_weights(&cfg, &w, DType::F32, &Device::Cpu)
                .unwrap();
        let toks = [1, 2, 3, 4, 5];
        let d = max_diff(
            &orig.forward_logits(&toks).unwrap(),
            &loaded.model.forward_logits(&toks).unwrap(),
        );
        assert!(d == 0.0, "{arch:?}: logits differ by {d}");
    }
}

#[test]
fn sharded_checkpoint_loads() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::tiny(ARCHS[0], 32);
    let w = sharp_weights(&cfg, 3, 10.0, DType::F32);
    save_dir(dir.path(), &cfg, &w, None).unwrap();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    // Split the tensors over two shards and write the index the way transformers does.
    let (mut a, mut b) = (Weights::default(), Weights::default());
    let mut map = serde_json::Map::new();
    for (i, name) in w.names().into_iter().enumerate() {
        let (shard, file) = if i % 2 == 0 {
            (&mut a, "model-00001-of-00002.safetensors")
        } else {
            (&mut b, "model-00002-of-00002.safetensors")
        };
        shard.insert(name, w.tensors()[name].clone());
        map.insert(name.to_string(), file.into());
    }
    a.save_safetensors(&dir.path().join("model-00001-of-00002.safetensors"))
        .unwrap();
    b.save_safetensors(&dir.path().join("model-00002-of-00002.safetensors"))
        .unwrap();
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let loaded = load_dir(dir.path(), DType::F32, &Device::Cpu).unwrap();
    let orig =
        rollflash_model::model::Transformer::from_weights(&cfg, &w, DType::F32, &Device::Cpu)
            .unwrap();
    assert_eq!(
        max_diff(
            &orig.forward_logits(&[3, 1]).unwrap(),
            &loaded.model.forward_logits(&[3, 1]).unwrap()
        ),
        0.0
    );
}

#[test]
fn clear_errors_for_bad_directories() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::tiny(ARCHS[1], 32);
    let w = sharp_weights(&cfg, 3, 10.0, DType::F32);

    // Not a directory at all.
    let err = load_dir(&dir.path().join("nope"), DType::F32, &Device::Cpu).unwrap_err();
    assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
    assert!(err.to_string().contains("nope"), "{err}");

    // No config.json.
    let err = load_dir(dir.path(), DType::F32, &Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");

    // No weights.
    save_dir(dir.path(), &cfg, &w, None).unwrap();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err = load_dir(dir.path(), DType::F32, &Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");

    // Shape mismatch: the config says a wider MLP than the weights have.
    save_dir(dir.path(), &cfg, &w, None).unwrap();
    let mut bigger = cfg.clone();
    bigger.intermediate_size += 8;
    std::fs::write(
        dir.path().join("config.json"),
        bigger.to_hf_json().to_string(),
    )
    .unwrap();
    let err = load_dir(dir.path(), DType::F32, &Device::Cpu).unwrap_err();
    match &err {
        ModelError::ShapeMismatch {
            name,
            expected,
            got,
        } => {
            assert!(name.contains("mlp"), "{name}");
            assert_ne!(expected, got);
        }
        other => panic!("expected a shape mismatch, got {other}"),
    }

    // Unsupported architecture.
    let mut j = cfg.to_hf_json();
    j["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
    std::fs::write(dir.path().join("config.json"), j.to_string()).unwrap();
    let err = load_dir(dir.path(), DType::F32, &Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("GPT2LMHeadModel"), "{err}");

    // A missing field is named.
    let mut j = cfg.to_hf_json();
    j.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(dir.path().join("config.json"), j.to_string()).unwrap();
    let err = load_dir(dir.path(), DType::F32, &Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("hidden_size"), "{err}");
}
