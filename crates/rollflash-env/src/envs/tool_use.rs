//! Tool use: arithmetic too long to do in one's head, with a calculator the model must call.
//!
//! The first observation asks a question such as `What is 7321*48?` and states the protocol.
//! Each turn the model either calls the calculator, `<tool>calc: 7321*48</tool>`, and gets
//! `<result>351408</result>` back (or `<result>error: ...</result>`), or answers,
//! `<answer>351408</answer>`, which ends the episode with reward 1 when the integer is right
//! and 0 otherwise (with `require_tool`, a right answer only counts after at least one tool
//! call, to reward the behaviour and not just the luck). An episode is truncated after
//! `max_turns` turns without an answer.
//!
//! **Parsing**: the *first* complete `<tool>…</tool>` or `<answer>…</answer>` in the action is
//! used, whichever opens first; anything after it is ignored, because text after a tool call
//! was written before the result existed (a model imagining its own `<result>`). A closing tag
//! may be missing (generation often stops on it): the rest of the text is then the content.
//! Inside `<tool>`, `name: input` picks the tool (only `calc`/`calculator` exists; no name
//! means `calc`). Answers ignore spaces, commas and underscores and must be an integer. A turn
//! with neither tag is an invalid move: a reminder of the format, reward
//! `-invalid_action_penalty`, and the turn counts.
//!
//! **Calculator** ([`calc`]): integers only (i128, checked), `+ - * /` (division truncates
//! toward zero), parentheses and unary minus, at most [`MAX_EXPR_LEN`] bytes and
//! [`MAX_DEPTH`] levels of nesting; every failure is an error message, never a panic.

use async_trait::async_trait;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{check_finite, config_error, out_of_order};
use crate::env::{Env, EnvError, Info, Reset, Step};

/// Longest expression the calculator accepts, in bytes: a guard against pathological input.
pub const MAX_EXPR_LEN: usize = 256;

/// Deepest nesting of parentheses and unary signs the calculator accepts, so recursion stays
/// shallow whatever the input.
pub const MAX_DEPTH: usize = 32;

/// Why the calculator could not evaluate an expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalcError {
    #[error("expression longer than {MAX_EXPR_LEN} bytes")]
    TooLong,
    #[error("expression nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("integer overflow")]
    Overflow,
    #[error("division by zero")]
    DivisionByZero,
    #[error("syntax error at byte {pos}: {message}")]
    Syntax { pos: usize, message: String },
}

/// Evaluates an integer expression (see the module docs for the grammar and limits).
pub fn calc(expr: &str) -> Result<i128, CalcError> {
    if expr.len() > MAX_EXPR_LEN {
        return Err(CalcError::TooLong);
    }
    let mut p = Parser {
        s: expr.as_bytes(),
        pos: 0,
    };
    let v = p.expr(0)?;
    p.skip_ws();
    if p.pos < p.s.len() {
        return Err(p.syntax("unexpected character"));
    }
    Ok(v)
}

/// A recursive-descent parser over bytes: `expr := term (('+'|'-') term)*`,
/// `term := factor (('*'|'/') factor)*`, `factor := ('+'|'-') factor | '(' expr ')' | digits`.
struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.pos).is_some_and(u8::is_ascii_whitespace) {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }

    fn syntax(&self, message: &str) -> CalcError {
        CalcError::Syntax {
            pos: self.pos,
            message: message.to_string(),
        }
    }

    fn expr(&mut self, depth: usize) -> Result<i128, CalcError> {
        let mut v = self.term(depth)?;
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.pos += 1;
            let r = self.term(depth)?;
            v = if op == b'+' {
                v.checked_add(r)
            } else {
                v.checked_sub(r)
            }
            .ok_or(CalcError::Overflow)?;
        }
        Ok(v)
    }

    fn term(&mut self, depth: usize) -> Result<i128, CalcError> {
        let mut v = self.factor(depth)?;
        while let Some(op @ (b'*' | b'/')) = self.peek() {
            self.pos += 1;
            let r = self.factor(depth)?;
            v = if op == b'*' {
                v.checked_mul(r).ok_or(CalcError::Overflow)?
            } else if r == 0 {
                return Err(CalcError::DivisionByZero);
            } else {
                v.checked_div(r).ok_or(CalcError::Overflow)?
            };
        }
        Ok(v)
    }

    fn factor(&mut self, depth: usize) -> Result<i128, CalcError> {
        if depth >= MAX_DEPTH {
            return Err(CalcError::TooDeep);
        }
        match self.peek() {
            Some(b'-') => {
                self.pos += 1;
                self.factor(depth + 1)?
                    .checked_neg()
                    .ok_or(CalcError::Overflow)
            }
            Some(b'+') => {
                self.pos += 1;
                self.factor(depth + 1)
            }
            Some(b'(') => {
                self.pos += 1;
                let v = self.expr(depth + 1)?;
                if self.peek() != Some(b')') {
                    return Err(self.syntax("expected ')'"));
                }
                self.pos += 1;
                Ok(v)
            }
            Some(c) if c.is_ascii_digit() => {
                let mut v: i128 = 0;
                while let Some(d) = self.s.get(self.pos).filter(|c| c.is_ascii_digit()) {
                    v = v
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(i128::from(d - b'0')))
                        .ok_or(CalcError::Overflow)?;
                    self.pos += 1;
                }
                Ok(v)
            }
            Some(_) => Err(self.syntax("expected a number, '(' or a sign")),
            None => Err(self.syntax("unexpected end of expression")),
        }
    }
}

/// Configuration of [`ToolUse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolUseConfig {
    /// Turns (tool calls plus the answer) before truncation (default 4).
    pub max_turns: u32,
    /// Reward a right answer only if the calculator was called at least once (default false).
    pub require_tool: bool,
    /// Digits of the large operand (default 4): together with `small_digits` this sets how
    /// hard the question is to do without the tool.
    pub large_digits: u32,
    /// Digits of the small operands (default 2).
    pub small_digits: u32,
    /// Penalty (subtracted from the reward) for a turn with neither a tool call nor an answer.
    pub invalid_action_penalty: f64,
}

impl Default for ToolUseConfig {
    fn default() -> Self {
        ToolUseConfig {
            max_turns: 4,
            require_tool: false,
            large_digits: 4,
            small_digits: 2,
            invalid_action_penalty: 0.0,
        }
    }
}

impl ToolUseConfig {
    /// Checks ranges; errors name the field.
    pub fn validate(&self) -> Result<(), EnvError> {
        if self.max_turns == 0 {
            return Err(config_error("max_turns", "must be at least 1"));
        }
        // Nine digits keep every question's value far inside i64.
        for (field, v) in [
            ("large_digits", self.large_digits),
            ("small_digits", self.small_digits),
        ] {
            if !(1..=9).contains(&v) {
                return Err(config_error(field, format!("must be in 1..=9, got {v}")));
            }
        }
        check_finite("invalid_action_penalty", self.invalid_action_penalty)
    }
}

/// A random integer with exactly `digits` digits.
fn operand(rng: &mut ChaCha8Rng, digits: u32) -> i128 {
    let low = if digits <= 1 {
        1
    } else {
        10i128.pow(digits - 1)
    };
    rng.random_range(low..10i128.pow(digits))
}

/// The question for `seed`: one of `a*b`, `a*b+c`, `a*b-c` and `(a+c)*b`, with `a` large and
/// `b`, `c` small.
pub fn question(cfg: &ToolUseConfig, seed: u64) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let a = operand(&mut rng, cfg.large_digits);
    let b = operand(&mut rng, cfg.small_digits);
    let c = operand(&mut rng, cfg.small_digits);
    match rng.random_range(0..4) {
        0 => format!("{a}*{b}"),
        1 => format!("{a}*{b}+{c}"),
        2 => format!("{a}*{b}-{c}"),
        _ => format!("({a}+{c})*{b}"),
    }
}

/// What the model did in one turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolAction {
    /// `<tool>name: input</tool>`; `name` is lowercased, empty when omitted.
    Tool { name: String, input: String },
    /// `<answer>text</answer>`.
    Answer(String),
    /// Neither tag.
    Invalid,
}

/// Parses one turn (see the module docs for the rule).
pub fn parse_action(text: &str) -> ToolAction {
    let tool = text.find("<tool>");
    let answer = text.find("<answer>");
    let (open, close, is_tool) = match (tool, answer) {
        (Some(t), Some(a)) if t < a => (t + "<tool>".len(), "</tool>", true),
        (Some(t), None) => (t + "<tool>".len(), "</tool>", true),
        (_, Some(a)) => (a + "<answer>".len(), "</answer>", false),
        (None, None) => return ToolAction::Invalid,
    };
    let rest = &text[open..];
    let content = rest.find(close).map_or(rest, |end| &rest[..end]).trim();
    if !is_tool {
        return ToolAction::Answer(content.to_string());
    }
    match content.split_once(':') {
        Some((name, input)) => ToolAction::Tool {
            name: name.trim().to_ascii_lowercase(),
            input: input.trim().to_string(),
        },
        None => ToolAction::Tool {
            name: String::new(),
            input: content.to_string(),
        },
    }
}

/// Runs a tool call and returns the text inside `<result>`.
pub fn run_tool(name: &str, input: &str) -> String {
    match name {
        "" | "calc" | "calculator" => match calc(input) {
            Ok(v) => v.to_string(),
            Err(e) => format!("error: {e}"),
        },
        other => {
            // Echo a bounded, printable name: the observation must stay short and ASCII.
            let shown: String = other
                .chars()
                .filter(|c| c.is_ascii_graphic())
                .take(20)
                .collect();
            format!("error: unknown tool `{shown}`; available: calc")
        }
    }
}

/// Reads an answer as an integer, ignoring spaces, commas and underscores.
fn parse_answer(text: &str) -> Option<i128> {
    let cleaned: String = text
        .chars()
        .filter(|c| !c.is_whitespace() && *c != ',' && *c != '_')
        .collect();
    cleaned.parse().ok()
}

/// The live part of an episode.
#[derive(Debug)]
struct Episode {
    expected: i128,
    turns: u32,
    tool_calls: u32,
    done: bool,
}

/// The tool-use environment (see the module docs).
#[derive(Debug)]
pub struct ToolUse {
    cfg: ToolUseConfig,
    episode: Option<Episode>,
}

impl ToolUse {
    /// Builds the environment; fails on an invalid config.
    pub fn new(cfg: ToolUseConfig) -> Result<Self, EnvError> {
        cfg.validate()?;
        Ok(ToolUse { cfg, episode: None })
    }

    /// The configuration.
    pub fn config(&self) -> &ToolUseConfig {
        &self.cfg
    }
}

fn info(ep: &Episode) -> Info {
    let mut info = Info::new();
    info.insert("turns".into(), json!(ep.turns));
    info.insert("tool_calls".into(), json!(ep.tool_calls));
    // i128 is not a JSON number for every reader; questions stay far inside i64.
    info.insert("expected".into(), json!(ep.expected.to_string()));
    info
}

#[async_trait]
impl Env for ToolUse {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        let q = question(&self.cfg, seed);
        let expected = calc(&q).map_err(|e| EnvError::Internal {
            what: format!("tool_use: question {q}"),
            source: Box::new(e),
        })?;
        let observation = format!(
            "What is {q}?\nCall the calculator with <tool>calc: EXPR</tool>, \
             then reply <answer>NUMBER</answer>."
        );
        let ep = Episode {
            expected,
            turns: 0,
            tool_calls: 0,
            done: false,
        };
        let info = info(&ep);
        self.episode = Some(ep);
        Ok(Reset { observation, info })
    }

    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let cfg = &self.cfg;
        let ep = match &mut self.episode {
            Some(ep) if !ep.done => ep,
            other => return Err(out_of_order("tool_use", other.is_some())),
        };
        ep.turns += 1;
        let parsed = parse_action(action);
        let (observation, reward, terminated, correct) = match &parsed {
            ToolAction::Tool { name, input } => {
                ep.tool_calls += 1;
                (
                    format!("<result>{}</result>", run_tool(name, input)),
                    0.0,
                    false,
                    None,
                )
            }
            ToolAction::Answer(text) => {
                let correct = parse_answer(text) == Some(ep.expected);
                let earned = correct && (!cfg.require_tool || ep.tool_calls > 0);
                let verdict = if correct { "Correct." } else { "Wrong." };
                (
                    verdict.to_string(),
                    if earned { 1.0 } else { 0.0 },
                    true,
                    Some(correct),
                )
            }
            ToolAction::Invalid => (
                "Invalid turn: call <tool>calc: EXPR</tool> or reply <answer>NUMBER</answer>."
                    .to_string(),
                -cfg.invalid_action_penalty,
                false,
                None,
            ),
        };
        // Gymnasium's TimeLimit: the last allowed turn is truncated, answered or not.
        let truncated = ep.turns >= cfg.max_turns;
        ep.done = terminated || truncated;
        let mut info = info(ep);
        info.insert(
            "invalid_action".into(),
            json!(parsed == ToolAction::Invalid),
        );
        if let Some(c) = correct {
            info.insert("correct".into(), json!(c));
        }
        Ok(Step {
            observation,
            reward,
            terminated,
            truncated,
            info,
        })
    }
}
