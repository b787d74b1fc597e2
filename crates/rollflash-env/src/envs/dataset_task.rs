//! The dataset task: single-turn prompts from the user's JSONL or Parquet files, scored by the math verifier or the countdown check, with a held-out split for evaluation.
//!
//! **Rows.** A prompt is a string field (optionally through a `{field}` template) or a
//! conversation field (`[{"role", "content"}]`), with an optional per-row system text and id.
//! **Rewards**: the math verifier on the answer marked by a listed `extract` rule, or the
//! countdown check (`reward = "countdown"`), plus an optional weighted format reward.
//!
//! **Rows for seeds.** A task seed below [`HELD_OUT_SEED_BASE`] is a training task:
//! position `p = seed - seed_origin` falls in epoch `p / L` at offset `p % L`, where `L` is
//! the epoch length (every training row once when all weights are 1). Each epoch is a fresh
//! permutation seeded by `(shuffle_seed, epoch)`, so `L` consecutive seeds from the origin
//! give `L` distinct rows, and the row of a seed is a pure function of the seed: a resumed
//! run that continues with the next task seed continues with the next unseen row.
//! `rollflash train` sets `seed_origin` to its first task seed. A seed at or above
//! [`HELD_OUT_SEED_BASE`] (where `rollflash train`'s evaluation starts) is held-out row
//! `(seed - HELD_OUT_SEED_BASE) mod H`, in file order; held-out rows are never in an epoch.
//!
//! **Mixtures.** Each training file has a `weight`: the fraction of its rows an epoch holds
//! (open-instruct's `dataset_mixer` convention). `2.0` puts every row in each epoch twice,
//! `0.5` a seeded half that changes with the epoch.
//!
//! **Loading** happens once per configuration, in [`DatasetTaskConfig::validate`] (called when a
//! run's config is loaded, before any model), and is shared by every environment built from
//! clones of that configuration, since `make_env` runs once per trajectory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use crate::dataset::{CursorMismatch, DataError};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::dataset::{
    prompt_messages, seeded_rng, uniform_below, DatasetConfig, DatasetFormat, PromptMessage,
    Record, RowRef, DEFAULT_MAX_ROW_BYTES,
};
use crate::env::{Env, EnvError, Reset, Step};
use crate::envs::config_error;
use crate::verify::math::{extract_answer, reference_answer, Rule};
use crate::verify::{CountdownVerifier, FormatVerifier, MathVerifier, Reward, Verifier};

/// The first held-out task seed; `rollflash train` evaluates on `HELD_OUT_SEED_BASE + i`.
pub const HELD_OUT_SEED_BASE: u64 = 1 << 40;

/// Training seeds must stay this far below [`HELD_OUT_SEED_BASE`]: room for 2^32 groups.
const TRAIN_SEED_ROOM: u64 = 1 << 32;

/// Stream tags: the split, the per-source subsets and the epoch shuffle never share a stream.
const SPLIT_STREAM: u64 = 0x0053_504c_4954_5f5f;
const SUBSET_STREAM: u64 = 0x0053_5542_5345_545f;
const EPOCH_STREAM: u64 = 0x0045_504f_4348_5f5f;

/// One data file of a dataset task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataFile {
    /// The file (relative paths are relative to the working directory).
    pub path: PathBuf,
    /// Fraction of the file's rows each epoch holds (training files only; see the module docs).
    #[serde(default = "one")]
    pub weight: f64,
    /// The format; `None` detects it from the extension (`.jsonl`, `.parquet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<DatasetFormat>,
}

fn one() -> f64 {
    1.0
}

impl DataFile {
    /// The file at `path`, weight 1.
    pub fn new(path: impl Into<PathBuf>) -> DataFile {
        DataFile {
            path: path.into(),
            weight: 1.0,
            format: None,
        }
    }
}

/// A way the final answer may be marked, in [`MathVerifier`]'s names (`crate::verify::math`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerRule {
    /// `\boxed{…}`.
    Boxed,
    /// `<answer>…</answer>`.
    #[serde(alias = "<answer>")]
    AnswerTag,
    /// `#### …` (GSM8K).
    #[serde(alias = "####")]
    Hashes,
    /// "the answer is …".
    AnswerIs,
    /// The last number in the response, when the response ends like a finished answer.
    LastNumber,
}

impl AnswerRule {
    fn matches(self, rule: Rule) -> bool {
        matches!(
            (self, rule),
            (AnswerRule::Boxed, Rule::Boxed)
                | (AnswerRule::AnswerTag, Rule::AnswerTag)
                | (AnswerRule::Hashes, Rule::Hashes)
                | (AnswerRule::AnswerIs, Rule::AnswerIs)
                | (AnswerRule::LastNumber, Rule::LastNumber)
        )
    }
}

/// What a response is scored by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetReward {
    /// [`MathVerifier`]: the answer marked by a rule of `extract`, equivalent to the
    /// reference answer.
    #[default]
    Math,
    /// The countdown game ([`CountdownVerifier`]): the response's `<answer>…</answer>` (else
    /// its last `\boxed{…}`) is an expression that uses each of the row's numbers (the
    /// `numbers` field) exactly once and equals the target (the `answer` field). `extract`
    /// does not apply.
    Countdown,
}

fn default_rules() -> Vec<AnswerRule> {
    vec![
        AnswerRule::Boxed,
        AnswerRule::AnswerTag,
        AnswerRule::Hashes,
        AnswerRule::AnswerIs,
    ]
}
fn default_prompt() -> String {
    "prompt".into()
}
fn default_answer() -> String {
    "answer".into()
}
fn default_max_row_bytes() -> usize {
    DEFAULT_MAX_ROW_BYTES
}

/// The loaded data, shared by clones of a config, with the config it was loaded for (a clone
/// changed afterwards loads its own). Not part of the config's value: equality and
/// serialisation ignore it.
#[derive(Clone, Default)]
pub struct DataCache(Arc<Mutex<Option<Loaded>>>);

/// A load and the config (without its origin) it was made for.
type Loaded = (Box<DatasetTaskConfig>, Arc<LoadedData>);

impl std::fmt::Debug for DataCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let loaded = self.0.lock().map(|g| g.is_some()).unwrap_or(false);
        f.debug_struct("DataCache")
            .field("loaded", &loaded)
            .finish()
    }
}

impl PartialEq for DataCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Settings of the dataset task (`env.name = "dataset"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetTaskConfig {
    /// Training files, with mixture weights.
    pub files: Vec<DataFile>,
    /// Held-out files for evaluation (weights do not apply). Exclusive with `heldout_fraction`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub heldout: Vec<DataFile>,
    /// Fraction of each training file held out (a seeded choice by `shuffle_seed`), in
    /// `[0, 1)`; 0 = none. Exclusive with `heldout`.
    #[serde(default)]
    pub heldout_fraction: f64,
    /// Field holding the prompt (a string).
    #[serde(default = "default_prompt")]
    pub prompt: String,
    /// Field holding the prompt as a conversation, `[{"role", "content"}]` (roles `system`,
    /// `user`, `assistant`, `tool`; the last one the user's), used instead of `prompt`. It is
    /// rendered through the model's chat template as it is; without one, the contents a blank
    /// line apart. Exclusive with `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<String>,
    /// Field holding the reference answer (a string or number; a worked solution ending in
    /// `#### 72` or holding `\boxed{…}` works as is).
    #[serde(default = "default_answer")]
    pub answer: String,
    /// Field holding a per-row system text, put before the prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Field holding a row id, reported in the step's info (else `file:line`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The prompt, with `{field}` replaced by the row's field (`{{` and `}}` for literal
    /// braces; a brace not around a field name, as in `\boxed{}`, is literal). `None`: the
    /// prompt field as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// How an answer may be marked to count: [`MathVerifier`] finds the final answer by the
    /// first of its rules that matches (boxed, answer tag, `####`, "answer is", last number);
    /// the answer earns credit only when that rule is listed here.
    #[serde(default = "default_rules")]
    pub extract: Vec<AnswerRule>,
    /// Weight of the `<think>…</think><answer>…</answer>` format reward added to the
    /// answer's; 0 = none.
    #[serde(default)]
    pub format_weight: f64,
    /// What scores a response: `math` (the default) or `countdown`.
    #[serde(default)]
    pub reward: DatasetReward,
    /// With `reward = "countdown"`: the field holding the numbers to use (a list of integers,
    /// or a string of them separated by commas or spaces); `None` = `numbers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numbers: Option<String>,
    /// Seed of the epoch shuffles, the mixture subsets and the held-out fraction.
    #[serde(default)]
    pub shuffle_seed: u64,
    /// The task seed of epoch 0's first row. `rollflash train` sets it to its first task
    /// seed; elsewhere 0.
    #[serde(default)]
    pub seed_origin: u64,
    /// Largest row accepted, in bytes.
    #[serde(default = "default_max_row_bytes")]
    pub max_row_bytes: usize,
    #[serde(skip)]
    cache: DataCache,
}

impl DatasetTaskConfig {
    /// A task over `files` with default fields (`prompt`, `answer`) and no held-out split.
    pub fn new(files: Vec<DataFile>) -> DatasetTaskConfig {
        DatasetTaskConfig {
            files,
            heldout: Vec::new(),
            heldout_fraction: 0.0,
            prompt: default_prompt(),
            messages: None,
            answer: default_answer(),
            system: None,
            id: None,
            template: None,
            extract: default_rules(),
            format_weight: 0.0,
            reward: DatasetReward::Math,
            numbers: None,
            shuffle_seed: 0,
            seed_origin: 0,
            max_row_bytes: default_max_row_bytes(),
            cache: DataCache::default(),
        }
    }

    /// Checks the values, then loads and checks every row (once; clones share the result).
    /// Errors name the field, or the file, row and field.
    pub fn validate(&self) -> Result<(), EnvError> {
        self.data().map(|_| ())
    }

    fn check_values(&self) -> Result<(), EnvError> {
        if self.files.is_empty() {
            return Err(config_error("files", "needs at least one file"));
        }
        for (i, f) in self.files.iter().enumerate() {
            if !(f.weight.is_finite() && f.weight > 0.0) {
                return Err(config_error(
                    &format!("files[{i}].weight"),
                    format!("must be positive and finite, got {}", f.weight),
                ));
            }
        }
        for (i, f) in self.heldout.iter().enumerate() {
            if f.weight != 1.0 {
                return Err(config_error(
                    &format!("heldout[{i}].weight"),
                    "weights apply to training files only",
                ));
            }
        }
        if !(0.0..1.0).contains(&self.heldout_fraction) {
            return Err(config_error(
                "heldout_fraction",
                format!("must be in [0, 1), got {}", self.heldout_fraction),
            ));
        }
        if !self.heldout.is_empty() && self.heldout_fraction > 0.0 {
            return Err(config_error(
                "heldout_fraction",
                "set either `heldout` files or `heldout_fraction`, not both",
            ));
        }
        let fields = [
            ("prompt", Some(&self.prompt)),
            ("answer", Some(&self.answer)),
            ("messages", self.messages.as_ref()),
            ("system", self.system.as_ref()),
            ("id", self.id.as_ref()),
        ];
        for (name, value) in fields {
            if value.is_some_and(|v| v.is_empty()) {
                return Err(config_error(name, "must not be empty"));
            }
        }
        if self.messages.is_some() && self.template.is_some() {
            return Err(config_error(
                "template",
                "a template renders a string prompt; with `messages` the conversation is the prompt (unset one of them)",
            ));
        }
        for (name, value) in &fields[2..] {
            if value.is_some_and(|v| *v == self.prompt || *v == self.answer) {
                return Err(config_error(name, "must differ from `prompt` and `answer`"));
            }
        }
        if self.numbers.is_some() && self.reward != DatasetReward::Countdown {
            return Err(config_error(
                "numbers",
                "is the countdown reward's field; set reward = \"countdown\" or unset it",
            ));
        }
        if self.extract.is_empty() {
            return Err(config_error("extract", "needs at least one rule"));
        }
        if !(self.format_weight.is_finite() && self.format_weight >= 0.0) {
            return Err(config_error(
                "format_weight",
                format!(
                    "must be finite and non-negative, got {}",
                    self.format_weight
                ),
            ));
        }
        if self.seed_origin >= HELD_OUT_SEED_BASE - TRAIN_SEED_ROOM {
            return Err(config_error(
                "seed_origin",
                format!(
                    "{} would reach the held-out seeds from {HELD_OUT_SEED_BASE}; use a smaller run seed",
                    self.seed_origin
                ),
            ));
        }
        Ok(())
    }

    /// The loaded data: from the shared cache, or loaded now.
    fn data(&self) -> Result<Arc<LoadedData>, EnvError> {
        self.check_values()?;
        let mut slot = self
            .cache
            .0
            .lock()
            .map_err(|_| EnvError::Failed("dataset cache poisoned by a panic".into()))?;
        // The origin only shifts the walk (`DatasetEnv` applies it), so a run that sets it
        // after validating does not load the files again.
        let mut key = self.clone();
        key.seed_origin = 0;
        key.cache = DataCache::default();
        if let Some((loaded_for, d)) = slot.as_ref() {
            if **loaded_for == key {
                return Ok(Arc::clone(d));
            }
        }
        let d = Arc::new(LoadedData::load(self)?);
        *slot = Some((Box::new(key), Arc::clone(&d)));
        Ok(d)
    }
}

/// One prepared row.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRow {
    /// The observation as plain text (for models without a chat template): system text (if
    /// any), a blank line, and the rendered prompt; for a conversation, its contents a blank
    /// line apart.
    pub prompt: String,
    /// The same prompt as chat messages (the system text as a system message), what a chat
    /// template renders; `Reset::info["messages"]` carries it (see
    /// [`crate::env::PROMPT_MESSAGES`]).
    pub messages: Vec<PromptMessage>,
    /// The reference answer, as in the file.
    pub answer: String,
    /// The row's id field, or `file:line`.
    pub id: String,
    /// The file the row is from.
    pub file: PathBuf,
    /// Where in it.
    pub at: RowRef,
}

/// A piece of a parsed template.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Field(String),
}

/// Splits a template into text and `{field}` pieces (see [`DatasetTaskConfig::template`]).
fn parse_template(t: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = t;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("{{") || rest.starts_with("}}") {
            text.push(c);
            rest = &rest[2..];
            continue;
        }
        if c == '{' {
            let body = &rest[1..];
            let name_len = body
                .find(|ch: char| {
                    !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '-' || ch == '.')
                })
                .unwrap_or(body.len());
            let name = &body[..name_len];
            let is_name = name.starts_with(|ch: char| ch.is_ascii_alphabetic() || ch == '_');
            if is_name && body[name_len..].starts_with('}') {
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Field(name.to_string()));
                rest = &body[name_len + 1..];
                continue;
            }
        }
        text.push(c);
        rest = &rest[c.len_utf8()..];
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    pieces
}

/// Renders `template` with `fields`; `Err(name)` for the first field it lacks. Strings are
/// inserted as they are, numbers and booleans as JSON writes them; anything else is `Err`
/// with the field's JSON type in the second position.
pub fn render_template(
    template: &str,
    fields: &Map<String, Value>,
) -> Result<String, (String, Option<&'static str>)> {
    let mut out = String::new();
    for piece in parse_template(template) {
        match piece {
            Piece::Text(t) => out.push_str(&t),
            Piece::Field(name) => match fields.get(&name) {
                Some(Value::String(s)) => out.push_str(s),
                Some(v @ (Value::Number(_) | Value::Bool(_))) => out.push_str(&v.to_string()),
                Some(v) => return Err((name, Some(json_type(v)))),
                None => return Err((name, None)),
            },
        }
    }
    Ok(out)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Every row of the task, split, with the per-epoch shuffles it has computed lately.
pub struct LoadedData {
    /// Training rows, file after file, in file order.
    train: Vec<TaskRow>,
    /// `(start, len, weight)` of each training file's rows in `train`.
    sources: Vec<(usize, usize, f64)>,
    /// Rows per epoch.
    epoch_len: u64,
    /// Held-out rows, in file order.
    heldout: Vec<TaskRow>,
    /// The training files, then the held-out files, as loaded.
    stamps: Vec<FileStamp>,
    /// Seed of the shuffles (see [`DatasetTaskConfig`]).
    shuffle_seed: u64,
    /// The last epochs' orders (indices into `train`); a run is in one or two at a time.
    epochs: Mutex<HashMap<u64, Arc<Vec<u32>>>>,
}

impl std::fmt::Debug for LoadedData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedData")
            .field("train", &self.train.len())
            .field("heldout", &self.heldout.len())
            .field("epoch_len", &self.epoch_len)
            .finish()
    }
}

/// A seeded permutation of `0..len`, Fisher–Yates over ChaCha8 seeded by `words`.
fn shuffle(len: usize, words: [u64; 4]) -> Vec<u32> {
    let mut rng = seeded_rng(words);
    let mut order: Vec<u32> = (0..len as u32).collect();
    for i in (1..len).rev() {
        let j = uniform_below(&mut rng, i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// Loads one file and prepares its rows, checking each (see [`DataError`]).
fn load_file(
    cfg: &DatasetTaskConfig,
    file: &DataFile,
) -> Result<(Vec<TaskRow>, FileStamp), DataError> {
    let dcfg = DatasetConfig {
        path: file.path.clone(),
        prompt_field: cfg.messages.clone().unwrap_or_else(|| cfg.prompt.clone()),
        prompt_messages: cfg.messages.is_some(),
        answer_field: cfg.answer.clone(),
        format: file.format,
        max_row_bytes: cfg.max_row_bytes,
    };
    let format = dcfg.resolved_format()?;
    let records = dcfg.load()?.into_records();
    if records.is_empty() {
        return Err(DataError::Empty {
            path: file.path.clone(),
            prompt: dcfg.prompt_field.clone(),
            answer: cfg.answer.clone(),
        });
    }
    // Blank JSONL lines are skipped by the loader, so line numbers are only exact for files
    // without them; they are counted again here only when every line holds a row.
    let at = |i: usize| match format {
        DatasetFormat::Jsonl => RowRef::Line(i + 1),
        DatasetFormat::Parquet => RowRef::Row(i + 1),
    };
    let lines = match format {
        DatasetFormat::Jsonl => jsonl_row_lines(&file.path),
        DatasetFormat::Parquet => None,
    };
    let mut rows = Vec::with_capacity(records.len());
    for (i, r) in records.into_iter().enumerate() {
        let at = lines
            .as_ref()
            .and_then(|l| l.get(i).copied())
            .map_or_else(|| at(i), RowRef::Line);
        rows.push(prepare_row(cfg, &file.path, at, r)?);
    }
    let stamp = FileStamp {
        path: file.path.display().to_string(),
        rows: rows.len(),
        fingerprint: std::fs::read(&file.path)
            .map(|b| format!("{:016x}", fnv1a(&b)))
            .unwrap_or_default(),
    };
    Ok((rows, stamp))
}

/// 64-bit FNV-1a: a file's fingerprint in a [`DataCursor`] (not cryptographic; it tells an
/// edited file from the one a checkpoint was trained on).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The 1-based line of each non-blank line of a JSONL file (the loader skips blank ones).
fn jsonl_row_lines(path: &Path) -> Option<Vec<usize>> {
    let text = std::fs::read(path).ok()?;
    Some(
        text.split(|b| *b == b'\n')
            .enumerate()
            .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace))
            .map(|(i, _)| i + 1)
            .collect(),
    )
}

fn prepare_row(
    cfg: &DatasetTaskConfig,
    path: &Path,
    at: RowRef,
    r: Record,
) -> Result<TaskRow, DataError> {
    let text_field =
        |name: &str, fields: &Map<String, Value>| -> Result<Option<String>, DataError> {
            match fields.get(name) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(v @ Value::Number(_)) => Ok(Some(v.to_string())),
                Some(v) => Err(DataError::FieldType {
                    path: path.to_path_buf(),
                    at,
                    field: name.to_string(),
                    found: json_type(v),
                    expected: "a string",
                }),
            }
        };
    let conversation = match &cfg.messages {
        Some(field) => prompt_messages(&r, field),
        None => None,
    };
    let mut fields = r.extra;
    if cfg.messages.is_none() {
        fields.insert(cfg.prompt.clone(), Value::String(r.prompt.clone()));
    }
    fields.insert(cfg.answer.clone(), Value::String(r.answer.clone()));
    let prompt = match &cfg.template {
        None => r.prompt,
        Some(t) => render_template(t, &fields).map_err(|(field, found)| match found {
            None => DataError::UnknownField {
                path: path.to_path_buf(),
                at,
                field,
            },
            Some(found) => DataError::FieldType {
                path: path.to_path_buf(),
                at,
                field,
                found,
                expected: "a string, number or boolean",
            },
        })?,
    };
    let system = match &cfg.system {
        Some(name) => text_field(name, &fields)?,
        None => None,
    };
    let id = match &cfg.id {
        Some(name) => text_field(name, &fields)?,
        None => None,
    }
    .unwrap_or_else(|| format!("{}:{}", path.display(), at));
    let answer = match cfg.reward {
        DatasetReward::Math => {
            // The weakest check that still catches an answer no response could ever match:
            // the reference's own answer, boxed, must be credited.
            let boxed = format!("\\boxed{{{}}}", reference_answer(&r.answer));
            if MathVerifier::strict().score(&boxed, &r.answer).value < 1.0 {
                return Err(DataError::UnparsableAnswer {
                    path: path.to_path_buf(),
                    at,
                    field: cfg.answer.clone(),
                    answer: r.answer.chars().take(80).collect(),
                });
            }
            r.answer
        }
        DatasetReward::Countdown => countdown_reference(cfg, path, at, &r.answer, &fields)?,
    };
    // A conversation's own system message wins over the `system` field.
    let mut messages = conversation.unwrap_or_else(|| {
        vec![PromptMessage {
            role: "user".into(),
            content: prompt.clone(),
        }]
    });
    let system =
        system.filter(|s| !s.is_empty() && messages.first().is_none_or(|m| m.role != "system"));
    let prompt = match &system {
        Some(s) => format!("{s}\n\n{prompt}"),
        None => prompt,
    };
    if let Some(s) = system {
        messages.insert(
            0,
            PromptMessage {
                role: "system".into(),
                content: s,
            },
        );
    }
    Ok(TaskRow {
        prompt,
        messages,
        answer,
        id,
        file: path.to_path_buf(),
        at,
    })
}

/// A countdown row's reference, the JSON [`CountdownVerifier`] reads
/// (`{"numbers": [...], "target": t}`), from its target (the answer field) and numbers.
fn countdown_reference(
    cfg: &DatasetTaskConfig,
    path: &Path,
    at: RowRef,
    target: &str,
    fields: &Map<String, Value>,
) -> Result<String, DataError> {
    let bad = |field: &str, reason: String| DataError::BadCountdown {
        path: path.to_path_buf(),
        at,
        field: field.to_string(),
        reason,
    };
    let target: i64 = target.trim().parse().map_err(|_| {
        bad(
            &cfg.answer,
            format!("the target {target:?} is not an integer"),
        )
    })?;
    let field = cfg.numbers.as_deref().unwrap_or("numbers");
    let numbers: Vec<i64> = match fields.get(field) {
        None => return Err(bad(field, "missing (the numbers to use)".into())),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_i64().ok_or(()))
            .collect::<Result<_, _>>()
            .map_err(|_| bad(field, "expected a list of integers".into()))?,
        Some(Value::String(s)) => s
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| bad(field, format!("{s:?} is not a list of integers")))?,
        Some(v) => {
            return Err(bad(
                field,
                format!("expected a list of integers, found {}", json_type(v)),
            ))
        }
    };
    if numbers.is_empty() {
        return Err(bad(field, "no numbers".into()));
    }
    Ok(json!({"numbers": numbers, "target": target}).to_string())
}

impl LoadedData {
    fn load(cfg: &DatasetTaskConfig) -> Result<LoadedData, DataError> {
        let mut train = Vec::new();
        let mut sources = Vec::new();
        let mut heldout = Vec::new();
        let mut stamps = Vec::new();
        for (si, f) in cfg.files.iter().enumerate() {
            let (rows, stamp) = load_file(cfg, f)?;
            stamps.push(stamp);
            let n_out = if cfg.heldout_fraction > 0.0 {
                ((rows.len() as f64 * cfg.heldout_fraction).round() as usize).max(1)
            } else {
                0
            };
            if n_out >= rows.len() {
                return Err(DataError::NoTrainingRows {
                    fraction: cfg.heldout_fraction,
                });
            }
            let mut out = vec![false; rows.len()];
            for &i in shuffle(rows.len(), [cfg.shuffle_seed, si as u64, SPLIT_STREAM, 0])
                .iter()
                .take(n_out)
            {
                out[i as usize] = true;
            }
            let start = train.len();
            for (row, held) in rows.into_iter().zip(out) {
                if held {
                    heldout.push(row);
                } else {
                    train.push(row);
                }
            }
            sources.push((start, train.len() - start, f.weight));
        }
        for f in &cfg.heldout {
            let (rows, stamp) = load_file(cfg, f)?;
            heldout.extend(rows);
            stamps.push(stamp);
        }
        let epoch_len = sources
            .iter()
            .map(|&(_, n, w)| per_epoch(n, w) as u64)
            .sum::<u64>()
            .max(1);
        Ok(LoadedData {
            train,
            sources,
            epoch_len,
            heldout,
            stamps,
            shuffle_seed: cfg.shuffle_seed,
            epochs: Mutex::new(HashMap::new()),
        })
    }

    /// Training rows.
    pub fn train(&self) -> &[TaskRow] {
        &self.train
    }

    /// Held-out rows.
    pub fn heldout(&self) -> &[TaskRow] {
        &self.heldout
    }

    /// Rows in one epoch.
    pub fn epoch_len(&self) -> u64 {
        self.epoch_len
    }

    /// The order of epoch `epoch`: indices into the training rows.
    fn epoch_order(&self, epoch: u64) -> Arc<Vec<u32>> {
        if let Ok(cache) = self.epochs.lock() {
            if let Some(o) = cache.get(&epoch) {
                return Arc::clone(o);
            }
        }
        let mut order = Vec::with_capacity(self.epoch_len as usize);
        for (si, &(start, n, w)) in self.sources.iter().enumerate() {
            let count = per_epoch(n, w);
            let subset = shuffle(n, [self.shuffle_seed, epoch, SUBSET_STREAM, si as u64]);
            for k in 0..count {
                order.push((start + subset[k % n] as usize) as u32);
            }
        }
        let perm = shuffle(order.len(), [self.shuffle_seed, epoch, EPOCH_STREAM, 0]);
        let order = Arc::new(perm.iter().map(|&i| order[i as usize]).collect::<Vec<_>>());
        if let Ok(mut cache) = self.epochs.lock() {
            // A run is in at most a couple of epochs at once; older ones are not needed again.
            cache.retain(|&e, _| e + 2 > epoch && e <= epoch + 2);
            cache.insert(epoch, Arc::clone(&order));
        }
        order
    }

    /// The row task seed `seed` poses when epoch 0 starts at seed `origin` (see the module
    /// docs), and whether it is held out. `None` for a held-out seed when there is no
    /// held-out split.
    pub fn row_for(&self, seed: u64, origin: u64) -> Option<(&TaskRow, bool)> {
        if seed >= HELD_OUT_SEED_BASE {
            let n = self.heldout.len() as u64;
            let i = (seed - HELD_OUT_SEED_BASE).checked_rem(n)?;
            return self.heldout.get(i as usize).map(|r| (r, true));
        }
        let p = seed.wrapping_sub(origin);
        let (epoch, offset) = (p / self.epoch_len, p % self.epoch_len);
        let order = self.epoch_order(epoch);
        let i = *order.get(offset as usize)?;
        self.train.get(i as usize).map(|r| (r, false))
    }
}

/// Rows a file of `n` rows with weight `w` contributes to an epoch (at least one).
fn per_epoch(n: usize, w: f64) -> usize {
    if n == 0 {
        return 0;
    }
    ((n as f64 * w).round() as usize).max(1)
}

/// A data file as a checkpoint saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    /// The path, as the config wrote it.
    pub path: String,
    /// Rows loaded.
    pub rows: usize,
    /// FNV-1a of the file's bytes, hex.
    pub fingerprint: String,
}

impl std::fmt::Display for FileStamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} rows, {})",
            self.path, self.rows, self.fingerprint
        )
    }
}

/// Where a dataset run is in its data, saved in checkpoints (`state.json`'s `data`): the
/// files, the shuffle, and the next row. Rows are a pure function of the task seed (see the
/// module docs), so a resumed run continues with the next unseen row by continuing with
/// the next task seed; this record lets the resume check the config still describes the same
/// data and walk ([`DatasetTaskConfig::check_resume`]) and tells a person where the run is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataCursor {
    /// Training files, then held-out files.
    pub files: Vec<FileStamp>,
    /// The shuffle's seed.
    pub shuffle_seed: u64,
    /// The task seed of epoch 0's first row.
    pub seed_origin: u64,
    /// Rows per epoch (set by the files and their weights).
    pub epoch_len: u64,
    /// The epoch of the next row.
    pub epoch: u64,
    /// The next row's position in its epoch (rows of the epoch already given out).
    pub offset: u64,
    /// The next row: its file, place (`line 12`) and id.
    pub next_file: String,
    pub next_row: String,
    pub next_id: String,
}

fn stamps_line(files: &[FileStamp]) -> String {
    files
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl DatasetTaskConfig {
    /// The data cursor of a run whose next group uses task seed `next_seed`.
    pub fn cursor(&self, next_seed: u64) -> Result<DataCursor, EnvError> {
        let d = self.data()?;
        let p = next_seed.wrapping_sub(self.seed_origin);
        let (next_file, next_row, next_id) = match d.row_for(next_seed, self.seed_origin) {
            Some((r, _)) => (r.file.display().to_string(), r.at.to_string(), r.id.clone()),
            None => Default::default(),
        };
        Ok(DataCursor {
            files: d.stamps.clone(),
            shuffle_seed: self.shuffle_seed,
            seed_origin: self.seed_origin,
            epoch_len: d.epoch_len,
            epoch: p / d.epoch_len,
            offset: p % d.epoch_len,
            next_file,
            next_row,
            next_id,
        })
    }

    /// Whether a run saved with `saved`, continuing at task seed `next_seed`, continues the
    /// same data walk under this config: same files (rows and bytes; paths may move), same
    /// shuffle seed, origin and epoch length, and so the same next row.
    pub fn check_resume(&self, saved: &DataCursor, next_seed: u64) -> Result<(), EnvError> {
        let now = self.cursor(next_seed)?;
        let key = |f: &[FileStamp]| {
            f.iter()
                .map(|s| (s.rows, s.fingerprint.clone()))
                .collect::<Vec<_>>()
        };
        let mismatch = if key(&saved.files) != key(&now.files) {
            Some(CursorMismatch::Files {
                checkpoint: stamps_line(&saved.files),
                config: stamps_line(&now.files),
            })
        } else if saved.shuffle_seed != now.shuffle_seed {
            Some(CursorMismatch::ShuffleSeed {
                checkpoint: saved.shuffle_seed,
                config: now.shuffle_seed,
            })
        } else if saved.seed_origin != now.seed_origin {
            Some(CursorMismatch::Origin {
                checkpoint: saved.seed_origin,
                config: now.seed_origin,
            })
        } else if saved.epoch_len != now.epoch_len {
            Some(CursorMismatch::EpochLen {
                checkpoint: saved.epoch_len,
                config: now.epoch_len,
            })
        } else if (saved.next_row.as_str(), saved.next_id.as_str())
            != (now.next_row.as_str(), now.next_id.as_str())
        {
            let show =
                |c: &DataCursor| format!("{} {} (id {})", c.next_file, c.next_row, c.next_id);
            Some(CursorMismatch::NextRow {
                checkpoint: show(saved),
                config: show(&now),
            })
        } else {
            None
        };
        match mismatch {
            Some(m) => Err(EnvError::Data(Box::new(DataError::Resume(m)))),
            None => Ok(()),
        }
    }
}

/// The dataset task as an environment: `reset(seed)` poses the seed's row, one `step`
/// answers it.
pub struct DatasetEnv {
    data: Arc<LoadedData>,
    seed_origin: u64,
    extract: Vec<AnswerRule>,
    format_weight: f64,
    reward: DatasetReward,
    /// The row posed by the last `reset` and whether it is held out, until answered.
    current: Option<(TaskRow, bool)>,
    started: bool,
}

impl std::fmt::Debug for DatasetEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetEnv")
            .field("data", &self.data)
            .field("started", &self.started)
            .finish()
    }
}

impl DatasetEnv {
    /// The environment for `cfg`, loading its files unless a clone of `cfg` already did.
    pub fn new(cfg: &DatasetTaskConfig) -> Result<DatasetEnv, EnvError> {
        Ok(DatasetEnv {
            data: cfg.data()?,
            seed_origin: cfg.seed_origin,
            extract: cfg.extract.clone(),
            format_weight: cfg.format_weight,
            reward: cfg.reward,
            current: None,
            started: false,
        })
    }

    /// The data behind the environment.
    pub fn data(&self) -> &LoadedData {
        &self.data
    }

    /// The answer's reward: the math verifier's, when the answer is marked by a listed rule.
    fn answer_reward(&self, response: &str, reference: &str) -> Reward {
        if self.reward == DatasetReward::Countdown {
            // Only a solution counts; the format has its own weight.
            return CountdownVerifier { format_score: 0.0 }.score(response, reference);
        }
        let last_number = self.extract.contains(&AnswerRule::LastNumber);
        match extract_answer(response, last_number) {
            None => Reward::zero("no answer found"),
            Some(found) if !self.extract.iter().any(|r| r.matches(found.rule)) => {
                Reward::zero(format!(
                    "answer marked by {:?}, which `extract` does not list",
                    found.rule
                ))
            }
            Some(_) => MathVerifier {
                last_number_fallback: last_number,
            }
            .score(response, reference),
        }
    }
}

#[async_trait]
impl Env for DatasetEnv {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        let Some((row, held)) = self.data.row_for(seed, self.seed_origin) else {
            return Err(config_error(
                "dataset.heldout",
                format!(
                    "task seed {seed} asks for a held-out row, but there is no held-out split; \
                     set `heldout` or `heldout_fraction` (or train.eval_problems = 0)"
                ),
            ));
        };
        let mut info = Map::new();
        info.insert("id".into(), json!(row.id));
        info.insert(
            "split".into(),
            json!(if held { "heldout" } else { "train" }),
        );
        info.insert(
            crate::env::PROMPT_MESSAGES.into(),
            serde_json::to_value(&row.messages).unwrap_or(Value::Null),
        );
        let observation = row.prompt.clone();
        self.current = Some((row.clone(), held));
        self.started = true;
        Ok(Reset { observation, info })
    }

    /// Verification is microseconds of work for a short response, so it runs inline.
    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let Some((row, held)) = self.current.take() else {
            return Err(crate::env::out_of_order("dataset", self.started));
        };
        let answer = self.answer_reward(action, &row.answer);
        let mut reward = answer.value;
        let mut info = Map::new();
        info.insert("id".into(), json!(row.id));
        info.insert(
            "split".into(),
            json!(if held { "heldout" } else { "train" }),
        );
        info.insert("answer".into(), json!(row.answer));
        info.insert("correct".into(), json!(answer.value));
        info.insert("detail".into(), json!(answer.detail));
        if self.format_weight > 0.0 {
            let f = FormatVerifier.score(action, &row.answer);
            reward += self.format_weight * f.value;
            info.insert("format".into(), json!(f.value));
        }
        // The answer alone, however it is marked (the last number counts too): tells the
        // task apart from the format in what RL improves, as the math task does.
        let lenient = match self.reward {
            DatasetReward::Math => MathVerifier::default().score(action, &row.answer).value,
            DatasetReward::Countdown => answer.value,
        };
        info.insert("format_free".into(), json!(lenient));
        Ok(Step {
            observation: String::new(),
            reward,
            terminated: true,
            truncated: false,
            info,
        })
    }
}
