//! Text ↔ token ids: the built-in character tokenizer and Hugging Face `tokenizer.json` files,
//! with the special tokens (eos/bos/pad) that generation and padding need.
//!
//! The `tokenizers` crate stays behind [`Tokenizer`], so no other crate depends on its types.

use std::fs;
use std::path::Path;

use rollflash_core::IoError;
use serde_json::{json, Map, Value};

use crate::tokenizer_config::{builtin_tokenizer_config, config_token, read_tokenizer_config};
use crate::{ModelError, Result};

/// Id of `<pad>` in the built-in tokenizer.
const BUILTIN_PAD: u32 = 0;
/// Id of `<eos>` in the built-in tokenizer.
const BUILTIN_EOS: u32 = 1;
/// Id of `<bos>` in the built-in tokenizer.
const BUILTIN_BOS: u32 = 2;
/// Id of `<unk>` in the built-in tokenizer.
const BUILTIN_UNK: u32 = 3;
/// Id of `'\n'` in the built-in tokenizer.
const BUILTIN_NEWLINE: u32 = 4;
/// Id of `' '` (ASCII 32); the other printable characters follow in ASCII order.
const BUILTIN_FIRST_PRINTABLE: u32 = 5;
/// `<pad>`, `<eos>`, `<bos>`, `<unk>`, `'\n'` and the 95 printable ASCII characters.
const BUILTIN_VOCAB_SIZE: u32 = BUILTIN_FIRST_PRINTABLE + 95;

/// The built-in special tokens, by id.
const BUILTIN_SPECIALS: [(&str, u32); 4] = [
    ("<pad>", BUILTIN_PAD),
    ("<eos>", BUILTIN_EOS),
    ("<bos>", BUILTIN_BOS),
    ("<unk>", BUILTIN_UNK),
];

/// A tokenizer: the built-in character tokenizer or a Hugging Face one, plus its special tokens.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    /// Which implementation encodes and decodes.
    inner: Inner,
    /// Generation stops here; `None` when the checkpoint does not say.
    eos: Option<u32>,
    /// Prepended by some chat templates and by `encode(.., true)` for Llama-style tokenizers.
    bos: Option<u32>,
    /// Fills batches up to a common length.
    pad: Option<u32>,
    /// One more than the largest id, computed once because a Hugging Face vocabulary is large.
    vocab_size: usize,
    /// The `tokenizer_config.json` this tokenizer was loaded with, kept so that `save` writes back
    /// the chat template and the settings transformers reads, not only the special tokens.
    config: Option<Map<String, Value>>,
}

#[derive(Debug, Clone)]
enum Inner {
    Builtin,
    Hf(Box<tokenizers::Tokenizer>),
}

impl Tokenizer {
    /// The built-in character tokenizer for the built-in tasks (arithmetic word problems,
    /// FrozenLake/Sokoban grids, tool calls).
    ///
    /// Ids are fixed: `<pad>` = 0, `<eos>` = 1, `<bos>` = 2, `<unk>` = 3, `'\n'` = 4, then the
    /// printable ASCII characters `' '` (32) ..= `'~'` (126) as ids 5 ..= 99, in ASCII order (so
    /// `c` has id `c as u32 - 27`). The vocabulary has 100 tokens. Any other character encodes to
    /// `<unk>`, one per character, and the special token strings (`"<eos>"`, ...) appearing in
    /// text encode to their special ids, as a Hugging Face tokenizer does for added tokens.
    /// `encode(.., true)` prepends `<bos>`.
    pub fn builtin() -> Tokenizer {
        Tokenizer {
            inner: Inner::Builtin,
            eos: Some(BUILTIN_EOS),
            bos: Some(BUILTIN_BOS),
            pad: Some(BUILTIN_PAD),
            vocab_size: BUILTIN_VOCAB_SIZE as usize,
            config: None,
        }
    }

    /// Loads a Hugging Face `tokenizer.json`, without network access.
    ///
    /// A lone `tokenizer.json` does not say which tokens are eos/bos/pad, so those are `None`;
    /// use [`Tokenizer::from_dir`] to read them from `tokenizer_config.json`.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path: path.to_path_buf(),
                what: "Hugging Face tokenizer (tokenizer.json)",
            });
        }
        let bytes = fs::read(path).map_err(IoError::at("cannot read", path))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| ModelError::Tokenizer(format!("cannot load {}: {e}", path.display())))?;
        Ok(Tokenizer::from_hf_parts(inner, None, None, None))
    }

    /// Loads `dir/tokenizer.json`, and the special tokens from `dir/tokenizer_config.json` when
    /// that file exists (`eos_token`, `bos_token`, `pad_token`: a string, or an object with
    /// `content`). A special token that the config names but the vocabulary lacks is an error,
    /// because generation would otherwise never stop.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let mut tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let config_path = dir.join("tokenizer_config.json");
        if !config_path.is_file() {
            return Ok(tokenizer);
        }
        let config = read_tokenizer_config(&config_path)?;
        let resolve = |key: &str| -> Result<Option<u32>> {
            let Some(token) = config_token(&config, key) else {
                return Ok(None);
            };
            match tokenizer.token_to_id(&token) {
                Some(id) => Ok(Some(id)),
                None => Err(ModelError::Tokenizer(format!(
                    "{} names {key} `{token}`, which is not in the vocabulary",
                    config_path.display()
                ))),
            }
        };
        let (eos, bos, pad) = (
            resolve("eos_token")?,
            resolve("bos_token")?,
            resolve("pad_token")?,
        );
        tokenizer.eos = eos;
        tokenizer.bos = bos;
        tokenizer.pad = pad;
        tokenizer.config = Some(config);
        Ok(tokenizer)
    }

    /// Wraps a Hugging Face tokenizer built inside this crate (the GGUF converter builds one from
    /// GGUF metadata), keeping the `tokenizers` type out of the public API.
    pub(crate) fn from_hf_parts(
        inner: tokenizers::Tokenizer,
        eos: Option<u32>,
        bos: Option<u32>,
        pad: Option<u32>,
    ) -> Tokenizer {
        // Vocabularies may have holes (ids reserved by the model but without a token), so the
        // embedding size is the largest id plus one, not the number of tokens.
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&max| max as usize + 1);
        Tokenizer {
            inner: Inner::Hf(Box::new(inner)),
            eos,
            bos,
            pad,
            vocab_size,
            config: None,
        }
    }

    /// Encodes `text`; `add_special_tokens` adds what the tokenizer's post-processor adds (for
    /// the built-in tokenizer: a leading `<bos>`). Chat prompts rendered by a template already
    /// contain their special tokens and are encoded with `false`, as transformers does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        match &self.inner {
            Inner::Builtin => Ok(builtin_encode(text, add_special_tokens)),
            Inner::Hf(tok) => tok
                .encode(text, add_special_tokens)
                .map(|enc| enc.get_ids().to_vec())
                .map_err(|e| ModelError::Tokenizer(format!("cannot encode: {e}"))),
        }
    }

    /// Decodes `ids`, dropping special tokens when `skip_special_tokens` is set.
    ///
    /// Ids outside the vocabulary are skipped, as the Hugging Face tokenizer does: a model's
    /// embedding is often padded past the tokenizer's vocabulary and may sample such an id.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        match &self.inner {
            Inner::Builtin => Ok(builtin_decode(ids, skip_special_tokens)),
            Inner::Hf(tok) => tok
                .decode(ids, skip_special_tokens)
                .map_err(|e| ModelError::Tokenizer(format!("cannot decode: {e}"))),
        }
    }

    /// One more than the largest token id, added tokens included: the smallest embedding that
    /// can hold every token.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The end-of-sequence token, if known.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos
    }

    /// The beginning-of-sequence token, if known.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// The padding token, if known.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad
    }

    /// The id of a token given its string form (for the built-in tokenizer: a special token name
    /// or a single character).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.inner {
            Inner::Builtin => builtin_token_to_id(token),
            Inner::Hf(tok) => tok.token_to_id(token),
        }
    }

    /// The string form of a token id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.inner {
            Inner::Builtin => builtin_id_to_token(id),
            Inner::Hf(tok) => tok.id_to_token(id),
        }
    }

    /// Writes `dir/tokenizer.json` and `dir/tokenizer_config.json`, creating `dir` if needed, so
    /// that [`Tokenizer::from_dir`] (and Hugging Face `tokenizers`/`transformers`) load the same
    /// tokenizer back.
    ///
    /// The built-in tokenizer is written as a real Hugging Face tokenizer that gives the same ids:
    /// a `WordLevel` model over the characters, a pre-tokenizer that isolates every character,
    /// the special tokens as added tokens, a post-processor that prepends `<bos>`, and a `Fuse`
    /// decoder; its config carries the built-in chat template. A tokenizer loaded by `from_dir`
    /// writes back the config it was loaded with, special tokens updated.
    pub fn save(&self, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).map_err(IoError::at("cannot create", dir))?;
        let tokenizer_json = match &self.inner {
            Inner::Builtin => builtin_hf_tokenizer()?,
            Inner::Hf(tok) => tok
                .to_string(true)
                .map_err(|e| ModelError::Tokenizer(format!("cannot serialize: {e}")))?,
        };
        write_file(&dir.join("tokenizer.json"), tokenizer_json.as_bytes())?;

        let mut config = match (&self.inner, &self.config) {
            (_, Some(config)) => config.clone(),
            (Inner::Builtin, None) => builtin_tokenizer_config(),
            (Inner::Hf(_), None) => Map::new(),
        };
        for (key, id) in [
            ("eos_token", self.eos),
            ("bos_token", self.bos),
            ("pad_token", self.pad),
        ] {
            let token = id.and_then(|id| self.id_to_token(id));
            config.insert(key.to_string(), token.map_or(Value::Null, Value::String));
        }
        let path = dir.join("tokenizer_config.json");
        let text = serde_json::to_string_pretty(&config).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        write_file(&path, text.as_bytes())
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(fs::write(path, bytes).map_err(IoError::at("cannot write", path))?)
}

fn builtin_char_id(c: char) -> u32 {
    match c {
        '\n' => BUILTIN_NEWLINE,
        ' '..='~' => BUILTIN_FIRST_PRINTABLE + (c as u32 - ' ' as u32),
        _ => BUILTIN_UNK,
    }
}

fn builtin_id_char(id: u32) -> Option<char> {
    match id {
        BUILTIN_NEWLINE => Some('\n'),
        BUILTIN_FIRST_PRINTABLE..BUILTIN_VOCAB_SIZE => {
            char::from_u32(id - BUILTIN_FIRST_PRINTABLE + ' ' as u32)
        }
        _ => None,
    }
}

fn builtin_encode(text: &str, add_special_tokens: bool) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len() + 1);
    if add_special_tokens {
        ids.push(BUILTIN_BOS);
    }
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        // Special token strings in text are tokens of their own, as added tokens are in a Hugging
        // Face tokenizer; the saved `tokenizer.json` must give the same ids.
        let special = (c == '<')
            .then(|| BUILTIN_SPECIALS.iter().find(|(s, _)| rest.starts_with(s)))
            .flatten();
        if let Some((s, id)) = special {
            ids.push(*id);
            rest = &rest[s.len()..];
        } else {
            ids.push(builtin_char_id(c));
            rest = &rest[c.len_utf8()..];
        }
    }
    ids
}

fn builtin_decode(ids: &[u32], skip_special_tokens: bool) -> String {
    let mut text = String::with_capacity(ids.len());
    for &id in ids {
        if let Some(c) = builtin_id_char(id) {
            text.push(c);
        } else if let Some((s, _)) = BUILTIN_SPECIALS.iter().find(|(_, sid)| *sid == id) {
            if !skip_special_tokens {
                text.push_str(s);
            }
        }
    }
    text
}

fn builtin_token_to_id(token: &str) -> Option<u32> {
    if let Some((_, id)) = BUILTIN_SPECIALS.iter().find(|(s, _)| *s == token) {
        return Some(*id);
    }
    let mut chars = token.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => Some(builtin_char_id(c)).filter(|&id| id != BUILTIN_UNK),
        _ => None,
    }
}

fn builtin_id_to_token(id: u32) -> Option<String> {
    if let Some((s, _)) = BUILTIN_SPECIALS.iter().find(|(_, sid)| *sid == id) {
        return Some((*s).to_string());
    }
    builtin_id_char(id).map(String::from)
}

/// The built-in tokenizer as a Hugging Face `tokenizer.json`, validated by loading it back.
fn builtin_hf_tokenizer() -> Result<String> {
    let mut vocab = Map::new();
    for id in 0..BUILTIN_VOCAB_SIZE {
        if let Some(token) = builtin_id_to_token(id) {
            vocab.insert(token, json!(id));
        }
    }
    let added_tokens: Vec<Value> = BUILTIN_SPECIALS
        .iter()
        .map(|(content, id)| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true
            })
        })
        .collect();
    let bos = json!({"SpecialToken": {"id": "<bos>", "type_id": 0}});
    let bos1 = json!({"SpecialToken": {"id": "<bos>", "type_id": 1}});
    let a = json!({"Sequence": {"id": "A", "type_id": 0}});
    let b = json!({"Sequence": {"id": "B", "type_id": 1}});
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        // `[\s\S]` rather than `.` because `.` skips '\n' in both the Rust (fancy-regex) and the
        // Python (Oniguruma) regex engines.
        "pre_tokenizer": {
            "type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated",
            "invert": false
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, a],
            "pair": [bos, a, bos1, b],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [BUILTIN_BOS], "tokens": ["<bos>"]}}
        },
        // Without a decoder, decoding joins tokens with spaces.
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    let text = serde_json::to_string_pretty(&doc)
        .map_err(|e| ModelError::Tokenizer(format!("cannot serialize built-in tokenizer: {e}")))?;
    text.parse::<tokenizers::Tokenizer>().map_err(|e| {
        ModelError::Tokenizer(format!("built-in tokenizer.json does not load: {e}"))
    })?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_ids_are_the_documented_ones() {
        let tok = Tokenizer::builtin();
        assert_eq!(tok.vocab_size(), 100);
        assert_eq!(tok.token_to_id(" "), Some(5));
        assert_eq!(tok.token_to_id("~"), Some(99));
        assert_eq!(tok.token_to_id("A"), Some('A' as u32 - 27));
        assert_eq!(tok.token_to_id("\n"), Some(4));
        assert_eq!(tok.token_to_id("<unk>"), Some(3));
        assert_eq!(tok.token_to_id("\t"), None);
        assert_eq!(tok.id_to_token(100), None);
        for id in 0..100 {
            let token = tok.id_to_token(id);
            assert_eq!(token.and_then(|t| tok.token_to_id(&t)), Some(id));
        }
    }
}
