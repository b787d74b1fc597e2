//! Datasets of prompts and reference answers: JSONL and Parquet files, and the built-in generators, behind one interface.
//!
//! A dataset is a list of [`Record`]s (prompt, reference answer, anything else the row had),
//! addressed by index through the small [`Dataset`] trait, so files and procedural generators
//! ([`crate::math_task::MathDataset`]) look the same to a trainer. [`Sampler`] turns a
//! dataset's length into a deterministic, resumable stream of shuffled indices.
//!
//! Loading is eager: RLVR prompt sets are small (thousands to a few hundred thousand rows),
//! and checking every row up front turns a bad row into an error at start-up, naming the file
//! and the row, rather than a crash hours into a run.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::Array;
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollflash_core::IoError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

mod field_path;

use field_path::json_type_name;
pub use field_path::{FieldPath, FieldPathError, PathMiss};

/// One example: what the model is asked, the reference its answer is verified against, and
/// the row's other fields (kept for environments and logging, e.g. a difficulty level).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Record {
    /// The prompt text given to the model.
    pub prompt: String,
    /// The reference answer, as text (numeric columns are converted).
    pub answer: String,
    /// Every other field of the row; Parquet structs and lists are JSON objects and arrays.
    /// A top-level prompt or answer field is taken out; one named by a nested path stays in
    /// place, so the struct holding it (verl's `reward_model`) keeps its shape for reward
    /// functions that read it whole.
    #[serde(default)]
    pub extra: Map<String, Value>,
}

/// Indexed access to records. Small on purpose: files and generators implement it alike.
pub trait Dataset: Send + Sync {
    /// Number of records.
    fn len(&self) -> usize;
    /// Record `index`, or `None` past the end. Owned, because generators build records on
    /// demand.
    fn get(&self, index: usize) -> Option<Record>;
    /// Whether there are no records.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Records held in memory: what the file loaders return.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InMemoryDataset {
    /// The records, in file order.
    records: Vec<Record>,
}

impl InMemoryDataset {
    /// A dataset of these records.
    pub fn new(records: Vec<Record>) -> InMemoryDataset {
        InMemoryDataset { records }
    }

    /// All records, in order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Takes the records out.
    pub fn into_records(self) -> Vec<Record> {
        self.records
    }
}

impl Dataset for InMemoryDataset {
    fn len(&self) -> usize {
        self.records.len()
    }
    fn get(&self, index: usize) -> Option<Record> {
        self.records.get(index).cloned()
    }
}

/// File formats the loader reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetFormat {
    /// One JSON object per line (`.jsonl`, `.ndjson`).
    Jsonl,
    /// Apache Parquet (`.parquet`, `.pq`).
    Parquet,
}

/// Default of [`DatasetConfig::prompt_field`].
pub const DEFAULT_PROMPT_FIELD: &str = "prompt";
/// Default of [`DatasetConfig::answer_field`].
pub const DEFAULT_ANSWER_FIELD: &str = "answer";
/// Default of [`DatasetConfig::max_row_bytes`]: 1 MiB.
pub const DEFAULT_MAX_ROW_BYTES: usize = 1 << 20;

fn default_prompt_field() -> FieldPath {
    FieldPath::known(DEFAULT_PROMPT_FIELD)
}
fn default_answer_field() -> FieldPath {
    FieldPath::known(DEFAULT_ANSWER_FIELD)
}
fn default_max_row_bytes() -> usize {
    DEFAULT_MAX_ROW_BYTES
}

/// Where a dataset file is and how to read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    /// The file.
    pub path: PathBuf,
    /// Field (JSONL key or Parquet column) holding the prompt, a string; a dotted path
    /// (`extra_info.question`) goes into JSON objects and Parquet structs.
    #[serde(default = "default_prompt_field")]
    pub prompt_field: FieldPath,
    /// Field holding the reference answer: a string, or a number converted to text; a dotted
    /// path as for `prompt_field` (`reward_model.ground_truth`).
    #[serde(default = "default_answer_field")]
    pub answer_field: FieldPath,
    /// The format; `None` detects it from the extension.
    #[serde(default)]
    pub format: Option<DatasetFormat>,
    /// Largest row accepted, in bytes, so one corrupt or runaway row is an error naming it
    /// instead of exhausting memory. For JSONL it is the line length (excluding the newline)
    /// and is enforced while reading; for Parquet it is the row's decoded size, checked batch
    /// by batch (a single huge value is still decoded once before it is refused).
    #[serde(default = "default_max_row_bytes")]
    pub max_row_bytes: usize,
    /// The prompt field holds a chat conversation, `[{"role": …, "content": …}, …]` (a JSON
    /// array, or a Parquet list of `{role, content}` structs, as verl's and TRL's
    /// conversational datasets store it), instead of a string. The list stays in
    /// [`Record::extra`] under the prompt field, checked ([`prompt_messages`] reads it back);
    /// [`Record::prompt`] is its plain rendering (the contents, a blank line apart).
    #[serde(default)]
    pub prompt_messages: bool,
    /// No field is the prompt: the caller renders it from the row (the dataset task's
    /// `template`), so `prompt_field` is neither read nor checked (verl's `prompt` column,
    /// a conversation, does not stop a template over other columns) and [`Record::prompt`]
    /// is empty.
    #[serde(default)]
    pub prompt_rendered: bool,
}

impl DatasetConfig {
    /// The file at `path`, with default field names and cap.
    pub fn new(path: impl Into<PathBuf>) -> DatasetConfig {
        DatasetConfig {
            path: path.into(),
            prompt_field: default_prompt_field(),
            answer_field: default_answer_field(),
            format: None,
            max_row_bytes: default_max_row_bytes(),
            prompt_messages: false,
            prompt_rendered: false,
        }
    }

    /// Checks the values; the error names the bad field.
    pub fn validate(&self) -> Result<(), DatasetError> {
        let bad = |field: &'static str, reason: &str| {
            Err(DatasetError::Config {
                field,
                reason: reason.into(),
            })
        };
        // Paths are never empty (`FieldPath` parses them so).
        if !self.prompt_rendered && self.prompt_field == self.answer_field {
            return bad("answer_field", "must differ from prompt_field");
        }
        if self.max_row_bytes == 0 {
            return bad("max_row_bytes", "must be at least 1");
        }
        Ok(())
    }

    /// The configured format, or the one the extension implies.
    pub fn resolved_format(&self) -> Result<DatasetFormat, DatasetError> {
        if let Some(f) = self.format {
            return Ok(f);
        }
        let ext = self
            .path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("jsonl" | "ndjson") => Ok(DatasetFormat::Jsonl),
            Some("parquet" | "pq") => Ok(DatasetFormat::Parquet),
            _ => Err(DatasetError::UnknownFormat {
                path: self.path.clone(),
            }),
        }
    }

    /// Loads every record (see [`load`]).
    pub fn load(&self) -> Result<InMemoryDataset, DatasetError> {
        load(self)
    }
}

/// Where in a file a row is, 1-based: a line for JSONL (what an editor shows), a row for
/// Parquet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowRef {
    /// 1-based line of a JSONL file.
    Line(usize),
    /// 1-based row of a Parquet file.
    Row(usize),
}

impl fmt::Display for RowRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowRef::Line(n) => write!(f, "line {n}"),
            RowRef::Row(n) => write!(f, "row {n}"),
        }
    }
}

/// Why a dataset could not be loaded. Every file error names the file, and every row error
/// the row.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The file could not be opened or read (the message names it).
    #[error(transparent)]
    Io(#[from] IoError),
    /// A JSONL line is not valid JSON.
    #[error("{}: {at}: invalid JSON", path.display())]
    Json {
        path: PathBuf,
        at: RowRef,
        #[source]
        source: serde_json::Error,
    },
    /// A JSONL line is valid JSON but not an object.
    #[error("{}: {at}: expected a JSON object, found {found}", path.display())]
    NotAnObject {
        path: PathBuf,
        at: RowRef,
        found: &'static str,
    },
    /// A row lacks the prompt or answer field (a top-level one; see `BadPath` for nested).
    #[error("{}: {at}: missing field `{field}`", path.display())]
    MissingField {
        path: PathBuf,
        at: RowRef,
        field: String,
    },
    /// A nested field path does not lead to a value in a row: a key is missing, or a value on
    /// the way is not an object.
    #[error("{}: {at}: field `{field}`: {miss}", path.display())]
    BadPath {
        path: PathBuf,
        at: RowRef,
        /// The path as configured.
        field: String,
        /// Boxed, so rows' results stay small.
        #[source]
        miss: Box<PathMiss>,
    },
    /// A row's prompt or answer has the wrong type (or is null).
    #[error("{}: {at}: field `{field}` is {found}, expected {expected}", path.display())]
    WrongType {
        path: PathBuf,
        at: RowRef,
        field: String,
        found: String,
        expected: &'static str,
    },
    /// A conversation prompt is not a non-empty list of `{role, content}` messages with known
    /// roles, ending with the user's; `field` is the message's place (`messages[2].role`).
    #[error("{}: {at}: field `{field}`: {reason}", path.display())]
    BadMessage {
        path: PathBuf,
        at: RowRef,
        field: String,
        reason: String,
    },
    /// A row is larger than [`DatasetConfig::max_row_bytes`].
    #[error("{}: {at}: row exceeds the {cap}-byte limit (max_row_bytes)", path.display())]
    RowTooLarge {
        path: PathBuf,
        at: RowRef,
        cap: usize,
    },
    /// A Parquet file lacks the prompt or answer column.
    #[error("{}: no column `{field}` (columns: {available})", path.display())]
    MissingColumn {
        path: PathBuf,
        field: String,
        available: String,
    },
    /// A Parquet prompt or answer column has an unsupported type.
    #[error("{}: column `{field}` has type {found}, expected {expected}", path.display())]
    ColumnType {
        path: PathBuf,
        field: String,
        found: String,
        expected: &'static str,
    },
    /// The Parquet reader failed (corrupt file, unsupported encoding).
    #[error("{}", path.display())]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// Decoding a Parquet batch failed.
    #[error("{}", path.display())]
    Arrow {
        path: PathBuf,
        #[source]
        source: arrow_schema::ArrowError,
    },
    /// The extension does not say which format the file is.
    #[error(
        "{}: cannot tell the format from the extension; use .jsonl or .parquet, or set `format`",
        path.display()
    )]
    UnknownFormat { path: PathBuf },
    /// A configuration value is invalid.
    #[error("invalid dataset config `{field}`: {reason}")]
    Config { field: &'static str, reason: String },
    /// A sampler cursor does not fit the dataset it is resumed on.
    #[error("sampler cursor offset {offset} is past the dataset length {len}")]
    Cursor { offset: usize, len: usize },
}

/// Loads every record of the file `cfg` describes.
pub fn load(cfg: &DatasetConfig) -> Result<InMemoryDataset, DatasetError> {
    cfg.validate()?;
    match cfg.resolved_format()? {
        DatasetFormat::Jsonl => load_jsonl(cfg),
        DatasetFormat::Parquet => load_parquet(cfg),
    }
}

fn open(path: &Path) -> Result<File, DatasetError> {
    Ok(File::open(path).map_err(IoError::at("cannot open", path))?)
}

/// Loads a JSONL file: one object per line, blank lines skipped. Lines are read with a cap,
/// so a huge line costs at most `max_row_bytes` of memory before it is refused.
pub fn load_jsonl(cfg: &DatasetConfig) -> Result<InMemoryDataset, DatasetError> {
    cfg.validate()?;
    let path = cfg.path.as_path();
    let mut reader = BufReader::new(open(path)?);
    let io_err = |source| DatasetError::Io(IoError::new("cannot read", path, source));
    let cap = cfg.max_row_bytes;
    let mut records = Vec::new();
    let mut buf = Vec::new();
    let mut line = 0usize;
    loop {
        buf.clear();
        line += 1;
        let at = RowRef::Line(line);
        let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
        let n = (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut buf)
            .map_err(io_err)?;
        if n == 0 {
            break;
        }
        let content = buf.strip_suffix(b"\n").unwrap_or(&buf);
        if content.len() > cap {
            return Err(DatasetError::RowTooLarge {
                path: path.to_path_buf(),
                at,
                cap,
            });
        }
        if content.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let value: Value =
            serde_json::from_slice(content).map_err(|source| DatasetError::Json {
                path: path.to_path_buf(),
                at,
                source,
            })?;
        let Value::Object(obj) = value else {
            return Err(DatasetError::NotAnObject {
                path: path.to_path_buf(),
                at,
                found: json_type_name(&value),
            });
        };
        records.push(record_from_object(obj, cfg, at)?);
    }
    Ok(InMemoryDataset::new(records))
}

/// The value `field` leads to in a row. A missing top-level field is [`DatasetError::MissingField`]
/// (as before paths existed); a nested path that leads nowhere is [`DatasetError::BadPath`].
pub(crate) fn row_field<'a>(
    row: &'a Map<String, Value>,
    field: &FieldPath,
    path: &Path,
    at: RowRef,
) -> Result<&'a Value, DatasetError> {
    field.lookup(row).map_err(|miss| {
        if field.is_top_level() {
            DatasetError::MissingField {
                path: path.to_path_buf(),
                at,
                field: field.to_string(),
            }
        } else {
            DatasetError::BadPath {
                path: path.to_path_buf(),
                at,
                field: field.to_string(),
                miss: Box::new(miss),
            }
        }
    })
}

/// A number as reference-answer text. Floats print as Rust prints them (`3` for `3.0`, `0.1`
/// for `0.1`), so a JSONL number and the same Parquet float give the same text.
fn number_text(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() => f.to_string(),
        _ => n.to_string(),
    }
}

/// A row's record: the prompt and answer read through their paths, the rest kept as `extra`.
/// JSONL lines and Parquet rows (converted to JSON objects) both go through here, so the same
/// data gives the same record in either format.
fn record_from_object(
    mut obj: Map<String, Value>,
    cfg: &DatasetConfig,
    at: RowRef,
) -> Result<Record, DatasetError> {
    let path = cfg.path.as_path();
    let wrong = |field: &FieldPath, v: &Value, expected| DatasetError::WrongType {
        path: path.to_path_buf(),
        at,
        field: field.to_string(),
        found: json_type_name(v).to_string(),
        expected,
    };
    // A top-level field is taken out of the row; a nested one is read in place (see
    // `Record::extra`).
    fn take(
        obj: &mut Map<String, Value>,
        field: &FieldPath,
        path: &Path,
        at: RowRef,
    ) -> Result<Value, DatasetError> {
        if field.is_top_level() {
            if let Some(v) = obj.remove(field.head()) {
                return Ok(v);
            }
        }
        row_field(obj, field, path, at).cloned()
    }
    let prompt = if cfg.prompt_rendered {
        String::new()
    } else if cfg.prompt_messages {
        // The conversation stays in the row, where `prompt_messages` reads it back.
        match row_field(&obj, &cfg.prompt_field, path, at)? {
            v @ Value::Array(_) => {
                let messages =
                    check_messages(v, cfg.prompt_field.as_str()).map_err(|(field, reason)| {
                        DatasetError::BadMessage {
                            path: path.to_path_buf(),
                            at,
                            field,
                            reason,
                        }
                    })?;
                plain_rendering(&messages)
            }
            v => return Err(wrong(&cfg.prompt_field, v, "a list of messages")),
        }
    } else {
        match take(&mut obj, &cfg.prompt_field, path, at)? {
            Value::String(s) => s,
            v => return Err(wrong(&cfg.prompt_field, &v, "a string")),
        }
    };
    let answer = match take(&mut obj, &cfg.answer_field, path, at)? {
        Value::String(s) => s,
        Value::Number(n) => number_text(&n),
        v => return Err(wrong(&cfg.answer_field, &v, "a string or a number")),
    };
    Ok(Record {
        prompt,
        answer,
        extra: obj,
    })
}

/// One message of a conversation prompt ([`DatasetConfig::prompt_messages`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// Roles a conversation prompt may use: those chat templates know.
pub const MESSAGE_ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// The messages of `v`, or the failing place (`field[i].role`) and why.
fn check_messages(v: &Value, field: &str) -> Result<Vec<PromptMessage>, (String, String)> {
    let Value::Array(items) = v else {
        return Err((field.to_string(), "expected a list of messages".into()));
    };
    if items.is_empty() {
        return Err((field.to_string(), "no messages".into()));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let Value::Object(o) = m else {
            return Err((
                format!("{field}[{i}]"),
                format!(
                    "expected a {{role, content}} object, found {}",
                    json_type_name(m)
                ),
            ));
        };
        let text = |key: &str| match o.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => Err((
                format!("{field}[{i}].{key}"),
                format!("expected a string, found {}", json_type_name(v)),
            )),
            None => Err((format!("{field}[{i}].{key}"), "missing".into())),
        };
        let role = text("role")?;
        if !MESSAGE_ROLES.contains(&role.as_str()) {
            return Err((
                format!("{field}[{i}].role"),
                format!("unknown role {role:?} (expected one of {MESSAGE_ROLES:?})"),
            ));
        }
        out.push(PromptMessage {
            role,
            content: text("content")?,
        });
    }
    if out.last().is_some_and(|m| m.role != "user") {
        return Err((
            format!("{field}[{}].role", out.len() - 1),
            "the last message must be the user's (the model answers it)".into(),
        ));
    }
    Ok(out)
}

/// The conversation a record's prompt field holds, when it was loaded with
/// [`DatasetConfig::prompt_messages`]; `None` when the field is not a valid one.
pub fn prompt_messages(record: &Record, prompt_field: &FieldPath) -> Option<Vec<PromptMessage>> {
    let v = prompt_field.lookup(&record.extra).ok()?;
    check_messages(v, prompt_field.as_str()).ok()
}

/// A conversation as plain text, for models without a chat template: the contents, a blank
/// line apart.
pub fn plain_rendering(messages: &[PromptMessage]) -> String {
    messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// One Parquet value, in the few shapes a record can hold.
enum Cell {
    Null,
    Str(String),
    Int(serde_json::Number),
    /// Kept as `f32` so `0.1f32` prints as `0.1`, not `0.10000000149011612`.
    F32(f32),
    F64(f64),
    Bool(bool),
}

impl Cell {
    fn into_json(self) -> Value {
        let float = |text: String| {
            text.parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map_or(Value::Null, Value::Number)
        };
        match self {
            Cell::Null => Value::Null,
            Cell::Str(s) => Value::String(s),
            Cell::Int(n) => Value::Number(n),
            Cell::F32(v) => float(v.to_string()),
            Cell::F64(v) => float(v.to_string()),
            Cell::Bool(b) => Value::Bool(b),
        }
    }
}

fn is_string_type(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_number_type(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Float32
            | DataType::Float64
    )
}

/// Value `i` of `col`; `None` for column types a record does not carry.
fn cell(col: &dyn Array, i: usize) -> Option<Cell> {
    let t = col.data_type();
    // Type first, so an unsupported column is skipped whole rather than only where it is null.
    if !(is_string_type(t) || is_number_type(t) || *t == DataType::Boolean) {
        return None;
    }
    if col.is_null(i) {
        return Some(Cell::Null);
    }
    macro_rules! int {
        ($t:ty) => {
            col.as_primitive_opt::<$t>()
                .map(|a| Cell::Int(serde_json::Number::from(a.value(i))))
        };
    }
    match t {
        DataType::Utf8 => col
            .as_string_opt::<i32>()
            .map(|a| Cell::Str(a.value(i).to_owned())),
        DataType::LargeUtf8 => col
            .as_string_opt::<i64>()
            .map(|a| Cell::Str(a.value(i).to_owned())),
        DataType::Utf8View => col
            .as_string_view_opt()
            .map(|a| Cell::Str(a.value(i).to_owned())),
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Float32 => col
            .as_primitive_opt::<arrow_array::types::Float32Type>()
            .map(|a| Cell::F32(a.value(i))),
        DataType::Float64 => col
            .as_primitive_opt::<arrow_array::types::Float64Type>()
            .map(|a| Cell::F64(a.value(i))),
        DataType::Boolean => col.as_boolean_opt().map(|a| Cell::Bool(a.value(i))),
        _ => None,
    }
}

/// Whether values of type `t` go into a record: strings, numbers, booleans and nulls, and
/// structs and lists of them. Binary, dates, maps and the like do not (a struct keeps its
/// other fields).
fn carried(t: &DataType) -> bool {
    match t {
        DataType::Null | DataType::Boolean | DataType::Struct(_) => true,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            carried(f.data_type())
        }
        t => is_string_type(t) || is_number_type(t),
    }
}

/// Value `i` of `col` as JSON: structs become objects, lists arrays, by their Arrow types;
/// `None` for a type a record does not carry ([`carried`]), decided by type alone so such a
/// column is skipped whole rather than only where it is null.
fn json_value(col: &dyn Array, i: usize) -> Option<Value> {
    let t = col.data_type();
    if !carried(t) {
        return None;
    }
    if col.is_null(i) || *t == DataType::Null {
        return Some(Value::Null);
    }
    let list = |items: arrow_array::ArrayRef| {
        Value::Array(
            (0..items.len())
                .map(|r| json_value(items.as_ref(), r).unwrap_or(Value::Null))
                .collect(),
        )
    };
    match t {
        DataType::Struct(_) => {
            let st = col.as_struct_opt()?;
            let mut obj = Map::new();
            for (f, c) in st.fields().iter().zip(st.columns()) {
                if let Some(v) = json_value(c.as_ref(), i) {
                    obj.insert(f.name().clone(), v);
                }
            }
            Some(Value::Object(obj))
        }
        DataType::List(_) => col.as_list_opt::<i32>().map(|l| list(l.value(i))),
        DataType::LargeList(_) => col.as_list_opt::<i64>().map(|l| list(l.value(i))),
        DataType::FixedSizeList(..) => col.as_fixed_size_list_opt().map(|l| list(l.value(i))),
        _ => cell(col, i).map(Cell::into_json),
    }
}

/// Bytes a value takes for the row-size cap: text and keys by length, other scalars 8.
fn json_size(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(json_size).fold(0, usize::saturating_add),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| k.len().saturating_add(json_size(v)))
            .fold(0, usize::saturating_add),
        _ => 8,
    }
}

/// Loads a Parquet file. Each row becomes a JSON object (structs as objects, lists as
/// arrays; binary and other columns a record does not carry are skipped) and is read like a
/// JSONL line, so the same data loads to the same records in both formats. The prompt and
/// answer paths' first keys must be columns; a top-level prompt must be a string column (a
/// list for `prompt_messages`), a top-level answer a string or number column (numbers become
/// text), and a nested path must start in a struct column.
pub fn load_parquet(cfg: &DatasetConfig) -> Result<InMemoryDataset, DatasetError> {
    cfg.validate()?;
    let path = cfg.path.as_path();
    let pq_err = |source| DatasetError::Parquet {
        path: path.to_path_buf(),
        source,
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(open(path)?).map_err(pq_err)?;
    let schema = builder.schema().clone();
    // Checked once against the schema, so a wrong column is one error naming its type
    // rather than one per row.
    let check = |field: &FieldPath, top_ok: fn(&DataType) -> bool, top_expected| {
        let Ok(idx) = schema.index_of(field.head()) else {
            let available: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(DatasetError::MissingColumn {
                path: path.to_path_buf(),
                field: field.head().to_string(),
                available: available.join(", "),
            });
        };
        let t = schema.field(idx).data_type();
        let (ok, expected) = if field.is_top_level() {
            (top_ok(t), top_expected)
        } else {
            (
                matches!(t, DataType::Struct(_)),
                "a struct column (the field path goes into it)",
            )
        };
        if !ok {
            return Err(DatasetError::ColumnType {
                path: path.to_path_buf(),
                field: field.head().to_string(),
                found: t.to_string(),
                expected,
            });
        }
        Ok(())
    };
    if cfg.prompt_rendered {
        // No prompt column to check.
    } else if cfg.prompt_messages {
        check(
            &cfg.prompt_field,
            |t| matches!(t, DataType::List(_) | DataType::LargeList(_)),
            "a list of {role, content} structs",
        )?;
    } else {
        check(&cfg.prompt_field, is_string_type, "a string column")?;
    }
    check(
        &cfg.answer_field,
        |t| is_string_type(t) || is_number_type(t),
        "a string or number column",
    )?;
    // Small batches keep decoded-but-unchecked data small relative to the row cap.
    let reader = builder.with_batch_size(256).build().map_err(pq_err)?;
    let mut records = Vec::new();
    let mut row = 0usize;
    for batch in reader {
        let batch = batch.map_err(|source| DatasetError::Arrow {
            path: path.to_path_buf(),
            source,
        })?;
        for i in 0..batch.num_rows() {
            row += 1;
            let at = RowRef::Row(row);
            let mut size = 0usize;
            let mut obj = Map::new();
            for (c, col) in batch.columns().iter().enumerate() {
                if let Some(v) = json_value(col.as_ref(), i) {
                    size = size.saturating_add(json_size(&v));
                    obj.insert(schema.field(c).name().clone(), v);
                }
            }
            if size > cfg.max_row_bytes {
                return Err(DatasetError::RowTooLarge {
                    path: path.to_path_buf(),
                    at,
                    cap: cfg.max_row_bytes,
                });
            }
            records.push(record_from_object(obj, cfg, at)?);
        }
    }
    Ok(InMemoryDataset::new(records))
}

/// A ChaCha8 generator seeded from up to four 64-bit words laid out in its 32-byte seed, so
/// distinct tuples never share a stream (unlike adding or xoring seeds together).
pub(crate) fn seeded_rng(words: [u64; 4]) -> ChaCha8Rng {
    let mut seed = [0u8; 32];
    for (chunk, w) in seed.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    ChaCha8Rng::from_seed(seed)
}

/// A uniform integer in `0..n` (0 when `n == 0`), by rejection so it is unbiased. Written out
/// rather than taken from `rand` so that shuffles and generated problems stay identical
/// across `rand` versions: ChaCha8's output stream is fixed, this mapping is ours.
pub(crate) fn uniform_below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    // 2^64 mod n values at the top would bias the result; redraw when we land there.
    let rem = (u64::MAX % n + 1) % n;
    loop {
        let x = rng.next_u64();
        if x <= u64::MAX - rem {
            return x % n;
        }
    }
}

/// A uniform float in `[0, 1)` with 53 random bits.
pub(crate) fn uniform_f64(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Where a [`Sampler`] is: the next index it yields is position `offset` of epoch `epoch`'s
/// permutation. Save it with a checkpoint; [`Sampler::resume`] continues exactly there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct SamplerCursor {
    /// Passes over the data completed so far.
    pub epoch: u64,
    /// Position within the current epoch's permutation.
    pub offset: usize,
}

/// An endless stream of dataset indices: each epoch is a permutation of `0..len` seeded by
/// `(seed, epoch)`, so the order is reproducible, differs between epochs, and can be resumed
/// from a [`SamplerCursor`] without replaying earlier epochs.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// Dataset length.
    len: usize,
    /// Base seed of every epoch's permutation.
    seed: u64,
    /// Next position to yield.
    cursor: SamplerCursor,
    /// The current epoch's permutation (computed on entering the epoch).
    order: Vec<usize>,
}

impl Sampler {
    /// Starts at epoch 0, offset 0.
    pub fn new(len: usize, seed: u64) -> Sampler {
        Sampler {
            len,
            seed,
            cursor: SamplerCursor::default(),
            order: Sampler::permutation(len, seed, 0),
        }
    }

    /// Continues from `cursor` (as returned by [`Sampler::cursor`]).
    pub fn resume(len: usize, seed: u64, cursor: SamplerCursor) -> Result<Sampler, DatasetError> {
        if cursor.offset > len {
            return Err(DatasetError::Cursor {
                offset: cursor.offset,
                len,
            });
        }
        Ok(Sampler {
            len,
            seed,
            cursor,
            order: Sampler::permutation(len, seed, cursor.epoch),
        })
    }

    /// Where the sampler is; the next index is at this position.
    pub fn cursor(&self) -> SamplerCursor {
        self.cursor
    }

    /// The permutation of `0..len` for `epoch` (Fisher–Yates over ChaCha8 seeded by
    /// `(seed, epoch)`).
    pub fn permutation(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
        // The tag keeps shuffles apart from other users of `seeded_rng` with the same seed.
        const SHUFFLE_STREAM: u64 = 0x5348_5546_464c_4521;
        let mut rng = seeded_rng([seed, epoch, SHUFFLE_STREAM, 0]);
        let mut order: Vec<usize> = (0..len).collect();
        for i in (1..len).rev() {
            let j = uniform_below(&mut rng, i as u64 + 1) as usize;
            order.swap(i, j);
        }
        order
    }
}

impl Iterator for Sampler {
    type Item = usize;

    /// The next index; `None` only for an empty dataset (the stream is otherwise endless).
    fn next(&mut self) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        if self.cursor.offset >= self.len {
            self.cursor = SamplerCursor {
                epoch: self.cursor.epoch + 1,
                offset: 0,
            };
            self.order = Sampler::permutation(self.len, self.seed, self.cursor.epoch);
        }
        let i = self.order.get(self.cursor.offset).copied();
        self.cursor.offset += 1;
        i
    }
}

/// Why a dataset task's data is unusable. Each names the file, the row and the field.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be read, or a row lacks a field or has the wrong type.
    #[error("dataset")]
    Load(#[from] DatasetError),
    /// The file has no rows.
    #[error("dataset: {}: no rows (expected one row per line with fields `{prompt}` and `{answer}`)", path.display())]
    Empty {
        path: PathBuf,
        /// The prompt field a row needs.
        prompt: String,
        /// The answer field a row needs.
        answer: String,
    },
    /// The template names a field the row does not have.
    #[error("dataset: {}: {at}: the template names field `{field}`, which the row does not have", path.display())]
    UnknownField {
        path: PathBuf,
        at: RowRef,
        field: String,
    },
    /// A field used in the template, or as system text or id, is not text.
    #[error("dataset: {}: {at}: field `{field}` is {found}, expected {expected}", path.display())]
    FieldType {
        path: PathBuf,
        at: RowRef,
        field: String,
        found: &'static str,
        expected: &'static str,
    },
    /// The reference answer is nothing the verifier can match: even the answer itself, boxed,
    /// would score 0.
    #[error("dataset: {}: {at}: field `{field}`: the math verifier cannot parse the answer {answer:?}", path.display())]
    UnparsableAnswer {
        path: PathBuf,
        at: RowRef,
        field: String,
        answer: String,
    },
    /// A countdown row's numbers or target is not what the game needs.
    #[error("dataset: {}: {at}: field `{field}`: {reason}", path.display())]
    BadCountdown {
        path: PathBuf,
        at: RowRef,
        field: String,
        reason: String,
    },
    /// A code row's tests are not in a shape the code reward reads.
    #[error("dataset: {}: {at}: field `{field}`: {reason}", path.display())]
    BadCodeTests {
        path: PathBuf,
        at: RowRef,
        field: String,
        reason: String,
    },
    /// `--resume` with a config whose data is not the checkpoint's.
    #[error("dataset: cannot resume")]
    Resume(#[source] CursorMismatch),
    /// After holding out `heldout_fraction`, no training rows are left.
    #[error("dataset: holding out a fraction of {fraction} leaves no training rows")]
    NoTrainingRows { fraction: f64 },
}

/// Why a checkpoint's data cursor does not fit the config it is resumed with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CursorMismatch {
    /// The files (their number, rows or bytes) differ.
    #[error("the checkpoint trained on [{checkpoint}], the config loads [{config}]; resume with the files it trained on, or start a new run")]
    Files { checkpoint: String, config: String },
    /// `shuffle_seed` differs.
    #[error("the checkpoint's shuffle_seed is {checkpoint}, the config's {config}")]
    ShuffleSeed { checkpoint: u64, config: u64 },
    /// The walk starts at another task seed (another run seed).
    #[error(
        "the checkpoint's data walk starts at task seed {checkpoint}, the config's at {config}"
    )]
    Origin { checkpoint: u64, config: u64 },
    /// The epoch length differs (file weights, or the held-out fraction, changed).
    #[error("the checkpoint's epochs hold {checkpoint} rows, the config's {config} (weights or heldout_fraction changed)")]
    EpochLen { checkpoint: u64, config: u64 },
    /// Everything above agrees, but the next row is another one.
    #[error("the checkpoint's next row is {checkpoint}, the config's {config}")]
    NextRow { checkpoint: String, config: String },
}
