//! Model hyper-parameters: our `ModelConfig`, and parsing of Hugging Face `config.json`.

use serde::{Deserialize, Serialize};

use crate::{ModelError, Result};

/// Which family of decoder-only transformer the weights belong to. The families differ only in
/// small details, so one implementation serves all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Llama / SmolLM / Mistral-style: no biases, no q/k norm.
    Llama,
    /// Qwen2 / Qwen2.5: biases on the q, k and v projections.
    Qwen2,
    /// Qwen3: RMSNorm over each head of q and k before the rotary embedding, no biases.
    Qwen3,
}

impl Arch {
    /// The `architectures[0]` string Hugging Face writes for this family.
    pub fn hf_name(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// The `model_type` string Hugging Face writes for this family.
    pub fn hf_model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }

    fn from_hf(architectures: Option<&[String]>, model_type: Option<&str>) -> Result<Self> {
        let first = architectures.and_then(|a| a.first()).map(String::as_str);
        match (first, model_type) {
            (Some("LlamaForCausalLM" | "MistralForCausalLM"), _) => Ok(Arch::Llama),
            (Some("Qwen2ForCausalLM"), _) => Ok(Arch::Qwen2),
            (Some("Qwen3ForCausalLM"), _) => Ok(Arch::Qwen3),
            (Some(other), _) => Err(ModelError::UnsupportedArchitecture(other.to_string())),
            (None, Some("llama" | "mistral")) => Ok(Arch::Llama),
            (None, Some("qwen2")) => Ok(Arch::Qwen2),
            (None, Some("qwen3")) => Ok(Arch::Qwen3),
            (None, Some(other)) => Err(ModelError::UnsupportedArchitecture(other.to_string())),
            (None, None) => Err(ModelError::Config {
                field: "architectures".into(),
                reason: "neither `architectures` nor `model_type` is set".into(),
            }),
        }
    }
}

/// Everything the forward pass needs to know about the shapes and numerics of a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Fewer than `num_attention_heads` means grouped-query attention.
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    /// When true there is no `lm_head.weight`: the output projection reuses the embedding.
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v projections (Qwen2).
    pub attention_bias: bool,
    /// Per-head RMSNorm on q and k (Qwen3).
    pub qk_norm: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// The subset of a Hugging Face `config.json` we read. Unknown keys are ignored on purpose:
/// real configs carry dozens of fields that do not affect the forward pass.
#[derive(Debug, Deserialize)]
struct HfConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    bos_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
    rope_scaling: Option<serde_json::Value>,
    hidden_act: Option<String>,
}

fn need<T>(v: Option<T>, field: &str) -> Result<T> {
    v.ok_or_else(|| ModelError::Config {
        field: field.to_string(),
        reason: "missing".into(),
    })
}

fn token_ids(v: &Option<serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|x| vec![x as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => Vec::new(),
    }
}

impl ModelConfig {
    /// The token ids generation stops on — the one rule every command uses (`train`, `eval`,
    /// `serve`, `generate`, calibration): every end-of-sequence id the model lists
    /// (`config.json`'s `eos_token_id`, with `generation_config.json`'s merged in by
    /// [`crate::hf::load_config`]), then the tokenizer's own end-of-sequence token. A chat
    /// model's turn often ends in an id other than the tokenizer's (Llama-3-Instruct's
    /// `<|eot_id|>`), which is why the tokenizer's alone is not enough; transformers' and
    /// vLLM's `generate` stop on the same set.
    pub fn stop_tokens(&self, tokenizer: Option<&crate::tokenizer::Tokenizer>) -> Vec<u32> {
        let mut ids = self.eos_token_ids.clone();
        ids.extend(tokenizer.and_then(crate::tokenizer::Tokenizer::eos_token_id));
        let mut seen = std::collections::HashSet::new();
        ids.retain(|id| seen.insert(*id));
        ids
    }

    /// Adds the end-of-sequence ids of a `generation_config.json` text (where
    /// transformers' and vLLM's `generate` read them) to [`ModelConfig::eos_token_ids`], after
    /// `config.json`'s own.
    pub fn merge_generation_config(&mut self, text: &str) -> Result<()> {
        #[derive(Deserialize)]
        struct Gen {
            eos_token_id: Option<serde_json::Value>,
        }
        let g: Gen = serde_json::from_str(text).map_err(|e| ModelError::Config {
            field: "generation_config.json".into(),
            reason: e.to_string(),
        })?;
        for id in token_ids(&g.eos_token_id) {
            if !self.eos_token_ids.contains(&id) {
                self.eos_token_ids.push(id);
            }
        }
        Ok(())
    }

    /// Parses a Hugging Face `config.json` text.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let hf: HfConfig = serde_json::from_str(text).map_err(|e| ModelError::Config {
            field: "config.json".into(),
            reason: e.to_string(),
        })?;
        let arch = Arch::from_hf(hf.architectures.as_deref(), hf.model_type.as_deref())?;
        if let Some(act) = &hf.hidden_act {
            if act != "silu" {
                return Err(ModelError::Config {
                    field: "hidden_act".into(),
                    reason: format!("`{act}` is not supported (only `silu`)"),
                });
            }
        }
        if let Some(s) = &hf.rope_scaling {
            if !s.is_null() {
                return Err(ModelError::Config {
                    field: "rope_scaling".into(),
                    reason: "rope scaling is not supported".into(),
                });
            }
        }
        let hidden_size = need(hf.hidden_size, "hidden_size")?;
        let num_attention_heads = need(hf.num_attention_heads, "num_attention_heads")?;
        let cfg = ModelConfig {
            arch,
            vocab_size: need(hf.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(hf.intermediate_size, "intermediate_size")?,
            num_hidden_layers: need(hf.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: hf.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim: hf
                .head_dim
                .unwrap_or(hidden_size / num_attention_heads.max(1)),
            rms_norm_eps: hf.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: hf.rope_theta.unwrap_or(10_000.0),
            max_position_embeddings: hf.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            attention_bias: hf.attention_bias.unwrap_or(matches!(arch, Arch::Qwen2)),
            qk_norm: matches!(arch, Arch::Qwen3),
            bos_token_id: token_ids(&hf.bos_token_id).first().copied(),
            eos_token_ids: token_ids(&hf.eos_token_id),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Renders the config as a Hugging Face `config.json` value, so checkpoints we write load
    /// in `transformers` too.
    pub fn to_hf_json(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": [self.arch.hf_name()],
            "model_type": self.arch.hf_model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids,
            "torch_dtype": "float32",
        })
    }

    /// Checks that the numbers fit together; errors name the offending field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, reason: String| {
            Err(ModelError::Config {
                field: field.into(),
                reason,
            })
        };
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return bad(field, "must be positive".into());
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return bad(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads = {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad("head_dim", "must be even for rotary embeddings".into());
        }
        if !(self.rms_norm_eps > 0.0) {
            return bad("rms_norm_eps", "must be positive".into());
        }
        if !(self.rope_theta > 0.0) {
            return bad("rope_theta", "must be positive".into());
        }
        Ok(())
    }

    /// A tiny model of the given family, for tests: small enough for finite differences.
    pub fn tiny(arch: Arch, vocab_size: usize) -> Self {
        ModelConfig {
            arch,
            vocab_size,
            hidden_size: 16,
            intermediate_size: 24,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 4,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            max_position_embeddings: 256,
            tie_word_embeddings: matches!(arch, Arch::Qwen3),
            attention_bias: matches!(arch, Arch::Qwen2),
            qk_norm: matches!(arch, Arch::Qwen3),
            bos_token_id: None,
            eos_token_ids: Vec::new(),
        }
    }

    /// The built-in default policy: a Qwen3-shaped model of about 2 M parameters, sized so that
    /// RL on the built-in tasks runs in minutes on two CPU cores.
    pub fn builtin_default(vocab_size: usize, eos_token_id: u32) -> Self {
        ModelConfig {
            arch: Arch::Qwen3,
            vocab_size,
            hidden_size: 192,
            intermediate_size: 512,
            num_hidden_layers: 4,
            num_attention_heads: 6,
            num_key_value_heads: 2,
            head_dim: 32,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            max_position_embeddings: 512,
            tie_word_embeddings: true,
            attention_bias: false,
            qk_norm: true,
            bos_token_id: None,
            eos_token_ids: vec![eos_token_id],
        }
    }

    /// Total number of parameters.
    pub fn num_parameters(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let mut attn = h * q + 2 * h * kv + q * h;
        if self.attention_bias {
            attn += q + 2 * kv;
        }
        if self.qk_norm {
            attn += 2 * self.head_dim;
        }
        let mlp = 3 * h * self.intermediate_size;
        let layer = attn + mlp + 2 * h;
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        embed + head + self.num_hidden_layers * layer + h
    }
}
