//! Hugging Face model directories: load (`config.json`, safetensors — single or sharded —,
//! `tokenizer.json`, chat template) and save in the same layout.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rollflash_core::IoError;

use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::model::Transformer;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;
use crate::{ModelError, Result};

/// A model loaded from a directory, with its tokenizer and chat template when present.
#[derive(Debug)]
pub struct LoadedModel {
    pub config: ModelConfig,
    pub model: Transformer,
    pub tokenizer: Option<Tokenizer>,
    pub chat_template: Option<ChatTemplate>,
}

fn read_text(path: &Path, what: &'static str) -> Result<String> {
    if !path.exists() {
        return Err(ModelError::MissingFile {
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(std::fs::read_to_string(path).map_err(IoError::at("cannot read", path))?)
}

/// Reads `config.json` from a model directory.
pub fn load_config(dir: &Path) -> Result<ModelConfig> {
    if !dir.is_dir() {
        return Err(ModelError::MissingFile {
            path: dir.to_path_buf(),
            what: "model directory",
        });
    }
    let mut cfg = ModelConfig::from_hf_json(&read_text(
        &dir.join("config.json"),
        "model config (config.json)",
    )?)?;
    // Where `generate` reads its stop ids (Llama-3-Instruct lists `<|eot_id|>` only there).
    let gen = dir.join("generation_config.json");
    if gen.exists() {
        cfg.merge_generation_config(&read_text(
            &gen,
            "generation config (generation_config.json)",
        )?)?;
    }
    Ok(cfg)
}

/// The safetensors files of a directory: `model.safetensors`, or the shards listed in
/// `model.safetensors.index.json`.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        return Err(ModelError::MissingFile {
            path: single,
            what: "weights (model.safetensors or model.safetensors.index.json)",
        });
    }
    let text = read_text(&index, "weights index")?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: index.clone(),
        source,
    })?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::Config {
            field: "weight_map".into(),
            reason: format!("{} has no `weight_map` object", index.display()),
        })?;
    let mut files: Vec<String> = map
        .values()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect();
    files.sort();
    files.dedup();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// Loads the weights of a directory (in their stored dtypes).
pub fn load_weights(dir: &Path, device: &Device) -> Result<Weights> {
    Weights::load_safetensors(&weight_files(dir)?, device)
}

/// Loads config, weights, tokenizer and chat template from a Hugging Face directory.
pub fn load_dir(dir: &Path, dtype: DType, device: &Device) -> Result<LoadedModel> {
    let config = load_config(dir)?;
    let weights = load_weights(dir, device)?;
    let model = Transformer::from_weights(&config, &weights, dtype, device)?;
    let tokenizer = if dir.join("tokenizer.json").exists() {
        Some(Tokenizer::from_dir(dir)?)
    } else {
        None
    };
    let tc = dir.join("tokenizer_config.json");
    let chat_template = if tc.exists() {
        ChatTemplate::from_tokenizer_config(&tc)?
    } else {
        None
    };
    Ok(LoadedModel {
        config,
        model,
        tokenizer,
        chat_template,
    })
}

/// Writes `config.json` and `model.safetensors` (and the tokenizer, if given) so the directory
/// loads back with [`load_dir`] and with `transformers`.
pub fn save_dir(
    dir: &Path,
    config: &ModelConfig,
    weights: &Weights,
    tokenizer: Option<&Tokenizer>,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(IoError::at("cannot create", dir))?;
    let cfg_path = dir.join("config.json");
    let text =
        serde_json::to_string_pretty(&config.to_hf_json()).map_err(|source| ModelError::Json {
            path: cfg_path.clone(),
            source,
        })?;
    std::fs::write(&cfg_path, text).map_err(IoError::at("cannot write", &cfg_path))?;
    weights.save_safetensors(&dir.join("model.safetensors"))?;
    if let Some(t) = tokenizer {
        t.save(dir)?;
    }
    Ok(())
}
