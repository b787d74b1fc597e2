//! Dotted field paths into a row (`reward_model.ground_truth`): parsed once when a config is read, then followed through the row's JSON objects (Parquet structs load as objects) for every row.
//!
//! A path is one or more keys separated by `.`; each key is followed into an object. There
//! is no escaping, so a key that itself contains a dot cannot be named (verl's and TRL's
//! files do not use such keys). Lists are not indexed: a path stops at the first list.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A parsed field path: the text as written and its keys. Compared, hashed and serialised
/// as the text.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct FieldPath(
    // Behind one pointer: a task config holds several paths and is moved by value inside the
    // environment config enum, and is cloned for every environment made from it.
    Arc<Parsed>,
);

#[derive(PartialEq, Eq, Hash)]
struct Parsed {
    /// As written, e.g. `reward_model.ground_truth`.
    text: String,
    /// The keys, at least one, none empty.
    keys: Vec<String>,
}

/// Why a field path is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldPathError {
    /// The path is the empty string.
    #[error("a field path must not be empty")]
    Empty,
    /// A key between dots is empty (`a..b`, `.a`, `a.`).
    #[error("field path `{path}`: key {position} is empty (keys are separated by single dots)")]
    EmptyKey {
        path: String,
        /// 1-based position of the empty key.
        position: usize,
    },
}

/// Why a field path does not lead to a value in a row. `parent` is the part of the path
/// already followed (empty at the row itself).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathMiss {
    /// An object on the way lacks the next key.
    #[error(
        "{} has no key `{key}` (its keys: {})",
        parent_name(parent),
        keys_line(keys)
    )]
    MissingKey {
        parent: String,
        key: String,
        /// The keys the object does have, so a typo is easy to see.
        keys: Vec<String>,
    },
    /// A value on the way is not an object, so the path cannot go into it.
    #[error("`{parent}` is {found}, not an object, so it has no key `{key}`")]
    NotAnObject {
        parent: String,
        key: String,
        found: &'static str,
    },
}

fn parent_name(parent: &str) -> String {
    if parent.is_empty() {
        "the row".into()
    } else {
        format!("`{parent}`")
    }
}

fn keys_line(keys: &[String]) -> String {
    // A wide row would make the message unreadable; the first few keys show a typo.
    const SHOWN: usize = 12;
    let mut line = keys
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > SHOWN {
        line.push_str(&format!(", … ({} in all)", keys.len()));
    }
    if line.is_empty() {
        line.push_str("none");
    }
    line
}

/// The JSON type of `v`, as an error message names it ("a string", "an object").
pub(crate) fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl FieldPath {
    /// Parses `text`: keys separated by `.`, none empty.
    pub fn parse(text: &str) -> Result<FieldPath, FieldPathError> {
        if text.is_empty() {
            return Err(FieldPathError::Empty);
        }
        let keys: Vec<String> = text.split('.').map(str::to_string).collect();
        if let Some(i) = keys.iter().position(String::is_empty) {
            return Err(FieldPathError::EmptyKey {
                path: text.to_string(),
                position: i + 1,
            });
        }
        Ok(FieldPath(Arc::new(Parsed {
            text: text.to_string(),
            keys,
        })))
    }

    /// A path known to be valid (a non-empty literal without dots at the ends or doubled),
    /// for this crate's defaults.
    pub(crate) fn known(text: &'static str) -> FieldPath {
        FieldPath(Arc::new(Parsed {
            text: text.to_string(),
            keys: text.split('.').map(str::to_string).collect(),
        }))
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.0.text
    }

    /// The keys, outermost first (at least one).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys.iter().map(String::as_str)
    }

    /// The first key: the JSONL key or Parquet column the path starts in.
    pub fn head(&self) -> &str {
        self.0.keys.first().map_or("", String::as_str)
    }

    /// Whether the path is a single key (a top-level field, as before paths existed).
    pub fn is_top_level(&self) -> bool {
        self.0.keys.len() == 1
    }

    /// The value the path leads to in `row`.
    pub fn lookup<'a>(&self, row: &'a Map<String, Value>) -> Result<&'a Value, PathMiss> {
        let missing =
            |object: &Map<String, Value>, parent: String, key: &str| PathMiss::MissingKey {
                parent,
                key: key.to_string(),
                keys: object.keys().cloned().collect(),
            };
        let mut object = row;
        let mut parent = String::new();
        for (i, key) in self.0.keys.iter().enumerate() {
            let Some(v) = object.get(key) else {
                return Err(missing(object, parent, key));
            };
            let Some(next) = self.0.keys.get(i + 1) else {
                return Ok(v);
            };
            if !parent.is_empty() {
                parent.push('.');
            }
            parent.push_str(key);
            match v {
                Value::Object(o) => object = o,
                other => {
                    return Err(PathMiss::NotAnObject {
                        parent,
                        key: next.to_string(),
                        found: json_type_name(other),
                    })
                }
            }
        }
        // Only a path without keys gets here, and parsing never makes one.
        Err(missing(object, parent, ""))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl FromStr for FieldPath {
    type Err = FieldPathError;
    fn from_str(s: &str) -> Result<FieldPath, FieldPathError> {
        FieldPath::parse(s)
    }
}

impl TryFrom<String> for FieldPath {
    type Error = FieldPathError;
    fn try_from(s: String) -> Result<FieldPath, FieldPathError> {
        FieldPath::parse(&s)
    }
}

impl TryFrom<&str> for FieldPath {
    type Error = FieldPathError;
    fn try_from(s: &str) -> Result<FieldPath, FieldPathError> {
        FieldPath::parse(s)
    }
}

impl From<FieldPath> for String {
    fn from(p: FieldPath) -> String {
        p.as_str().to_string()
    }
}

impl PartialEq<str> for FieldPath {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for FieldPath {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}
