//! Chat prompts: conversations rendered into model text with Hugging Face chat templates (Jinja),
//! the way transformers' `apply_chat_template` renders them, and the built-in template.
//!
//! transformers renders with Python's jinja2 (`trim_blocks`, `lstrip_blocks`, its own `tojson`
//! and `raise_exception`); templates also call Python string methods. We render with minijinja
//! and supply those pieces here, so the same template gives the same text.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use minijinja::value::{from_args, Kwargs, ValueKind};
use minijinja::{escape_formatter, Environment, Error, ErrorKind, Output, State, Value};
use serde::{Deserialize, Serialize};

use crate::tokenizer_config::{config_token, read_tokenizer_config};
use crate::{ModelError, Result};

// Callers name it `chat::BUILTIN_CHAT_TEMPLATE`; it lives with the config reader because the
// built-in tokenizer's saved `tokenizer_config.json` carries it too.
pub use crate::tokenizer_config::BUILTIN_CHAT_TEMPLATE;

/// The name the template is stored under in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation, as in transformers' `messages` list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`; templates branch on it.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A parsed chat template with the special tokens it may refer to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    /// Holds the parsed template and the jinja2/transformers compatibility functions.
    env: Environment<'static>,
    /// Passed to the template as `bos_token`; left undefined when `None`, as transformers does.
    bos: Option<String>,
    /// Passed to the template as `eos_token`; left undefined when `None`.
    eos: Option<String>,
}

impl ChatTemplate {
    /// Parses a Jinja chat template; syntax errors are reported here, not at render time.
    pub fn new(source: &str, bos: Option<String>, eos: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        // jinja2's settings in transformers' `_compile_jinja_template`.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", py_tojson);
        env.set_unknown_method_callback(py_method);
        env.set_formatter(py_format);
        // No `strftime_now`: Llama 3 templates then fall back to their fixed date, which keeps
        // rendering (and so training data) independent of the day it runs.
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(ModelError::Template)?;
        Ok(ChatTemplate { env, bos, eos })
    }

    /// The built-in template ([`BUILTIN_CHAT_TEMPLATE`]) with the built-in tokenizer's
    /// `<bos>`/`<eos>`.
    pub fn builtin() -> Result<Self> {
        Self::new(
            BUILTIN_CHAT_TEMPLATE,
            Some("<bos>".to_string()),
            Some("<eos>".to_string()),
        )
    }

    /// Reads `chat_template` from a `tokenizer_config.json`, with its `bos_token`/`eos_token`.
    ///
    /// `chat_template` is a string, or a list of `{name, template}` of which the one named
    /// `default` is taken. `Ok(None)` when the config has no chat template.
    pub fn from_tokenizer_config(path: &Path) -> Result<Option<Self>> {
        let config = read_tokenizer_config(path)?;
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(templates)) => {
                let default = templates
                    .iter()
                    .find(|t| t.get("name").and_then(serde_json::Value::as_str) == Some("default"));
                match default
                    .and_then(|t| t.get("template"))
                    .and_then(serde_json::Value::as_str)
                {
                    Some(s) => s.to_string(),
                    None => {
                        return Err(ModelError::Config {
                            field: "chat_template".to_string(),
                            reason: format!(
                                "{}: a list of templates without one named `default`",
                                path.display()
                            ),
                        })
                    }
                }
            }
            Some(_) => {
                return Err(ModelError::Config {
                    field: "chat_template".to_string(),
                    reason: format!("{}: neither a string nor a list", path.display()),
                })
            }
        };
        let bos = config_token(&config, "bos_token");
        let eos = config_token(&config, "eos_token");
        Self::new(&source, bos, eos).map(Some)
    }

    /// Renders `messages`; `add_generation_prompt` appends the start of an assistant turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// Renders with extra template variables, as keyword arguments of `apply_chat_template` do
    /// (for example `enable_thinking: false` for Qwen3). Extra variables override the standard
    /// ones.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        // transformers passes these as None rather than leaving them undefined; templates test
        // `tools is not none`.
        ctx.insert("tools".into(), Value::from(()));
        ctx.insert("documents".into(), Value::from(()));
        if let Some(bos) = &self.bos {
            ctx.insert("bos_token".into(), Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos {
            ctx.insert("eos_token".into(), Value::from(eos.as_str()));
        }
        for (key, value) in extra {
            ctx.insert(key.clone(), Value::from_serialize(value));
        }
        self.env
            .get_template(TEMPLATE_NAME)
            .and_then(|t| t.render(ctx))
            .map_err(ModelError::Template)
    }
}

/// Prints values as jinja2 does: Python's `True`, `False` and `None`, where minijinja would print
/// `true`, `false` and `none`.
fn py_format(out: &mut Output, state: &State, value: &Value) -> std::result::Result<(), Error> {
    let text = match value.kind() {
        ValueKind::Bool if value.is_true() => "True",
        ValueKind::Bool => "False",
        ValueKind::None => "None",
        _ => return escape_formatter(out, state, value),
    };
    out.write_str(text).map_err(Error::from)
}

/// transformers' `raise_exception(message)`: templates reject conversations they cannot render.
fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`. minijinja's own `tojson` HTML-escapes `<`, `>`,
/// `&` and `'`, and separates items with `,` rather than `, `, which changes the prompt.
fn py_tojson(
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, Error> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_str(), v.as_i64()) {
            (Some(s), _) => Some(s.to_string()),
            (None, Some(n)) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            _ => return Err(invalid("tojson: indent must be an integer or a string")),
        },
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Value>>("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(seps) if !seps.is_none() => {
            let item = seps.get_item(&Value::from(0))?;
            let key = seps.get_item(&Value::from(1))?;
            match (item.as_str(), key.as_str()) {
                (Some(i), Some(k)) => (i.to_string(), k.to_string()),
                _ => return Err(invalid("tojson: separators must be two strings")),
            }
        }
        // Python's defaults: no space before the newline when indenting.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let mut out = Vec::new();
    let formatter = PyJsonFormatter {
        item_sep,
        key_sep,
        indent,
        depth: 0,
        has_value: false,
    };
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    let written = if sort_keys {
        serde_json::to_value(value)
            .map(sort_json_keys)
            .and_then(|v| v.serialize(&mut ser))
    } else {
        value.serialize(&mut ser)
    };
    written.map_err(|e| invalid("tojson: cannot serialize").with_source(e))?;
    let text = String::from_utf8(out).map_err(|e| invalid("tojson: not UTF-8").with_source(e))?;
    if !ensure_ascii {
        return Ok(Value::from(text));
    }
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            escaped.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                escaped.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    Ok(Value::from(escaped))
}

fn sort_json_keys(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_json_keys(v)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sort_json_keys).collect())
        }
        other => other,
    }
}

/// Writes JSON the way Python's `json.dumps` does, with its separators and indentation.
struct PyJsonFormatter {
    item_sep: String,
    key_sep: String,
    indent: Option<String>,
    depth: usize,
    /// Whether the container being closed had elements (an empty one closes on the same line).
    has_value: bool,
}

impl PyJsonFormatter {
    fn newline<W: ?Sized + io::Write>(&self, w: &mut W) -> io::Result<()> {
        if let Some(indent) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.depth {
                w.write_all(indent.as_bytes())?;
            }
        }
        Ok(())
    }

    fn open<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    fn close<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth = self.depth.saturating_sub(1);
        if self.has_value {
            self.newline(w)?;
        }
        w.write_all(bracket)
    }

    fn element<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if !first {
            w.write_all(self.item_sep.as_bytes())?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for PyJsonFormatter {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"[")
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.element(w, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.element(w, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(self.key_sep.as_bytes())
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

fn invalid(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_string())
}

/// Python methods that chat templates call on strings and dicts (`content.strip()`,
/// `message.content.startswith(..)`, `tool.items()`), which minijinja does not have.
fn py_method(
    _state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, Error> {
    match value.kind() {
        ValueKind::String => str_method(value.as_str().unwrap_or_default(), method, args),
        ValueKind::Map => map_method(value, method, args),
        _ => Err(Error::from(ErrorKind::UnknownMethod)),
    }
}

fn str_method(s: &str, method: &str, args: &[Value]) -> std::result::Result<Value, Error> {
    let rv = match method {
        "strip" | "lstrip" | "rstrip" => {
            let (chars,): (Option<&str>,) = from_args(args)?;
            let is_stripped = |c: char| chars.map_or(c.is_whitespace(), |set| set.contains(c));
            let s = if method != "rstrip" {
                s.trim_start_matches(is_stripped)
            } else {
                s
            };
            let s = if method != "lstrip" {
                s.trim_end_matches(is_stripped)
            } else {
                s
            };
            Value::from(s)
        }
        "lower" | "upper" | "title" | "capitalize" => {
            let () = from_args(args)?;
            Value::from(match method {
                "lower" => s.to_lowercase(),
                "upper" => s.to_uppercase(),
                "title" => py_title(s),
                _ => py_capitalize(s),
            })
        }
        "startswith" | "endswith" => {
            let (affix,): (Value,) = from_args(args)?;
            let test = |a: &str| {
                if method == "startswith" {
                    s.starts_with(a)
                } else {
                    s.ends_with(a)
                }
            };
            // Python accepts one string or a tuple of them.
            let hit = match affix.as_str() {
                Some(a) => test(a),
                None => {
                    let mut hit = false;
                    for item in affix.try_iter()? {
                        match item.as_str() {
                            Some(a) => hit |= test(a),
                            None => return Err(invalid("startswith/endswith takes strings")),
                        }
                    }
                    hit
                }
            };
            Value::from(hit)
        }
        "split" | "rsplit" => {
            let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
            let parts = py_split(s, sep, maxsplit.unwrap_or(-1), method == "rsplit")?;
            Value::from(parts.into_iter().map(Value::from).collect::<Vec<_>>())
        }
        "splitlines" => {
            let () = from_args(args)?;
            Value::from(s.lines().map(Value::from).collect::<Vec<_>>())
        }
        "replace" => {
            let (old, new, count): (&str, &str, Option<i64>) = from_args(args)?;
            Value::from(match count.and_then(|c| usize::try_from(c).ok()) {
                Some(count) => s.replacen(old, new, count),
                None => s.replace(old, new),
            })
        }
        "find" | "rfind" => {
            let (sub,): (&str,) = from_args(args)?;
            let at = if method == "find" {
                s.find(sub)
            } else {
                s.rfind(sub)
            };
            // Python counts characters, not bytes.
            Value::from(at.map_or(-1, |at| s[..at].chars().count() as i64))
        }
        "count" => {
            let (sub,): (&str,) = from_args(args)?;
            Value::from(s.matches(sub).count())
        }
        "join" => {
            let (items,): (Value,) = from_args(args)?;
            let mut parts = Vec::new();
            for item in items.try_iter()? {
                match item.as_str() {
                    Some(part) => parts.push(part.to_string()),
                    None => return Err(invalid("join takes an iterable of strings")),
                }
            }
            Value::from(parts.join(s))
        }
        "isdigit" | "isalpha" | "isalnum" | "isspace" | "islower" | "isupper" => {
            let () = from_args(args)?;
            let all = |f: fn(&char) -> bool| !s.is_empty() && s.chars().all(|c| f(&c));
            let has_cased = s.chars().any(char::is_alphabetic);
            Value::from(match method {
                "isdigit" => all(char::is_ascii_digit),
                "isalpha" => all(|c| c.is_alphabetic()),
                "isalnum" => all(|c| c.is_alphanumeric()),
                "isspace" => all(|c| c.is_whitespace()),
                "islower" => has_cased && !s.chars().any(char::is_uppercase),
                _ => has_cased && !s.chars().any(char::is_lowercase),
            })
        }
        _ => return Err(Error::from(ErrorKind::UnknownMethod)),
    };
    Ok(rv)
}

fn map_method(map: &Value, method: &str, args: &[Value]) -> std::result::Result<Value, Error> {
    match method {
        "items" | "keys" | "values" => {
            let () = from_args(args)?;
            let mut out = Vec::new();
            for key in map.try_iter()? {
                let value = map.get_item(&key)?;
                out.push(match method {
                    "items" => Value::from(vec![key, value]),
                    "keys" => key,
                    _ => value,
                });
            }
            Ok(Value::from(out))
        }
        "get" => {
            let (key, default): (Value, Option<Value>) = from_args(args)?;
            let value = map.get_item(&key)?;
            Ok(if value.is_undefined() {
                default.unwrap_or(Value::from(()))
            } else {
                value
            })
        }
        _ => Err(Error::from(ErrorKind::UnknownMethod)),
    }
}

/// Python's `str.split`/`str.rsplit`: without a separator, runs of whitespace separate and
/// leading/trailing whitespace yields no empty parts.
fn py_split(
    s: &str,
    sep: Option<&str>,
    maxsplit: i64,
    from_right: bool,
) -> std::result::Result<Vec<String>, Error> {
    let limit = usize::try_from(maxsplit).ok();
    let parts: Vec<String> = match sep {
        Some("") => return Err(invalid("empty separator")),
        Some(sep) => match (limit, from_right) {
            (None, _) => s.split(sep).map(String::from).collect(),
            (Some(n), false) => s.splitn(n + 1, sep).map(String::from).collect(),
            (Some(n), true) => {
                let mut parts: Vec<String> = s.rsplitn(n + 1, sep).map(String::from).collect();
                parts.reverse();
                parts
            }
        },
        None if !from_right || limit.is_none() => {
            let mut parts = Vec::new();
            let mut rest = s.trim_start();
            while !rest.is_empty() {
                if limit == Some(parts.len()) {
                    parts.push(rest.to_string());
                    break;
                }
                match rest.find(char::is_whitespace) {
                    Some(at) => {
                        parts.push(rest[..at].to_string());
                        rest = rest[at..].trim_start();
                    }
                    None => {
                        parts.push(rest.to_string());
                        break;
                    }
                }
            }
            parts
        }
        None => {
            let mut parts = Vec::new();
            let mut rest = s.trim_end();
            while !rest.is_empty() {
                if limit == Some(parts.len()) {
                    parts.push(rest.to_string());
                    break;
                }
                match rest.rfind(char::is_whitespace) {
                    Some(at) => {
                        let ws_len = rest[at..].chars().next().map_or(1, char::len_utf8);
                        parts.push(rest[at + ws_len..].to_string());
                        rest = rest[..at].trim_end();
                    }
                    None => {
                        parts.push(rest.to_string());
                        break;
                    }
                }
            }
            parts.reverse();
            parts
        }
    };
    Ok(parts)
}

/// Python's `str.title`: a letter is upper-cased after a non-letter, lower-cased after a letter.
fn py_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut after_letter = false;
    for c in s.chars() {
        if after_letter {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        after_letter = c.is_alphabetic();
    }
    out
}

/// Python's `str.capitalize`: first character upper-cased, the rest lower-cased.
fn py_capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first
            .to_uppercase()
            .chain(chars.flat_map(char::to_lowercase))
            .collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_split_matches_python() -> std::result::Result<(), Error> {
        assert_eq!(py_split("  a b  c ", None, -1, false)?, ["a", "b", "c"]);
        assert_eq!(py_split("  a b  c ", None, 1, false)?, ["a", "b  c "]);
        assert_eq!(py_split("  a b  c ", None, 1, true)?, ["  a b", "c"]);
        assert_eq!(
            py_split("a,b,,c", Some(","), -1, false)?,
            ["a", "b", "", "c"]
        );
        assert_eq!(py_split("a,b,c", Some(","), 1, true)?, ["a,b", "c"]);
        assert!(py_split("abc", Some(""), -1, false).is_err());
        Ok(())
    }

    #[test]
    fn python_case_methods() {
        assert_eq!(py_title("they're bill's 1st"), "They'Re Bill'S 1St");
        assert_eq!(py_capitalize("hELLO world"), "Hello world");
    }
}
