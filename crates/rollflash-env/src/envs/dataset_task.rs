//! The dataset task: single-turn prompts from the user's JSONL or Parquet files, scored by the math verifier or the countdown check, with a held-out split for evaluation.
//!
//! **Rows.** A prompt is a string field (optionally through a `{field}` template) or a
//! conversation field (`[{"role", "content"}]`), with an optional per-row system text and id.
//! **Rewards**: the math verifier on the answer marked by a listed `extract` rule, the
//! countdown check (`reward = "countdown"`), or the response's code run against the row's
//! tests in the sandbox (`reward = "code"`, [`crate::verify::code`]), or the user's Python
//! function (`reward = { python = { … } }`, [`crate::verify::python`]), plus an optional
//! weighted format reward.
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
    prompt_messages, row_field, seeded_rng, uniform_below, DatasetConfig, DatasetError,
    DatasetFormat, FieldPath, PathMiss, PromptMessage, Record, RowRef, DEFAULT_MAX_ROW_BYTES,
};
use crate::env::{Env, EnvError, Reset, Step};
use crate::envs::config_error;
use crate::verify::code::{score_code, CodeExtract, CodeScoring, CodeTests};
use crate::verify::math::{reference_answer, Rule};
use crate::verify::python::{Call, PythonPool, PythonReward, RewardStyle};
use crate::verify::{CountdownVerifier, FormatVerifier, MathVerifier, Reward, Verifier};
use rollflash_sandbox::{Sandbox, Verdict};

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

impl From<AnswerRule> for Rule {
    fn from(r: AnswerRule) -> Rule {
        match r {
            AnswerRule::Boxed => Rule::Boxed,
            AnswerRule::AnswerTag => Rule::AnswerTag,
            AnswerRule::Hashes => Rule::Hashes,
            AnswerRule::AnswerIs => Rule::AnswerIs,
            AnswerRule::LastNumber => Rule::LastNumber,
        }
    }
}

/// What a response is scored by.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
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
    /// The response's last fenced code block, run in the run's sandbox against the row's
    /// tests ([`crate::verify::code`]): the `answer` field holds assert-style test code
    /// (HumanEval/MBPP `test`, with the row's `entry_point` field), or a JSON string
    /// `{"inputs": [...], "outputs": [...]}` (APPS `input_output`); a row with `inputs` and
    /// `outputs` list fields uses those instead. `extract` does not apply; `code_scoring`
    /// says pass/fail or the passed fraction.
    Code,
    /// The user's Python function, verl or TRL style ([`crate::verify::python`]), in the
    /// run's worker pool. The `answer` field is verl's `ground_truth`, as in the file;
    /// `extract` does not apply. A function that fails a sample scores it 0 with the
    /// verdict `reward_failed` and the reason in the step's `reward_error`.
    Python(PythonReward),
}

fn default_rules() -> Vec<AnswerRule> {
    vec![
        AnswerRule::Boxed,
        AnswerRule::AnswerTag,
        AnswerRule::Hashes,
        AnswerRule::AnswerIs,
    ]
}
fn default_prompt() -> FieldPath {
    FieldPath::known("prompt")
}
fn default_answer() -> FieldPath {
    FieldPath::known("answer")
}
fn default_attempts() -> usize {
    1
}

fn default_max_row_bytes() -> usize {
    DEFAULT_MAX_ROW_BYTES
}

/// The loaded data, shared by clones of a config, with the config it was loaded for (a clone
/// changed afterwards loads its own). Not part of the config's value: equality and
/// serialisation ignore it.
/// It also holds the run's sandbox for `reward = "code"`, set once by whoever starts the run
/// ([`DatasetTaskConfig::set_sandbox`]) and shared the same way (in one `Arc` with the load,
/// so the config stays small).
#[derive(Clone, Default)]
pub struct DataCache(Arc<CacheInner>);

#[derive(Default)]
struct CacheInner {
    loaded: Mutex<Option<Loaded>>,
    sandbox: std::sync::OnceLock<Sandbox>,
    python: std::sync::OnceLock<PythonPool>,
}

/// A load and the config (without its origin) it was made for.
type Loaded = (Box<DatasetTaskConfig>, Arc<LoadedData>);

impl std::fmt::Debug for DataCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let loaded = self.0.loaded.lock().map(|g| g.is_some()).unwrap_or(false);
        f.debug_struct("DataCache")
            .field("loaded", &loaded)
            .field("sandbox", &self.0.sandbox.get().is_some())
            .field("python", &self.0.python.get().is_some())
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
    /// Field holding the prompt (a string). This and every other field name below is a path:
    /// dots go into JSON objects and Parquet structs (`extra_info.question`). Not read with a
    /// `template`, which renders the prompt from the row's fields.
    #[serde(default = "default_prompt")]
    pub prompt: FieldPath,
    /// Field holding the prompt as a conversation, `[{"role", "content"}]` (roles `system`,
    /// `user`, `assistant`, `tool`; the last one the user's), used instead of `prompt`. It is
    /// rendered through the model's chat template as it is; without one, the contents a blank
    /// line apart. Exclusive with `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<FieldPath>,
    /// Field holding the reference answer (a string or number; a worked solution ending in
    /// `#### 72` or holding `\boxed{…}` works as is).
    #[serde(default = "default_answer")]
    pub answer: FieldPath,
    /// Field holding a per-row system text, put before the prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<FieldPath>,
    /// Field holding a row id, reported in the step's info (else `file:line`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<FieldPath>,
    /// Field holding the row's data source (verl's `data_source`, e.g. `openai/gsm8k`), kept
    /// per row and reported in the step's info. `None`: the top-level `data_source` field
    /// when a row has one; set, every row must have it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_source: Option<FieldPath>,
    /// The prompt, with `{field}` replaced by the row's field, a path as above
    /// (`{extra_info.question}`; `{{` and `}}` for literal braces; a brace not around a field
    /// name, as in `\boxed{}`, is literal). `None`: the prompt field as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// How an answer may be marked to count (boxed, answer tag, `####`, "answer is", last
    /// number): [`MathVerifier`] consults only these rules, in this order, and the first that
    /// finds an answer wins. A mark of an unlisted kind is just text: under `["boxed",
    /// "last_number"]`, "the answer is 11." answers 11 by its last number.
    #[serde(default = "default_rules")]
    pub extract: Vec<AnswerRule>,
    /// Weight of the `<think>…</think><answer>…</answer>` format reward added to the
    /// answer's; 0 = none.
    #[serde(default)]
    pub format_weight: f64,
    /// What scores a response: `math` (the default), `countdown`, `code`, or
    /// `{ python = { path, function, style, by_source } }`.
    #[serde(default)]
    pub reward: DatasetReward,
    /// With `reward = "code"`: `pass_fail` (1 when every test passes; the default) or
    /// `fraction` (the share of tests passed).
    #[serde(default)]
    pub code_scoring: CodeScoring,
    /// With `reward = "code"`: where the response's code is, `last_fence` (the last closed
    /// fenced block; the default) or `whole` (the response as it is).
    #[serde(default)]
    pub code_extract: CodeExtract,
    /// With `reward = "code"`: attempts the model gets at a row — the multi-turn coding
    /// environment. After an attempt that fails, the environment answers with what failed
    /// (the verdict, the tests passed, the end of the traceback) and the model writes the code
    /// again, until it passes or this many attempts are spent. 1 (the default) is single-turn.
    #[serde(default = "default_attempts")]
    pub attempts: usize,
    /// With `attempts > 1`: taken from the last attempt's reward for every attempt before it,
    /// so a solution right at once is worth more than one right after feedback.
    #[serde(default)]
    pub attempt_cost: f64,
    /// With `reward = "countdown"`: the field holding the numbers to use (a list of integers,
    /// or a string of them separated by commas or spaces); `None` = `numbers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numbers: Option<FieldPath>,
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
            data_source: None,
            template: None,
            extract: default_rules(),
            format_weight: 0.0,
            reward: DatasetReward::Math,
            code_scoring: CodeScoring::default(),
            code_extract: CodeExtract::default(),
            attempts: 1,
            attempt_cost: 0.0,
            numbers: None,
            shuffle_seed: 0,
            seed_origin: 0,
            max_row_bytes: default_max_row_bytes(),
            cache: DataCache::default(),
        }
    }

    /// Gives `reward = "code"` its sandbox, for this config and every clone of it; a second
    /// call keeps the first sandbox. Environments built before it cannot score code.
    pub fn set_sandbox(&self, sandbox: Sandbox) {
        let _ = self.cache.0.sandbox.set(sandbox);
    }

    /// Gives `reward = { python = … }` the run's worker pool, for this config and every clone
    /// of it; a second call keeps the first pool.
    pub fn set_python_pool(&self, pool: PythonPool) {
        let _ = self.cache.0.python.set(pool);
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
        // Field paths are never empty: `FieldPath` parses them so when the config is read.
        if let Some(t) = &self.template {
            Template::parse(t).map_err(|(name, e)| {
                config_error("template", format!("field `{{{name}}}`: {e}"))
            })?;
        }
        let fields = [
            ("messages", self.messages.as_ref()),
            ("system", self.system.as_ref()),
            ("id", self.id.as_ref()),
            ("data_source", self.data_source.as_ref()),
        ];
        if self.messages.is_some() && self.template.is_some() {
            return Err(config_error(
                "template",
                "a template renders a string prompt; with `messages` the conversation is the prompt (unset one of them)",
            ));
        }
        // With `messages` set, `prompt` is not read, so a conversation may sit in a field
        // named `prompt` (as in verl's files) while `prompt` keeps its default.
        let prompt = self.messages.as_ref().unwrap_or(&self.prompt);
        for (name, value) in fields {
            let Some(v) = value else { continue };
            if *v == self.answer || (v == prompt && name != "messages") {
                return Err(config_error(name, "must differ from `prompt` and `answer`"));
            }
        }
        if self.code_scoring != CodeScoring::default() && self.reward != DatasetReward::Code {
            return Err(config_error(
                "code_scoring",
                "applies to reward = \"code\" only; set it or unset this",
            ));
        }
        if self.attempts == 0 || self.attempts > MAX_ATTEMPTS {
            return Err(config_error(
                "attempts",
                format!("must be in 1..={MAX_ATTEMPTS}, got {}", self.attempts),
            ));
        }
        if self.attempts > 1 && self.reward != DatasetReward::Code {
            return Err(config_error(
                "attempts",
                "more than one attempt needs feedback from running the code: reward = \"code\"",
            ));
        }
        if !(self.attempt_cost.is_finite() && self.attempt_cost >= 0.0) {
            return Err(config_error(
                "attempt_cost",
                format!("must be finite and non-negative, got {}", self.attempt_cost),
            ));
        }
        if self.code_extract != CodeExtract::default() && self.reward != DatasetReward::Code {
            return Err(config_error(
                "code_extract",
                "applies to reward = \"code\" only; set it or unset this",
            ));
        }
        if self.numbers.is_some() && self.reward != DatasetReward::Countdown {
            return Err(config_error(
                "numbers",
                "is the countdown reward's field; set reward = \"countdown\" or unset it",
            ));
        }
        if let DatasetReward::Python(p) = &self.reward {
            p.validate()
                .map_err(|(field, reason)| config_error(&field, reason))?;
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
            .loaded
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
    /// The row's data source ([`DatasetTaskConfig::data_source`]), if it has one.
    pub data_source: Option<String>,
    /// The whole row as JSON (structs as objects), with the prompt and answer fields: what a
    /// reward function is given besides the response (verl's `extra_info` and the rest).
    /// Shared, because a row is cloned for every trajectory that poses it.
    pub fields: Arc<Map<String, Value>>,
    /// The file the row is from.
    pub file: PathBuf,
    /// Where in it.
    pub at: RowRef,
}

/// A piece of a parsed template.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Field(FieldPath),
}

/// A template split into text and `{field}` pieces once (see [`DatasetTaskConfig::template`]),
/// rendered for every row.
#[derive(Debug, Clone, PartialEq)]
struct Template(Vec<Piece>);

impl Template {
    /// Parses `t`; `Err` names a `{field}` whose name is not a valid path (`{a..b}`).
    fn parse(t: &str) -> Result<Template, (String, crate::dataset::FieldPathError)> {
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
                    let path = FieldPath::parse(name).map_err(|e| (name.to_string(), e))?;
                    pieces.push(Piece::Field(path));
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
        Ok(Template(pieces))
    }

    /// The text for a row's `fields`; `Err` names the field and why it cannot be inserted.
    fn render(&self, fields: &Map<String, Value>) -> Result<String, (FieldPath, TemplateMiss)> {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Field(path) => match path.lookup(fields) {
                    Ok(Value::String(s)) => out.push_str(s),
                    Ok(v @ (Value::Number(_) | Value::Bool(_))) => out.push_str(&v.to_string()),
                    Ok(v) => return Err((path.clone(), TemplateMiss::Type(json_type(v)))),
                    Err(miss) => return Err((path.clone(), TemplateMiss::Path(miss))),
                },
            }
        }
        Ok(out)
    }
}

/// Why a template field could not be inserted.
enum TemplateMiss {
    /// The row has nothing there.
    Path(PathMiss),
    /// The value is not text, a number or a boolean; its JSON type.
    Type(&'static str),
}

/// Renders `template` with `fields`; `Err(name)` for the first field it lacks (or a name
/// that is not a valid path). Strings are inserted as they are, numbers and booleans as
/// JSON writes them; anything else is `Err` with the field's JSON type in the second
/// position. Field names are paths into `fields`' objects (`{extra_info.question}`).
pub fn render_template(
    template: &str,
    fields: &Map<String, Value>,
) -> Result<String, (String, Option<&'static str>)> {
    let t = Template::parse(template).map_err(|(name, _)| (name, None))?;
    t.render(fields).map_err(|(path, miss)| match miss {
        TemplateMiss::Path(_) => (path.to_string(), None),
        TemplateMiss::Type(found) => (path.to_string(), Some(found)),
    })
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
    template: Option<&Template>,
    file: &DataFile,
) -> Result<(Vec<TaskRow>, FileStamp), DataError> {
    let dcfg = DatasetConfig {
        path: file.path.clone(),
        prompt_field: cfg.messages.clone().unwrap_or_else(|| cfg.prompt.clone()),
        prompt_messages: cfg.messages.is_some(),
        // A template renders the prompt from the row: `prompt` is not read.
        prompt_rendered: cfg.messages.is_none() && template.is_some(),
        answer_field: cfg.answer.clone(),
        format: file.format,
        max_row_bytes: cfg.max_row_bytes,
    };
    let format = dcfg.resolved_format()?;
    let records = dcfg.load()?.into_records();
    if records.is_empty() {
        return Err(DataError::Empty {
            path: file.path.clone(),
            prompt: dcfg.prompt_field.to_string(),
            answer: cfg.answer.to_string(),
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
        rows.push(prepare_row(cfg, template, &file.path, at, r)?);
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
    template: Option<&Template>,
    path: &Path,
    at: RowRef,
    r: Record,
) -> Result<TaskRow, DataError> {
    let bad_path = |field: &FieldPath, miss: PathMiss| {
        DataError::Load(DatasetError::BadPath {
            path: path.to_path_buf(),
            at,
            field: field.to_string(),
            miss: Box::new(miss),
        })
    };
    let text_value = |field: &FieldPath, v: &Value| -> Result<String, DataError> {
        match v {
            Value::String(s) => Ok(s.clone()),
            Value::Number(_) => Ok(v.to_string()),
            v => Err(DataError::FieldType {
                path: path.to_path_buf(),
                at,
                field: field.to_string(),
                found: json_type(v),
                expected: "a string",
            }),
        }
    };
    // An optional field a row may lack (anywhere along its path); a path through a
    // non-object is still an error, since no row could have it.
    let optional_text =
        |field: &FieldPath, fields: &Map<String, Value>| -> Result<Option<String>, DataError> {
            match field.lookup(fields) {
                Ok(v) => text_value(field, v).map(Some),
                Err(PathMiss::MissingKey { .. }) => Ok(None),
                Err(miss) => Err(bad_path(field, miss)),
            }
        };
    let conversation = match &cfg.messages {
        Some(field) => prompt_messages(&r, field),
        None => None,
    };
    // The loader took top-level prompt and answer fields out of the row; they go back so
    // templates, ids and reward functions see the whole row. Nested ones never left it.
    let mut fields = r.extra;
    if cfg.messages.is_none() && template.is_none() && cfg.prompt.is_top_level() {
        fields.insert(
            cfg.prompt.head().to_string(),
            Value::String(r.prompt.clone()),
        );
    }
    if cfg.answer.is_top_level() {
        fields.insert(
            cfg.answer.head().to_string(),
            Value::String(r.answer.clone()),
        );
    }
    let prompt = match template {
        None => r.prompt,
        Some(t) => t.render(&fields).map_err(|(field, miss)| match miss {
            TemplateMiss::Path(PathMiss::MissingKey { .. }) if field.is_top_level() => {
                DataError::UnknownField {
                    path: path.to_path_buf(),
                    at,
                    field: field.to_string(),
                }
            }
            TemplateMiss::Path(miss) => bad_path(&field, miss),
            TemplateMiss::Type(found) => DataError::FieldType {
                path: path.to_path_buf(),
                at,
                field: field.to_string(),
                found,
                expected: "a string, number or boolean",
            },
        })?,
    };
    let system = match &cfg.system {
        Some(field) => optional_text(field, &fields)?,
        None => None,
    };
    let id = match &cfg.id {
        Some(field) => optional_text(field, &fields)?,
        None => None,
    }
    .unwrap_or_else(|| format!("{}:{}", path.display(), at));
    let data_source = match &cfg.data_source {
        Some(field) => Some(text_value(field, row_field(&fields, field, path, at)?)?),
        None => match fields.get("data_source") {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        },
    };
    let answer = match &cfg.reward {
        DatasetReward::Math => {
            // The weakest check that still catches an answer no response could ever match:
            // the reference's own answer, boxed, must be credited.
            let boxed = format!("\\boxed{{{}}}", reference_answer(&r.answer));
            if MathVerifier::strict().score(&boxed, &r.answer).value < 1.0 {
                return Err(DataError::UnparsableAnswer {
                    path: path.to_path_buf(),
                    at,
                    field: cfg.answer.to_string(),
                    answer: r.answer.chars().take(80).collect(),
                });
            }
            r.answer
        }
        DatasetReward::Countdown => countdown_reference(cfg, path, at, &r.answer, &fields)?,
        DatasetReward::Code => code_reference(cfg, path, at, &r.answer, &fields)?,
        // The function judges its ground truth; there is nothing to check it against here.
        DatasetReward::Python(_) => r.answer,
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
        data_source,
        fields: Arc::new(fields),
        file: path.to_path_buf(),
        at,
    })
}

/// A code row's reference: its [`CodeTests`] as JSON. `tests` is the answer field: test
/// code (with an `entry_point` field), or `{"inputs": [...], "outputs": [...]}` as a JSON
/// string; `inputs` and `outputs` list fields win over both.
fn code_reference(
    cfg: &DatasetTaskConfig,
    path: &Path,
    at: RowRef,
    tests: &str,
    fields: &Map<String, Value>,
) -> Result<String, DataError> {
    let bad = |field: &str, reason: String| DataError::BadCodeTests {
        path: path.to_path_buf(),
        at,
        field: field.to_string(),
        reason,
    };
    let texts = |v: &Value, field: &str| -> Result<Vec<String>, DataError> {
        match v {
            Value::Array(items) => items
                .iter()
                .map(|i| match i {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(bad(
                        field,
                        format!(
                            "expected a list of strings, found an item of {}",
                            json_type(other)
                        ),
                    )),
                })
                .collect(),
            other => Err(bad(
                field,
                format!("expected a list of strings, found {}", json_type(other)),
            )),
        }
    };
    let io = |inputs: &Value, outputs: &Value, field: &str| -> Result<CodeTests, DataError> {
        let (inputs, outputs) = (texts(inputs, field)?, texts(outputs, field)?);
        if inputs.len() != outputs.len() || inputs.is_empty() {
            return Err(bad(
                field,
                format!(
                    "{} inputs and {} outputs; need as many of each, at least one",
                    inputs.len(),
                    outputs.len()
                ),
            ));
        }
        Ok(CodeTests::Io {
            cases: inputs.into_iter().zip(outputs).collect(),
        })
    };
    let parsed: Option<Map<String, Value>> = serde_json::from_str(tests).ok();
    let found = match (fields.get("inputs"), fields.get("outputs"), parsed) {
        (Some(i), Some(o), _) => io(i, o, "inputs")?,
        (_, _, Some(obj)) if obj.contains_key("inputs") && obj.contains_key("outputs") => {
            io(&obj["inputs"], &obj["outputs"], cfg.answer.as_str())?
        }
        _ => {
            let entry_point = match fields.get("entry_point") {
                Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
                Some(v) => {
                    return Err(bad(
                        "entry_point",
                        format!("expected a function name, found {}", json_type(v)),
                    ))
                }
                None => {
                    return Err(bad(
                        "entry_point",
                        format!(
                        "missing: assert-style tests (the `{}` field) need the function they check",
                        cfg.answer
                    ),
                    ))
                }
            };
            if !tests.contains("def check") {
                return Err(bad(
                    cfg.answer.as_str(),
                    "assert-style tests must define `check(candidate)`".into(),
                ));
            }
            let prompt = match cfg.prompt.lookup(fields) {
                Ok(Value::String(s)) => s.clone(),
                _ => String::new(),
            };
            CodeTests::Assert {
                prompt,
                test: tests.to_string(),
                entry_point,
            }
        }
    };
    serde_json::to_string(&found).map_err(|e| bad(cfg.answer.as_str(), e.to_string()))
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
            cfg.answer.as_str(),
            format!("the target {target:?} is not an integer"),
        )
    })?;
    let default = FieldPath::known("numbers");
    let path_ = cfg.numbers.as_ref().unwrap_or(&default);
    let field = path_.as_str();
    let numbers: Vec<i64> = match path_.lookup(fields) {
        Err(PathMiss::MissingKey { .. }) => {
            return Err(bad(field, "missing (the numbers to use)".into()))
        }
        Err(miss) => return Err(bad(field, miss.to_string())),
        Ok(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_i64().ok_or(()))
            .collect::<Result<_, _>>()
            .map_err(|_| bad(field, "expected a list of integers".into()))?,
        Ok(Value::String(s)) => s
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| bad(field, format!("{s:?} is not a list of integers")))?,
        Ok(v) => {
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
        // Parsed once for every row; `check_values` has already refused a bad one.
        let template = match &cfg.template {
            Some(t) => Some(Template::parse(t).map_err(|(name, e)| {
                DataError::Load(DatasetError::Config {
                    field: "template",
                    reason: format!("field `{{{name}}}`: {e}"),
                })
            })?),
            None => None,
        };
        let mut train = Vec::new();
        let mut sources = Vec::new();
        let mut heldout = Vec::new();
        let mut stamps = Vec::new();
        for (si, f) in cfg.files.iter().enumerate() {
            let (rows, stamp) = load_file(cfg, template.as_ref(), f)?;
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
            let (rows, stamp) = load_file(cfg, template.as_ref(), f)?;
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
    /// The math verifier over the `extract` rules, in their order.
    verifier: MathVerifier,
    format_weight: f64,
    reward: DatasetReward,
    code_scoring: CodeScoring,
    code_extract: CodeExtract,
    /// The run's sandbox, with `reward = "code"`.
    sandbox: Option<Sandbox>,
    /// The run's Python worker pool, with `reward = { python = … }`.
    python: Option<PythonPool>,
    /// Whether prompts are conversations (`messages` is set): TRL functions get them so.
    conversational: bool,
    /// The row posed by the last `reset` and whether it is held out, until answered.
    current: Option<(TaskRow, bool)>,
    started: bool,
    /// Attempts at a code row ([`DatasetTaskConfig::attempts`]) and what each after the first
    /// costs.
    attempts: usize,
    attempt_cost: f64,
    /// Failed attempts so far at the current row.
    failed_attempts: usize,
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
        let sandbox = cfg.cache.0.sandbox.get().cloned();
        if cfg.reward == DatasetReward::Code && sandbox.is_none() {
            return Err(config_error(
                "reward",
                "\"code\" runs the model's code, which needs the run's sandbox; it was not \
                 started (`rollflash train` starts it from [sandbox]; env-serve cannot yet)",
            ));
        }
        let python = cfg.cache.0.python.get().cloned();
        if matches!(cfg.reward, DatasetReward::Python(_)) && python.is_none() {
            return Err(config_error(
                "reward",
                "a Python reward runs in the run's worker pool, which was not started \
                 (`rollflash train` starts it from [reward.python], `rollflash env-serve` with \
                 --reward-python)",
            ));
        }
        Ok(DatasetEnv {
            code_scoring: cfg.code_scoring,
            code_extract: cfg.code_extract,
            sandbox,
            python,
            conversational: cfg.messages.is_some(),
            data: cfg.data()?,
            seed_origin: cfg.seed_origin,
            verifier: MathVerifier::with_rules(&extract_rules(&cfg.extract)),
            format_weight: cfg.format_weight,
            reward: cfg.reward.clone(),
            current: None,
            started: false,
            attempts: cfg.attempts,
            attempt_cost: cfg.attempt_cost,
            failed_attempts: 0,
        })
    }

    /// The data behind the environment.
    pub fn data(&self) -> &LoadedData {
        &self.data
    }

    /// The code reward's step: the verdict's name in `verdict`, and `code/<verdict>` = 1 (a
    /// number, so it reaches the trajectory's `env_metrics` and can be counted per step).
    /// With attempts left, a failing attempt is not the end: the row stays posed and the
    /// observation says what failed (its verdict is in `attempt_verdict`, not counted).
    async fn code_step(
        &mut self,
        action: &str,
        row: TaskRow,
        held: bool,
    ) -> Result<Step, EnvError> {
        let (Some(sandbox), Ok(tests)) = (
            self.sandbox.as_ref(),
            serde_json::from_str::<CodeTests>(&row.answer),
        ) else {
            // `new` refuses a code env without a sandbox, and `prepare_row` wrote the tests.
            return Err(config_error(
                "reward",
                "code rows without their tests or sandbox",
            ));
        };
        let score = score_code(
            sandbox,
            &tests,
            action,
            self.code_extract,
            self.code_scoring,
        )
        .await
        .map_err(|e| EnvError::Internal {
            what: "code sandbox".into(),
            source: Box::new(e),
        })?;
        if score.verdict != Verdict::Passed && self.failed_attempts + 1 < self.attempts {
            self.failed_attempts += 1;
            let mut info = Map::new();
            info.insert("id".into(), json!(row.id));
            info.insert("attempt_verdict".into(), json!(score.verdict.name()));
            let observation = attempt_feedback(
                &score,
                self.code_extract,
                self.failed_attempts,
                self.attempts,
            );
            self.current = Some((row, held));
            return Ok(Step {
                observation,
                reward: 0.0,
                terminated: false,
                truncated: false,
                info,
            });
        }
        let mut info = Map::new();
        info.insert("id".into(), json!(row.id));
        info.insert(
            "split".into(),
            json!(if held { "heldout" } else { "train" }),
        );
        info.insert("verdict".into(), json!(score.verdict.name()));
        info.insert(format!("code/{}", score.verdict.name()), json!(1.0));
        info.insert("tests_passed".into(), json!(score.passed));
        info.insert("tests_total".into(), json!(score.total));
        info.insert("correct".into(), json!(score.reward));
        info.insert("detail".into(), json!(score.detail));
        let mut reward = score.reward;
        if self.attempts > 1 {
            info.insert("attempts".into(), json!(self.failed_attempts + 1));
            reward -= self.attempt_cost * self.failed_attempts as f64;
        }
        if self.format_weight > 0.0 {
            let f = FormatVerifier.score(action, &row.answer);
            reward += self.format_weight * f.value;
            info.insert("format".into(), json!(f.value));
        }
        info.insert("format_free".into(), json!(score.reward));
        Ok(Step {
            observation: String::new(),
            reward,
            terminated: true,
            truncated: false,
            info,
        })
    }

    /// The Python reward's step: verdict `ok` or `reward_failed` (in `verdict`, and
    /// `python/<verdict>` = 1 to be counted per step), the failure's reason in
    /// `reward_error`, and verl's extra numeric keys as `reward/<key>`.
    async fn python_step(
        &self,
        reward: &PythonReward,
        action: &str,
        row: &TaskRow,
        held: bool,
    ) -> Result<Step, EnvError> {
        let Some(pool) = self.python.as_ref() else {
            // `new` refuses a Python reward without a pool.
            return Err(config_error(
                "reward",
                "a Python reward without its worker pool",
            ));
        };
        let (path, function) = reward.function_for(row.data_source.as_deref());
        let call = Call {
            path: path.to_path_buf(),
            function: function.to_string(),
            style: reward.style,
            args: python_args(reward.style, self.conversational, action, row),
        };
        let scored = pool.score(call).await;
        let mut info = Map::new();
        info.insert("id".into(), json!(row.id));
        info.insert(
            "split".into(),
            json!(if held { "heldout" } else { "train" }),
        );
        if let Some(source) = &row.data_source {
            info.insert("data_source".into(), json!(source));
        }
        let value = match scored {
            Ok(score) => {
                info.insert("verdict".into(), json!("ok"));
                info.insert("python/ok".into(), json!(1.0));
                for (k, v) in score.extra {
                    info.insert(format!("reward/{k}"), json!(v));
                }
                score.value
            }
            Err(e) => {
                info.insert("verdict".into(), json!("reward_failed"));
                info.insert("python/reward_failed".into(), json!(1.0));
                info.insert("reward_error".into(), json!(e));
                0.0
            }
        };
        info.insert("correct".into(), json!(value));
        info.insert("format_free".into(), json!(value));
        let mut reward = value;
        if self.format_weight > 0.0 {
            let f = FormatVerifier.score(action, &row.answer);
            reward += self.format_weight * f.value;
            info.insert("format".into(), json!(f.value));
        }
        Ok(Step {
            observation: String::new(),
            reward,
            terminated: true,
            truncated: false,
            info,
        })
    }

    /// The answer's reward: the math verifier's over the `extract` rules.
    fn answer_reward(&self, response: &str, reference: &str) -> Reward {
        if self.reward == DatasetReward::Countdown {
            // Only a solution counts; the format has its own weight.
            return CountdownVerifier { format_score: 0.0 }.score(response, reference);
        }
        self.verifier.score(response, reference)
    }
}

/// Most attempts at one code row: each is a model turn and an execution, so the episode stays
/// bounded by the context the turns fill.
pub const MAX_ATTEMPTS: usize = 16;

/// Longest traceback excerpt an attempt's feedback quotes.
const FEEDBACK_CHARS: usize = 600;

/// What the model reads after failing attempt `failed` of `attempts`: the verdict, the tests
/// passed, and the end of what the program printed on failing, in ASCII (observations are; other
/// characters become `?`) and at most [`FEEDBACK_CHARS`] of it.
fn attempt_feedback(
    score: &crate::verify::code::CodeScore,
    extract: CodeExtract,
    failed: usize,
    attempts: usize,
) -> String {
    let what = match score.verdict {
        Verdict::NoCode => format!("no code was found ({})", score.detail),
        v => format!(
            "{} ({} of {} tests passed)",
            v.name().replace('_', " "),
            score.passed,
            score.total
        ),
    };
    let detail: String = score
        .detail
        .chars()
        .map(|c| if c.is_ascii() { c } else { '?' })
        .collect();
    let start = detail.len().saturating_sub(FEEDBACK_CHARS);
    let detail = detail[start..].trim();
    let mut text = format!("Attempt {failed} of {attempts} failed: {what}.");
    if !detail.is_empty() && score.verdict != Verdict::NoCode {
        text.push_str(&format!("\n{detail}"));
    }
    text.push_str(match extract {
        CodeExtract::LastFence => {
            "\nFix the code and answer with the whole corrected solution in a ```python block."
        }
        CodeExtract::Whole => "\nFix the code and answer with the whole corrected solution.",
    });
    text
}

/// A sample's arguments for a Python function of `style` (see [`Call::args`]).
///
/// verl: `extra_info` is the row's `extra_info` field when it is an object (what verl
/// passes), else the whole row. TRL: the prompt is the conversation when the task reads one
/// (TRL's conversational format, with the completion as an assistant message) and the text
/// otherwise; the columns are the row's fields but `prompt` and `completion`, as TRL passes
/// them.
fn python_args(style: RewardStyle, conversational: bool, action: &str, row: &TaskRow) -> Value {
    match style {
        RewardStyle::Verl => {
            let extra_info = match row.fields.get("extra_info") {
                Some(v @ Value::Object(_)) => v.clone(),
                _ => Value::Object((*row.fields).clone()),
            };
            json!({
                "data_source": row.data_source.as_deref().unwrap_or(""),
                "solution_str": action,
                "ground_truth": row.answer,
                "extra_info": extra_info,
            })
        }
        RewardStyle::Trl => {
            let (prompt, completion) = if conversational {
                (
                    serde_json::to_value(&row.messages).unwrap_or(Value::Null),
                    json!([{"role": "assistant", "content": action}]),
                )
            } else {
                (json!(row.prompt), json!(action))
            };
            let columns: Map<String, Value> = row
                .fields
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "prompt" | "completion"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            json!({"prompt": prompt, "completion": completion, "columns": columns})
        }
    }
}

/// The verifier's rules for an `extract` list, in its order.
fn extract_rules(extract: &[AnswerRule]) -> Vec<Rule> {
    extract.iter().map(|&r| Rule::from(r)).collect()
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
        if let Some(source) = &row.data_source {
            info.insert("data_source".into(), json!(source));
        }
        info.insert(
            crate::env::PROMPT_MESSAGES.into(),
            serde_json::to_value(&row.messages).unwrap_or(Value::Null),
        );
        let observation = row.prompt.clone();
        self.current = Some((row.clone(), held));
        self.started = true;
        self.failed_attempts = 0;
        Ok(Reset { observation, info })
    }

    /// Verification is microseconds of work for a short response, so it runs inline; code
    /// runs in the sandbox's pool, awaited here.
    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let Some((row, held)) = self.current.take() else {
            return Err(crate::env::out_of_order("dataset", self.started));
        };
        if self.reward == DatasetReward::Code {
            return self.code_step(action, row, held).await;
        }
        if let DatasetReward::Python(p) = &self.reward {
            return self.python_step(p, action, &row, held).await;
        }
        let answer = self.answer_reward(action, &row.answer);
        let mut reward = answer.value;
        let mut info = Map::new();
        info.insert("id".into(), json!(row.id));
        info.insert(
            "split".into(),
            json!(if held { "heldout" } else { "train" }),
        );
        if let Some(source) = &row.data_source {
            info.insert("data_source".into(), json!(source));
        }
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
            DatasetReward::Countdown | DatasetReward::Code | DatasetReward::Python(_) => {
                answer.value
            }
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
