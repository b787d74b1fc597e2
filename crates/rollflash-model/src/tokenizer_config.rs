//! `tokenizer_config.json`: reading it, the special tokens it names, and the built-in
//! tokenizer's config with its chat template.
//!
//! Both the tokenizer (special tokens, `save`) and chat templates (`chat_template`, bos/eos) read
//! this file; keeping it here lets neither of those modules depend on the other.

use std::fs;
use std::path::Path;

use rollflash_core::IoError;
use serde_json::{json, Map, Value};

use crate::{ModelError, Result};

/// The chat template of the built-in model and tokenizer.
///
/// Plain text in the built-in tokenizer's characters: every message is `<|ROLE|>` on its own line,
/// then the content and a newline; assistant contents end with the eos token (`<eos>`) right
/// before that newline, so the model learns to stop. The generation prompt is `<|assistant|>\n`.
/// A system + user conversation renders as
/// `"<|system|>\nSYSTEM\n<|user|>\nUSER\n<|assistant|>\n"`.
pub const BUILTIN_CHAT_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|' + message.role + '|>\\n' + message.content }}\
{% if message.role == 'assistant' %}{{ eos_token }}{% endif %}\
{{ '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";

/// Reads `tokenizer_config.json` as a JSON object.
pub(crate) fn read_tokenizer_config(path: &Path) -> Result<Map<String, Value>> {
    if !path.is_file() {
        return Err(ModelError::MissingFile {
            path: path.to_path_buf(),
            what: "tokenizer config (tokenizer_config.json)",
        });
    }
    let text = fs::read_to_string(path).map_err(IoError::at("cannot read", path))?;
    let value: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ModelError::Tokenizer(format!(
            "{} is not a JSON object",
            path.display()
        ))),
    }
}

/// A special token named in `tokenizer_config.json`: transformers writes either the string or
/// an `AddedToken` object with a `content` field.
pub(crate) fn config_token(config: &Map<String, Value>, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(obj) => obj.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The `tokenizer_config.json` of the built-in tokenizer, as transformers reads it.
pub(crate) fn builtin_tokenizer_config() -> Map<String, Value> {
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        // transformers would otherwise rewrite " ." to "." and the like when decoding.
        "clean_up_tokenization_spaces": false,
        "chat_template": BUILTIN_CHAT_TEMPLATE,
    });
    match config {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}
