//! Math answer equivalence: extract the final answer from a response, normalise it, and
//! compare it to the reference by value.
//!
//! **Extraction** ([`extract_answer_with`]) consults the rules it is given, in the order given,
//! and the first that finds something wins; a rule not given is not consulted, so a mark of
//! its kind is just text (under `[Boxed, LastNumber]`, "the answer is 11." answers 11 by its
//! last number). The default order ([`Rule::ALL`], [`extract_answer`], [`MathVerifier`]'s
//! default):
//! 1. the last balanced `\boxed{…}` (or `\fbox{…}`);
//! 2. the last `<answer>…</answer>`;
//! 3. the rest of the line after the last `####` (GSM8K, and the built-in math task);
//! 4. the rest of the sentence after the last "answer is" / "answer:" (case-insensitive);
//! 5. the last number in the response, as plain text writes it (`1.5e3`, `3√2`, `π/3`, `25%`),
//!    not consulted by [`MathVerifier::strict`], and only when the response ends like a
//!    finished answer: with that number, or with one sentence closed by a full stop
//!    (`… = 14 pages.`). A response cut off mid-sentence has given no answer, whatever number
//!    it mentioned last. (The built-in task's unmarked `12+7=19 19+30=49` ends with its number,
//!    so its format-free accuracy still reads it.)
//!
//! **Normalisation** ([`normalize`]) strips `$…$`, `\(…\)`, `\[…\]`, `\left`/`\right`, LaTeX
//! spacing, units (`5\text{ cm}` → `5`, GSM8K's `45 minutes` → `45`; the unit is kept aside),
//! degree signs, a leading `x =` or `f(x) =` or `x \in`, a trailing `.`, thousands separators
//! (`1,234` → `1234`, but `1,2` stays a pair), and rewrites `\dfrac`/`\tfrac` to `\frac`. It
//! turns `or` / `and` between answers into commas (`x=1 \text{ or } x=2`), `a \pm b` into the
//! two answers `a+b, a-b`, an inequality in one variable into its interval (`1 \le x < 4` →
//! `[1,4)`, `x > -3` → `(-3,\infty)`), and every matrix environment into one form (`bmatrix`
//! = `pmatrix`).
//!
//! **Comparison** ([`equivalent`]): tuples, intervals and matrices compare element-wise in
//! order; sets (`\{3,2,1\}`), bare lists of solutions (`5, -3`, also against a set) and unions
//! of intervals (`(1,2] \cup [3,4)`) in any order. Named elements match under the same name
//! (`x=1, y=2` is `(1, 2)`, never `x=2, y=1`). Each element is evaluated with [`super::expr`]
//! (`2^{10}`, `-\frac{3}{4}`, `5!`, `\binom{5}{2}`, `\log_2 8`, `\sqrt[3]{2}`, `1.5e3`, `√2`,
//! `sqrt(2)`) and compared exactly when both sides are rational, else with relative tolerance
//! 1e-6. Two expressions over the same variables are compared by value at three fixed
//! rational points, exactly (`2b+3a` = `3a+2b`, `(x+1)^2` = `x^2+2x+1`; a polynomial identity
//! that holds at three generic points of exact arithmetic is all but certain), and two
//! equations by whether `lhs - rhs` are proportional there (`2y + x = 7` = `x+2y=7`). A chain
//! of numbers answers with its last value (`3 ÷ 4 = 0.75` is 0.75). A percentage matches both
//! its number and its fraction (`50\%` = `50` = `0.5`). Elements that do not evaluate
//! (`\infty`) compare as normalised strings, words without case (`Yes` = `yes`); `∅`,
//! `\emptyset` and `\varnothing` are one. Units matter only when both sides name a known one
//! (`5\text{ m}` is not `5\text{ cm}`; `12\text{ in}` is `12\text{ inches}`; a bare `25` is
//! `25\text{ cm}^2`). A multiple-choice reference (`A`, `(A)`) is answered by the label an
//! answer starts with (`(A) 12`).
//!
//! **Hedging earns nothing**: several boxed answers that are not all equivalent (`either
//! \boxed{5} or \boxed{6}`) are no final answer, whichever the reference is.
//!
//! **Malformed answers earn nothing**: when the response holds an unbalanced `\boxed{` or
//! unbalanced braces, the last-number fallback does not apply (`\frac{5}{` is not 5).

use super::expr::{evaluate, Grammar, Number};
use super::{Reward, Verifier};

/// Only the last this-many bytes of a response are searched for the answer. Final answers are
/// at the end; the cap bounds the work a runaway generation can cause.
pub const MAX_RESPONSE_BYTES: usize = 256 * 1024;

/// Answers longer than this (after extraction) are compared as strings only.
const MAX_ANSWER_CHARS: usize = 1024;

/// A way of finding the answer in a response (see the module docs for each and the default
/// order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// `\boxed{…}` or `\fbox{…}`.
    Boxed,
    /// `<answer>…</answer>`.
    AnswerTag,
    /// `#### …`.
    Hashes,
    /// "the answer is …".
    AnswerIs,
    /// The last number.
    LastNumber,
}

impl Rule {
    /// Every rule, in the default order.
    pub const ALL: [Rule; 5] = [
        Rule::Boxed,
        Rule::AnswerTag,
        Rule::Hashes,
        Rule::AnswerIs,
        Rule::LastNumber,
    ];

    /// The explicit marks, in the default order: every rule but the last number.
    pub const MARKED: [Rule; 4] = [Rule::Boxed, Rule::AnswerTag, Rule::Hashes, Rule::AnswerIs];

    /// The answer text this rule finds in `s`, if any.
    fn find(self, s: &str) -> Option<&str> {
        match self {
            Rule::Boxed => last_boxed(s),
            Rule::AnswerTag => last_answer_tag(s),
            Rule::Hashes => after_hashes(s),
            Rule::AnswerIs => after_answer_is(s),
            Rule::LastNumber => last_number(s),
        }
    }
}

/// An ordered list of rules, each at most once: what a [`MathVerifier`] consults. A plain
/// value (`Copy`), so a verifier stays one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// The rules in order; only the first `len` are in the list (the rest is filler).
    order: [Rule; Rule::ALL.len()],
    len: usize,
}

impl Rules {
    /// `rules` in their order; a repeated rule keeps its first place (a second try of the same
    /// rule could find nothing new).
    pub fn new(rules: &[Rule]) -> Rules {
        let mut out = Rules {
            order: Rule::ALL,
            len: 0,
        };
        for &r in rules {
            if !out.as_slice().contains(&r) {
                out.order[out.len] = r;
                out.len += 1;
            }
        }
        out
    }

    /// The rules, in order.
    pub fn as_slice(&self) -> &[Rule] {
        &self.order[..self.len]
    }
}

/// An answer found in a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extracted<'a> {
    /// The answer text, not yet normalised.
    pub text: &'a str,
    /// How it was found.
    pub rule: Rule,
}

/// The last `MAX_RESPONSE_BYTES` bytes of `s`, cut at a character boundary.
pub(crate) fn tail(s: &str) -> &str {
    if s.len() <= MAX_RESPONSE_BYTES {
        return s;
    }
    let mut start = s.len() - MAX_RESPONSE_BYTES;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Calls `found(start, end)` with the byte span of the content of every balanced
/// `\boxed{…}` / `\fbox{…}`, in one pass: a stack of open braces remembers which ones opened a
/// box, so unbalanced boxes anywhere cost nothing extra.
fn boxed_spans(s: &str, mut found: impl FnMut(usize, usize)) {
    let bytes = s.as_bytes();
    // For each open brace: Some(content start) when it opened a box.
    let mut stack: Vec<Option<usize>> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => {
                let rest = &bytes[i..];
                let cmd = [&b"\\boxed{"[..], &b"\\fbox{"[..]]
                    .into_iter()
                    .find(|c| rest.starts_with(c));
                if let Some(c) = cmd {
                    i += c.len();
                    stack.push(Some(i));
                    continue;
                }
                // Skip escaped braces (`\{`, `\}`) so sets inside a box stay balanced.
                if matches!(bytes.get(i + 1), Some(b'{' | b'}')) {
                    i += 2;
                    continue;
                }
            }
            b'{' => stack.push(None),
            b'}' => {
                if let Some(Some(start)) = stack.pop() {
                    found(start, i);
                }
            }
            _ => {}
        }
        i += 1;
    }
}

/// The content of the last balanced `\boxed{…}` / `\fbox{…}` (the one that opens last).
pub fn last_boxed(s: &str) -> Option<&str> {
    let mut best: Option<(usize, usize)> = None;
    boxed_spans(s, |start, end| {
        if best.is_none_or(|(b, _)| start > b) {
            best = Some((start, end));
        }
    });
    // Byte offsets sit next to ASCII braces, so they are character boundaries.
    best.and_then(|(a, b)| s.get(a..b))
}

/// Most different boxed answers a response may hold before it counts as hedging outright (the
/// bound also keeps the pairwise comparisons cheap on hostile input).
const MAX_DISTINCT_BOXES: usize = 8;

/// The different contents of the balanced boxes of `s` (each once, in order), or `None` when
/// there are more than [`MAX_DISTINCT_BOXES`].
fn distinct_boxed(s: &str) -> Option<Vec<&str>> {
    let mut out: Vec<&str> = Vec::new();
    let mut too_many = false;
    boxed_spans(s, |a, b| {
        let Some(body) = s.get(a..b) else { return };
        if !too_many && !out.contains(&body) {
            too_many = out.len() == MAX_DISTINCT_BOXES;
            if !too_many {
                out.push(body);
            }
        }
    });
    (!too_many).then_some(out)
}

fn last_answer_tag(s: &str) -> Option<&str> {
    let end = s.rfind("</answer>")?;
    let start = s[..end].rfind("<answer>")? + "<answer>".len();
    Some(&s[start..end])
}

fn after_hashes(s: &str) -> Option<&str> {
    let start = s.rfind("####")? + 4;
    let rest = &s[start..];
    let line = rest.split('\n').next().unwrap_or(rest);
    Some(line.trim()).filter(|t| !t.is_empty())
}

fn after_answer_is(s: &str) -> Option<&str> {
    let lower = s.to_ascii_lowercase();
    let (pos, len) = ["answer is", "answer:"]
        .into_iter()
        .filter_map(|k| lower.rfind(k).map(|p| (p, k.len())))
        .max()?;
    // ASCII lowercasing keeps byte offsets.
    let rest = &s[pos + len..];
    let line = rest.split('\n').next().unwrap_or(rest);
    // The sentence ends at ". " (a decimal point is followed by a digit, not a space).
    let sentence = line.split(". ").next().unwrap_or(line);
    let t = sentence.trim().trim_start_matches(':').trim();
    Some(t).filter(|t| !t.is_empty())
}

/// Whether `s` holds LaTeX that does not close: more `{` than `}`, or a `\boxed{` without a
/// balanced box (an attempted answer that is malformed).
fn malformed(s: &str) -> bool {
    let opens = s.bytes().filter(|b| *b == b'{').count();
    let closes = s.bytes().filter(|b| *b == b'}').count();
    opens > closes || ((s.contains("\\boxed{") || s.contains("\\fbox{")) && last_boxed(s).is_none())
}

/// The last number, as plain text writes it: digits with an optional sign, decimal point,
/// thousands commas, `a/b`, e-notation (`1.5e3`), `√` and `π` (`3√2`, `π/3`) and a trailing
/// `%`. None in a response whose LaTeX is malformed ([`malformed`]: `\frac{5}{` is not 5), nor
/// in one that does not end like a finished answer ([`ends_finished`]: a response cut off
/// mid-sentence has not given its answer, whatever number it mentioned last).
fn last_number(s: &str) -> Option<&str> {
    if malformed(s) {
        return None;
    }
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    let last = chars
        .iter()
        .rposition(|(_, c)| c.is_ascii_digit() || *c == 'π')?;
    let mut end_k = last + 1;
    if chars.get(end_k).is_some_and(|(_, c)| *c == '%') {
        end_k += 1;
    }
    let end = chars.get(end_k).map_or(s.len(), |(i, _)| *i);
    if !ends_finished(&s[end..]) {
        return None;
    }
    let ch = |k: usize| chars.get(k).map(|(_, c)| *c);
    let digit = |k: usize| ch(k).is_some_and(|c| c.is_ascii_digit());
    let mut start = last;
    while start > 0 {
        let k = start - 1;
        let keep = match ch(k) {
            Some(c) if c.is_ascii_digit() || matches!(c, '.' | ',' | '/' | '^' | '√' | 'π') => {
                true
            }
            // E-notation: `5e3`, `2.5E-4`.
            Some('e' | 'E') => k > 0 && digit(k - 1) && (digit(k + 1) || ch(k + 1) == Some('-')),
            Some('-' | '+') => k > 0 && matches!(ch(k - 1), Some('e' | 'E')) && digit(k + 1),
            _ => false,
        };
        if !keep {
            break;
        }
        start = k;
    }
    while start < last && matches!(ch(start), Some('.' | ',' | '/' | '^' | '-' | '+')) {
        start += 1;
    }
    // A minus sign, unless it is a subtraction (`5-3` ends in 3, not -3).
    let is_sign = start > 0
        && matches!(ch(start - 1), Some('-' | '\u{2212}'))
        && (start < 2 || !ch(start - 2).is_some_and(|c| c.is_alphanumeric() || c == ')'));
    if is_sign {
        start -= 1;
    }
    s.get(chars.get(start).map_or(s.len(), |(i, _)| *i)..end)
}

/// Whether the text after a response's last number ends the response like a finished answer:
/// nothing but punctuation and symbols (`12+7=19 19+30=49`, `…= 24.`), or the rest of one
/// sentence closed by a full stop (`… = 14 pages.`). A response cut off mid-sentence (`…we get
/// 24, and then we need to consider the`) does not.
fn ends_finished(after: &str) -> bool {
    if !after.chars().any(char::is_alphanumeric) {
        return true;
    }
    let Some(body) = after.trim_end().strip_suffix(['.', '!']) else {
        return false;
    };
    !body.contains(['.', '!', '?', '\n'])
}

/// Finds the final answer in `response` by the default order (see the module docs):
/// [`Rule::ALL`] when `last_number_rule`, else [`Rule::MARKED`].
pub fn extract_answer(response: &str, last_number_rule: bool) -> Option<Extracted<'_>> {
    let rules: &[Rule] = if last_number_rule {
        &Rule::ALL
    } else {
        &Rule::MARKED
    };
    extract_answer_with(response, rules)
}

/// Finds the final answer in `response` by `rules` alone, in their order: the first rule that
/// finds something wins, and a rule not in `rules` is never consulted (its mark is just text).
pub fn extract_answer_with<'a>(response: &'a str, rules: &[Rule]) -> Option<Extracted<'a>> {
    let s = tail(response);
    rules
        .iter()
        .find_map(|&rule| rule.find(s).map(|text| Extracted { text, rule }))
}

/// Replaces every occurrence of each `(from, to)` pair, in order.
fn replace_all(s: String, pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .fold(s, |acc, (from, to)| acc.replace(from, to))
}

/// Replaces a LaTeX command that is not followed by a letter (so `\left` goes but
/// `\leftarrow` stays, and `\le` is not the start of `\left`).
fn replace_command(s: &str, cmd: &str, with: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(p) = rest.find(cmd) {
        let after = &rest[p + cmd.len()..];
        out.push_str(&rest[..p]);
        if after.starts_with(|c: char| c.is_ascii_alphabetic()) {
            out.push_str(cmd);
        } else {
            out.push_str(with);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Unwraps or drops text commands (`\text{…}`, `\mathrm{…}`, …): a group that is the whole
/// answer, or holds no letters, is unwrapped; `\text{ or }` / `\text{ and }` between answers
/// become a comma (a list of solutions); any other group with letters next to other content is
/// a unit and is dropped (`5\text{ cm}` → `5`), its text (with its exponent) kept in `unit`.
fn strip_text_groups(s: &str, unit: &mut Option<String>) -> String {
    const CMDS: [&str; 7] = [
        "\\text{",
        "\\textbf{",
        "\\textit{",
        "\\mathrm{",
        "\\mathbf{",
        "\\mbox{",
        "\\operatorname{",
    ];
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    // One forward pass: jump from backslash to backslash, so the work is linear in `s`.
    let mut search_from = 0;
    while let Some(off) = rest[search_from..].find('\\') {
        let p = search_from + off;
        let Some(len) = CMDS
            .iter()
            .find(|c| rest[p..].starts_with(**c))
            .map(|c| c.len())
        else {
            search_from = p + 1;
            continue;
        };
        let body_start = p + len;
        let mut depth = 1usize;
        let mut end = None;
        for (i, b) in rest.as_bytes()[body_start..].iter().enumerate() {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(body_start + i);
                        break;
                    }
                }
                _ => {}
            }
        }
        // An unterminated group is left as it is (the rest of the string is its body).
        let Some(end) = end else { break };
        let body = &rest[body_start..end];
        let whole = p == 0 && end + 1 == rest.len() && out.trim().is_empty();
        out.push_str(&rest[..p]);
        let mut after = end + 1;
        if whole || !body.chars().any(|c| c.is_alphabetic()) {
            out.push_str(body);
        } else if is_connective(body) {
            out.push(',');
        } else {
            // A unit's exponent goes with it: `25\text{ cm}^2`, `\mathrm{m}^{2}`.
            let exp = unit_exponent_len(&rest[after..]);
            *unit = Some(format!(
                "{}{}",
                body.trim(),
                rest[after..after + exp].trim()
            ));
            after += exp;
        }
        rest = &rest[after..];
        search_from = 0;
    }
    out.push_str(rest);
    out
}

/// `or` / `and`: a word joining several answers (`x=1 \text{ or } x=2`).
fn is_connective(word: &str) -> bool {
    let w = word.trim();
    w.eq_ignore_ascii_case("or") || w.eq_ignore_ascii_case("and")
}

/// Plain-text `or` / `and` between answers become commas (`1 or 2` → `1, 2`).
fn plain_connectives(s: &str) -> String {
    if !s.contains(char::is_whitespace) {
        return s.to_string();
    }
    s.split_whitespace()
        .map(|w| if is_connective(w) { "," } else { w })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Words that name math, not units, after a number (`2 pi`).
const MATH_WORDS: [&str; 8] = ["pi", "sqrt", "log", "ln", "sin", "cos", "tan", "infty"];

/// A plain number followed by words, as GSM8K writes answers (`45 minutes`, `8 cookies`,
/// `$18 per hour`): the number and the words (its unit). Single letters are not units here
/// (`2 x` is a product), nor are the names of [`MATH_WORDS`].
fn plain_unit(s: &str) -> Option<(&str, &str)> {
    let t = s.trim().trim_end_matches('.');
    let (num, words) = t.split_once(char::is_whitespace)?;
    let numeric = num.chars().any(|c| c.is_ascii_digit())
        && num
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | ',' | '-' | '+' | '%'));
    let words = words.trim();
    let wordy = words.split_whitespace().all(|w| {
        w.len() >= 2
            && w.chars().all(|c| c.is_ascii_alphabetic())
            && !MATH_WORDS.contains(&w.to_ascii_lowercase().as_str())
    });
    (numeric && wordy && !words.is_empty()).then_some((num, words))
}

/// Units a grader tells apart, each with the ways it is written (lower case). Only units both
/// sides name from this table can conflict: `5\text{ m}` is not `5\text{ cm}`, but
/// `12\text{ in}` is `12\text{ inches}`, and an unknown word (`apples`) decides nothing.
const UNITS: [(&str, &[&str]); 24] = [
    (
        "mm",
        &[
            "mm",
            "millimeter",
            "millimeters",
            "millimetre",
            "millimetres",
        ],
    ),
    (
        "cm",
        &[
            "cm",
            "centimeter",
            "centimeters",
            "centimetre",
            "centimetres",
        ],
    ),
    ("m", &["m", "meter", "meters", "metre", "metres"]),
    (
        "km",
        &["km", "kilometer", "kilometers", "kilometre", "kilometres"],
    ),
    ("in", &["in", "inch", "inches"]),
    ("ft", &["ft", "foot", "feet"]),
    ("yd", &["yd", "yard", "yards"]),
    ("mi", &["mi", "mile", "miles"]),
    ("mg", &["mg", "milligram", "milligrams"]),
    ("g", &["g", "gram", "grams"]),
    ("kg", &["kg", "kilogram", "kilograms"]),
    ("lb", &["lb", "lbs", "pound", "pounds"]),
    ("oz", &["oz", "ounce", "ounces"]),
    ("s", &["s", "sec", "secs", "second", "seconds"]),
    ("min", &["min", "mins", "minute", "minutes"]),
    ("h", &["h", "hr", "hrs", "hour", "hours"]),
    ("day", &["day", "days"]),
    ("week", &["week", "weeks"]),
    ("year", &["yr", "yrs", "year", "years"]),
    (
        "ml",
        &[
            "ml",
            "milliliter",
            "milliliters",
            "millilitre",
            "millilitres",
        ],
    ),
    ("l", &["l", "liter", "liters", "litre", "litres"]),
    ("dollar", &["dollar", "dollars", "usd"]),
    ("cent", &["cent", "cents"]),
    ("degree", &["deg", "degree", "degrees"]),
];

/// A unit as written (`cm`, `inches`, `cm^2`, `cm^{2}`) as `(canonical name, exponent)`, when
/// the name is in [`UNITS`].
fn canonical_unit(unit: &str) -> Option<(&'static str, String)> {
    let (name, exp) = unit.split_once('^').unwrap_or((unit, ""));
    let name = name.trim().to_ascii_lowercase();
    let exp: String = exp
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    UNITS
        .iter()
        .find(|(_, names)| names.contains(&name.as_str()))
        .map(|(canon, _)| (*canon, exp))
}

/// Whether both answers name a unit, both known, and they differ.
fn units_conflict(a: Option<&str>, b: Option<&str>) -> bool {
    match (a.and_then(canonical_unit), b.and_then(canonical_unit)) {
        (Some(x), Some(y)) => x != y,
        _ => false,
    }
}

/// Rewrites matrix environments (`pmatrix`, `bmatrix`, `matrix`, `smallmatrix`) as one form,
/// `\begin{pmatrix}a&b;c&d\end{pmatrix}` (rows joined by `;`), so the bracket type and spacing
/// do not matter. Runs before spacing is stripped, while `\\` still separates rows.
fn canonical_matrices(s: &str) -> String {
    const ENVS: [&str; 4] = ["pmatrix", "bmatrix", "smallmatrix", "matrix"];
    const BEGIN: &str = "\\begin{";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(p) = rest.find(BEGIN) {
        let after = &rest[p + BEGIN.len()..];
        let env = ENVS
            .iter()
            .find(|e| after.strip_prefix(**e).is_some_and(|t| t.starts_with('}')));
        let Some(env) = env else {
            out.push_str(&rest[..p + BEGIN.len()]);
            rest = after;
            continue;
        };
        let body_start = p + BEGIN.len() + env.len() + 1;
        let end_tag = format!("\\end{{{env}}}");
        let Some(e) = rest[body_start..].find(&end_tag) else {
            break;
        };
        let rows: Vec<String> = rest[body_start..body_start + e]
            .split("\\\\")
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(|r| r.split('&').map(str::trim).collect::<Vec<_>>().join("&"))
            .collect();
        out.push_str(&rest[..p]);
        out.push_str("\\begin{pmatrix}");
        out.push_str(&rows.join(";"));
        out.push_str("\\end{pmatrix}");
        rest = &rest[body_start + e + end_tag.len()..];
    }
    out.push_str(rest);
    out
}

/// Length of a `^2` / `^{2}` / `^{-1}` right at the start of `s` (after spaces), else 0.
fn unit_exponent_len(s: &str) -> usize {
    let t = s.trim_start();
    let skipped = s.len() - t.len();
    let Some(rest) = t.strip_prefix('^') else {
        return 0;
    };
    let body_len = if let Some(inner) = rest.strip_prefix('{') {
        match inner.find('}') {
            Some(e) if inner[..e].chars().all(|c| c.is_ascii_digit() || c == '-') => e + 2,
            _ => return 0,
        }
    } else {
        rest.chars().take_while(char::is_ascii_digit).count()
    };
    if body_len == 0 {
        return 0;
    }
    skipped + 1 + body_len
}

/// Rewrites repeating decimals `a.b\overline{c}` (also `\bar{c}`, `\dot{c}`) as the exact
/// fraction `(n)/(d)`, so `0.\overline{3}` is `1/3`. Anything else is left as it is.
fn expand_repeating(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    loop {
        let found = ["\\overline{", "\\bar{", "\\dot{"]
            .iter()
            .filter_map(|c| rest.find(c).map(|p| (p, c.len())))
            .min();
        let Some((p, len)) = found else { break };
        let head = &rest[..p];
        let body_start = p + len;
        let close = rest[body_start..].find('}').map(|e| body_start + e);
        let rep = close.map(|c| &rest[body_start..c]);
        // The decimal right before: digits, a point, digits.
        let num_start = head
            .char_indices()
            .rev()
            .take_while(|(_, ch)| ch.is_ascii_digit() || *ch == '.')
            .last()
            .map_or(head.len(), |(i, _)| i);
        let num = &head[num_start..];
        match (rep, close, num.split_once('.')) {
            (Some(r), Some(c), Some((int, frac)))
                if !r.is_empty()
                    && r.len() <= 12
                    && frac.len() <= 12
                    && int.len() <= 12
                    && r.chars().all(|ch| ch.is_ascii_digit())
                    && frac.chars().all(|ch| ch.is_ascii_digit()) =>
            {
                // x = int.frac(rep)*: x·10^f·(10^r − 1) = (int frac rep) − (int frac).
                let whole = |t: &str| t.parse::<i128>().unwrap_or(0);
                let (f, r_len) = (frac.len() as u32, r.len() as u32);
                let all = whole(&format!("{int}{frac}{r}"));
                let prefix = whole(&format!("{int}{frac}"));
                let den = 10i128.pow(f) * (10i128.pow(r_len) - 1);
                out.push_str(&head[..num_start]);
                out.push_str(&format!("({}/{den})", all - prefix));
                rest = &rest[c + 1..];
            }
            _ => {
                // Not a repeating decimal: keep the command as written.
                out.push_str(&rest[..body_start]);
                rest = &rest[body_start..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Removes thousands separators: a run `d{1,3}(,ddd)+` not touching another comma-number
/// (`1,234,567` → `1234567`; `1,2` and `3,1,234` are lists and stay).
fn strip_thousands(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        let starts_run = b[i].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_digit());
        if !starts_run {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        let head = j - i;
        let mut groups = 0;
        let mut k = j;
        while b.get(k) == Some(&b',')
            && b.get(k + 1..k + 4)
                .is_some_and(|g| g.iter().all(u8::is_ascii_digit))
            && !b.get(k + 4).is_some_and(u8::is_ascii_digit)
        {
            groups += 1;
            k += 4;
        }
        let before_ok = i < 2 || !(b[i - 1] == b',' && b[i - 2].is_ascii_digit());
        let before_ok = before_ok && !(i > 0 && b[i - 1] == b'.');
        let after_ok = !(b.get(k) == Some(&b',') && b.get(k + 1).is_some_and(u8::is_ascii_digit));
        if groups > 0 && (1..=3).contains(&head) && before_ok && after_ok {
            out.push_str(&s[copied..i]);
            out.extend(s[i..k].chars().filter(|c| *c != ','));
            copied = k;
        }
        i = k.max(j);
    }
    out.push_str(&s[copied..]);
    out
}

/// Strips one pair of enclosing delimiters (`$…$`, `\(…\)`, `\[…\]`) if present.
fn strip_delimiters(s: &str) -> &str {
    let pairs = [("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")];
    for (open, close) in pairs {
        if s.len() >= open.len() + close.len() && s.starts_with(open) && s.ends_with(close) {
            return s[open.len()..s.len() - close.len()].trim();
        }
    }
    s
}

/// The body of `s` when `s` is exactly `prefix…}` with `prefix` ending in `{` and that
/// brace closing at the very end (`\boxed{1}+\boxed{2}` is not one box).
fn strip_wrapper<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let body = s.strip_prefix(prefix)?.strip_suffix('}')?;
    let mut depth = 0i32;
    for b in body.bytes() {
        match b {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return None;
        }
    }
    (depth == 0).then_some(body)
}

/// Normalises an answer for comparison (see the module docs); both sides of a comparison go
/// through the same steps. Linear in the input.
pub fn normalize(answer: &str) -> String {
    normalize_with_unit(answer).text
}

/// An answer after [`normalize`], and the unit it named, if any.
#[derive(Debug, Clone, PartialEq)]
struct Normalized {
    text: String,
    /// The unit dropped from the answer (`cm^2` of `25\text{ cm}^2`, `minutes` of
    /// `45 minutes`), for [`units_conflict`].
    unit: Option<String>,
}

fn normalize_with_unit(answer: &str) -> Normalized {
    let mut s = strip_delimiters(answer.trim());
    if let Some(inner) = strip_wrapper(s, "\\boxed{") {
        s = inner;
    }
    // `\$5` is five dollars; the other `$` are math delimiters.
    let s = s.replace("\\$", "").replace('$', "");
    let s = s.replace("{,}", ",");
    let s = canonical_matrices(&s);
    let mut unit = None;
    let s = strip_text_groups(&s, &mut unit);
    let s = plain_connectives(&s);
    let s = match plain_unit(&s) {
        Some((num, words)) => {
            unit = Some(words.to_string());
            num.to_string()
        }
        None => s,
    };
    let s = expand_repeating(&s);
    let s = replace_all(
        s,
        &[
            ("\\varnothing", "\u{2205}"),
            ("\\emptyset", "\u{2205}"),
            ("\\{\\}", "\u{2205}"),
            ("\u{221e}", "\\infty"),
            ("+\\infty", "\\infty"),
            ("\\dbinom", "\\binom"),
            ("\\tbinom", "\\binom"),
            ("\\dfrac", "\\frac"),
            ("\\tfrac", "\\frac"),
            ("^{\\circ}", ""),
            ("^\\circ", ""),
            ("\u{00b0}", ""),
            ("\\%", "%"),
            ("\\!", ""),
            ("\\,", ""),
            ("\\;", ""),
            ("\\:", ""),
            ("\\ ", ""),
            ("\u{2212}", "-"),
            ("~", ""),
        ],
    );
    let mut s = s;
    for (cmd, with) in [
        ("\\left", ""),
        ("\\right", ""),
        ("\\displaystyle", ""),
        ("\\qquad", ""),
        ("\\quad", ""),
        // Inequalities in one spelling each, for [`inequality_interval`].
        ("\\leqslant", "\u{2264}"),
        ("\\leq", "\u{2264}"),
        ("\\le", "\u{2264}"),
        ("\\geqslant", "\u{2265}"),
        ("\\geq", "\u{2265}"),
        ("\\ge", "\u{2265}"),
        ("\\pm", "\u{00b1}"),
    ] {
        s = replace_command(&s, cmd, with);
    }
    let s = strip_thousands(&s);
    let mut s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    while s.ends_with('.') && !s.ends_with("..") {
        s.pop();
    }
    // `x=5`, `f(x)=x^2+1` → the value: a name on the left of the only `=`.
    if let Some((_, value)) = split_name(&s) {
        s = value.to_string();
    }
    // `x\in[1,4)` → `[1,4)`.
    if let Some((lhs, set)) = s.split_once("\\in") {
        if is_name(lhs) && !set.starts_with(|c: char| c.is_ascii_alphabetic()) {
            s = set.to_string();
        }
    }
    if let Some(interval) = inequality_interval(&s) {
        s = interval;
    }
    Normalized {
        text: expand_plus_minus(&s),
        unit,
    }
}

/// Whether `s` is a short name (`x`, `\theta`, `abc`) or a function of names (`f(x)`,
/// `g(x,y)`): what may stand on the left of `name = answer`.
fn is_name(s: &str) -> bool {
    let plain = |t: &str| {
        let t = t.strip_prefix('\\').unwrap_or(t);
        !t.is_empty() && t.len() <= 8 && t.chars().all(|c| c.is_ascii_alphabetic())
    };
    if plain(s) {
        return true;
    }
    match s.strip_suffix(')').and_then(|t| t.split_once('(')) {
        Some((f, args)) => plain(f) && args.split(',').all(plain),
        None => false,
    }
}

/// `name=value` split into the name and the value, when the name is one ([`is_name`]) and
/// the value holds no further `=`.
fn split_name(s: &str) -> Option<(&str, &str)> {
    let (lhs, rhs) = s.split_once('=')?;
    (!rhs.is_empty() && !rhs.contains('=') && is_name(lhs)).then_some((lhs, rhs))
}

/// A normalised inequality in one variable (`x>-3`, `1≤x<4`, `4>x`) as the interval it
/// describes (`(-3,\infty)`, `[1,4)`, `(-\infty,4)`); `None` for anything else.
fn inequality_interval(s: &str) -> Option<String> {
    let mut parts = Vec::new();
    let mut ops = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            '<' | '>' | '\u{2264}' | '\u{2265}' if depth == 0 => {
                parts.push(&s[start..i]);
                ops.push(c);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    if ops.is_empty() || parts.iter().any(|p| p.is_empty()) {
        return None;
    }
    let var = |p: &str| is_name(p) && !p.contains('(');
    let up = |op: char| matches!(op, '<' | '\u{2264}');
    let closed = |op: char| matches!(op, '\u{2264}' | '\u{2265}');
    let open = |op: char| if closed(op) { '[' } else { '(' };
    let close = |op: char| if closed(op) { ']' } else { ')' };
    // An end of the interval and the operator that bounds it; `None` is infinite.
    type End<'a> = (Option<&'a str>, char);
    let (low, high): (End<'_>, End<'_>) = match (&parts[..], &ops[..]) {
        ([x, b], [op]) if var(x) && !var(b) => {
            if up(*op) {
                ((None, '<'), (Some(*b), *op))
            } else {
                ((Some(*b), *op), (None, '<'))
            }
        }
        ([a, x], [op]) if var(x) && !var(a) => {
            if up(*op) {
                ((Some(*a), *op), (None, '<'))
            } else {
                ((None, '<'), (Some(*a), *op))
            }
        }
        ([a, x, b], [o1, o2]) if var(x) && up(*o1) == up(*o2) => {
            if up(*o1) {
                ((Some(*a), *o1), (Some(*b), *o2))
            } else {
                ((Some(*b), *o2), (Some(*a), *o1))
            }
        }
        _ => return None,
    };
    Some(format!(
        "{}{},{}{}",
        open(low.1),
        low.0.unwrap_or("-\\infty"),
        high.0.unwrap_or("\\infty"),
        close(high.1)
    ))
}

/// `a±b` as the two answers it stands for, `a+b,a-b` (`\pm 3` is `3, -3`; `\frac{1\pm\sqrt5}{2}`
/// is two fractions). Only a single `±` in a single answer is expanded.
fn expand_plus_minus(s: &str) -> String {
    if s.matches('\u{00b1}').count() != 1 || split_top_level(s).len() != 1 {
        return s.to_string();
    }
    format!(
        "{},{}",
        s.replace('\u{00b1}', "+"),
        s.replace('\u{00b1}', "-")
    )
}

/// A normalised answer split into its shape: one value, or several.
#[derive(Debug, PartialEq)]
enum Shape<'a> {
    Scalar(&'a str),
    /// `(a,b)`, `[a,b)`, … with its brackets, or a bare `a,b` (brackets `None`).
    Tuple(Option<(char, char)>, Vec<&'a str>),
    /// `\{a,b\}`: order does not matter.
    Set(Vec<&'a str>),
    /// `A \cup B \cup …` of intervals: order does not matter.
    Union(Vec<&'a str>),
    /// A matrix or vector ([`canonical_matrices`]): rows of cells, in order.
    Matrix(Vec<Vec<&'a str>>),
    /// `a=b(=c…)`: an equation (`x+2y=7`) or a chain of equal values (`3÷4=0.75`).
    Equation(Vec<&'a str>),
}

/// Splits at `\cup` / `∪` outside brackets; one part when there is none.
fn split_union(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let mut skip_to = 0;
    for (i, c) in s.char_indices() {
        if i < skip_to {
            continue;
        }
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
        let rest = &s[i..];
        let sep = if rest.starts_with("\\cup")
            && !rest[4..].starts_with(|ch: char| ch.is_ascii_alphabetic())
        {
            4
        } else if c == '\u{222a}' {
            c.len_utf8()
        } else {
            0
        };
        if sep > 0 && depth == 0 {
            parts.push(&s[start..i]);
            start = i + sep;
            skip_to = start;
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Splits at commas outside any brackets.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn shape(s: &str) -> Shape<'_> {
    let matrix = s
        .strip_prefix("\\begin{pmatrix}")
        .and_then(|t| t.strip_suffix("\\end{pmatrix}"))
        .filter(|body| !body.contains("\\begin{"));
    if let Some(body) = matrix {
        return Shape::Matrix(body.split(';').map(|r| r.split('&').collect()).collect());
    }
    let union = split_union(s);
    if union.len() > 1 {
        return Shape::Union(union);
    }
    if let Some(inner) = s.strip_prefix("\\{").and_then(|t| t.strip_suffix("\\}")) {
        return Shape::Set(split_top_level(inner));
    }
    let mut chars = s.chars();
    if let (Some(open @ ('(' | '[')), Some(close @ (')' | ']'))) = (chars.next(), chars.next_back())
    {
        let inner = &s[1..s.len() - 1];
        // Only when the outer brackets enclose everything (not `(1)+(2)`).
        let mut depth = 0i32;
        let encloses = inner.chars().all(|c| {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ => {}
            }
            depth >= 0
        });
        if encloses {
            let parts = split_top_level(inner);
            if parts.len() > 1 {
                return Shape::Tuple(Some((open, close)), parts);
            }
        }
    }
    let parts = split_top_level(s);
    if parts.len() > 1 {
        Shape::Tuple(None, parts)
    } else if s.contains('=') {
        Shape::Equation(s.split('=').collect())
    } else {
        Shape::Scalar(s)
    }
}

/// The values a normalised element stands for: its value, and its value / 100 as well when
/// it is a percentage.
fn values(s: &str) -> Vec<Number> {
    let (body, percent) = match s.strip_suffix('%') {
        Some(b) => (b, true),
        None => (s, false),
    };
    let Ok(e) = evaluate(body, Grammar::MATH) else {
        return Vec::new();
    };
    let mut out = vec![e.value];
    if percent {
        if let Ok(f) = evaluate(&format!("({body})/100"), Grammar::MATH) {
            out.push(f.value);
        }
    }
    out
}

fn element_equivalent(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let (va, vb) = (values(a), values(b));
    if va.is_empty() || vb.is_empty() {
        return a.trim_end_matches('%') == b.trim_end_matches('%')
            || same_word(a, b)
            || symbolic_equivalent(a, b);
    }
    va.iter().any(|x| vb.iter().any(|y| x.equivalent(y)))
}

/// Text answers are words whatever their case (`Yes` = `yes`). Single letters are not words
/// here: `x` and `X` are different variables.
fn same_word(a: &str, b: &str) -> bool {
    let word = |s: &str| s.chars().count() >= 2 && s.chars().all(char::is_alphabetic);
    word(a) && word(b) && a.to_lowercase() == b.to_lowercase()
}

/// Two elements of a list: a named element (`x=1`) matches another only under the same name;
/// a name on one side only is not compared (`x=1` is the solution `1`).
fn named_equivalent(a: &str, b: &str) -> bool {
    match (split_name(a), split_name(b)) {
        (Some((na, va)), Some((nb, vb))) => na == nb && element_equivalent(va, vb),
        (Some((_, va)), None) => element_equivalent(va, b),
        (None, Some((_, vb))) => element_equivalent(a, vb),
        (None, None) => element_equivalent(a, b),
    }
}

/// The value a chain of equal numbers states last (`3÷4=0.75` → `0.75`), when every part
/// before it is a number (not an equation in variables).
fn chain_value<'a>(parts: &[&'a str]) -> Option<&'a str> {
    let (last, before) = parts.split_last()?;
    (!before.is_empty() && before.iter().all(|p| !values(p).is_empty())).then_some(*last)
}

/// Two equations: chains of numbers by their final values; `l₁=r₁` and `l₂=r₂` in the same
/// variables when `l₁−r₁` and `l₂−r₂` are proportional (`2y+x=7` = `x+2y=7` = `2x+4y-14=0`).
fn equations_equivalent(xs: &[&str], ys: &[&str]) -> bool {
    if xs == ys {
        return true;
    }
    if let (Some(x), Some(y)) = (chain_value(xs), chain_value(ys)) {
        return element_equivalent(x, y);
    }
    let ([xl, xr], [yl, yr]) = (xs, ys) else {
        return false;
    };
    let (dx, dy) = (format!("({xl})-({xr})"), format!("({yl})-({yr})"));
    let Some(samples) = sample_points(&dx, &dy) else {
        return false;
    };
    let ratios: Option<Vec<Number>> = samples.iter().map(|(x, y)| x.quotient(*y).ok()).collect();
    match ratios.as_deref() {
        Some([first, rest @ ..]) => {
            first.to_f64() != 0.0 && rest.iter().all(|r| r.equivalent(first))
        }
        _ => false,
    }
}

/// Points at which expressions over variables are compared: distinct, non-integer, positive
/// rationals (so `\sqrt{x}` and `\ln x` are defined), different for each variable.
fn point(var: usize, k: usize) -> Number {
    let (var, k) = (var as i128, k as i128);
    Number::Exact(
        super::expr::Rational::new(11 + 7 * var + 13 * k, 3 + 2 * k + var)
            .unwrap_or(super::expr::Rational::int(2)),
    )
}

/// The values of two expressions over the same (non-empty) set of variables at three points,
/// or `None` when the variables differ or either side does not evaluate.
fn sample_points(a: &str, b: &str) -> Option<Vec<(Number, Number)>> {
    let na = super::expr::variables(a, Grammar::MATH).ok()?;
    let nb = super::expr::variables(b, Grammar::MATH).ok()?;
    if na.is_empty() || na != nb || na.len() > 8 {
        return None;
    }
    (0..3)
        .map(|k| {
            let at: Vec<(String, Number)> = na
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), point(i, k)))
                .collect();
            let x = super::expr::evaluate_with(a, Grammar::MATH, &at).ok()?;
            let y = super::expr::evaluate_with(b, Grammar::MATH, &at).ok()?;
            Some((x.value, y.value))
        })
        .collect()
}

/// Two expressions over the same (non-empty) set of variables that agree at three points.
fn symbolic_equivalent(a: &str, b: &str) -> bool {
    sample_points(a, b).is_some_and(|v| v.iter().all(|(x, y)| x.equivalent(y)))
}

/// Whether two answers are equivalent after normalisation (see the module docs).
pub fn equivalent(answer: &str, reference: &str) -> bool {
    if answer.chars().count() > MAX_ANSWER_CHARS || reference.chars().count() > MAX_ANSWER_CHARS {
        return answer.trim() == reference.trim();
    }
    let (a, r) = (normalize_with_unit(answer), normalize_with_unit(reference));
    if a.text.is_empty()
        || r.text.is_empty()
        || units_conflict(a.unit.as_deref(), r.unit.as_deref())
    {
        return false;
    }
    // A multiple-choice reference: the answer's label decides (`(A) 12` answers `A`).
    if let (Some(want), Some(got)) = (choice_letter(&r.text), choice_label(&a.text)) {
        return want == got;
    }
    shapes_equivalent(shape(&a.text), shape(&r.text))
}

/// The letter of a multiple-choice reference: `B` or `(B)`.
fn choice_letter(s: &str) -> Option<char> {
    let inner = s
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .unwrap_or(s);
    let mut chars = inner.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c.is_ascii_uppercase() => Some(c),
        _ => None,
    }
}

/// The label an answer starts with when it names an option and then quotes it: `(A)12`.
fn choice_label(s: &str) -> Option<char> {
    let mut chars = s.chars();
    match (chars.next(), chars.next(), chars.next(), chars.next()) {
        (Some('('), Some(c), Some(')'), Some(_)) if c.is_ascii_uppercase() => Some(c),
        _ => None,
    }
}

/// Whether every element of `xs` pairs with its own element of `ys` under `eq` (multisets).
fn unordered(xs: &[&str], ys: &[&str], eq: impl Fn(&str, &str) -> bool) -> bool {
    if xs.len() != ys.len() {
        return false;
    }
    let mut used = vec![false; ys.len()];
    xs.iter().all(|x| {
        let hit = (0..ys.len()).find(|&j| !used[j] && eq(x, ys[j]));
        hit.map(|j| used[j] = true).is_some()
    })
}

fn shapes_equivalent(a: Shape<'_>, r: Shape<'_>) -> bool {
    let interval_eq = |x: &str, y: &str| shapes_equivalent(shape(x), shape(y));
    match (a, r) {
        (Shape::Scalar(x), Shape::Scalar(y)) => element_equivalent(x, y),
        (Shape::Set(xs), Shape::Set(ys)) => unordered(&xs, &ys, named_equivalent),
        (Shape::Union(xs), Shape::Union(ys)) => unordered(&xs, &ys, interval_eq),
        // Solutions listed without brackets: any order, and they are the set of solutions.
        (Shape::Tuple(None, xs), Shape::Tuple(None, ys) | Shape::Set(ys))
        | (Shape::Set(xs), Shape::Tuple(None, ys)) => unordered(&xs, &ys, named_equivalent),
        (Shape::Matrix(xs), Shape::Matrix(ys)) => {
            xs.len() == ys.len()
                && xs.iter().zip(&ys).all(|(x, y)| {
                    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| element_equivalent(a, b))
                })
        }
        (Shape::Equation(xs), Shape::Equation(ys)) => equations_equivalent(&xs, &ys),
        // A chain of numbers answers with its last value (`3÷4=0.75` is 0.75).
        (Shape::Equation(xs), other) => {
            chain_value(&xs).is_some_and(|v| shapes_equivalent(shape(v), other))
        }
        (other, Shape::Equation(ys)) => {
            chain_value(&ys).is_some_and(|v| shapes_equivalent(other, shape(v)))
        }
        (Shape::Tuple(bx, xs), Shape::Tuple(by, ys)) => {
            // A bare list matches a parenthesised tuple; other brackets must agree.
            let paren = Some(('(', ')'));
            let brackets_ok =
                bx == by || (bx.is_none() && by == paren) || (by.is_none() && bx == paren);
            brackets_ok
                && xs.len() == ys.len()
                && xs.iter().zip(&ys).all(|(x, y)| named_equivalent(x, y))
        }
        _ => false,
    }
}

/// Scores 1.0 when the final answer of the response is equivalent to the reference, else
/// 0.0 (see the module docs for extraction and comparison).
///
/// The reference may be a bare answer or a worked solution: when it contains `\boxed{…}` or
/// `####`, that part is the reference answer (so MATH and GSM8K solutions work as-is).
///
/// The answer is found by the verifier's [`Rules`], in their order ([`extract_answer_with`]).
/// The default consults every rule ([`Rule::ALL`]): the last number counts when no explicit
/// mark is present and the response ends like a finished answer, convenient for base models
/// that do not box their answers. [`MathVerifier::strict`] leaves the last number out, for RL
/// on a model that was taught a format, where a stray number should not earn reward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MathVerifier {
    rules: Rules,
}

impl Default for MathVerifier {
    fn default() -> Self {
        MathVerifier::with_rules(&Rule::ALL)
    }
}

impl MathVerifier {
    /// Only explicit answers count: `\boxed{}`, `<answer>`, `####`, "the answer is"
    /// ([`Rule::MARKED`]).
    pub fn strict() -> MathVerifier {
        MathVerifier::with_rules(&Rule::MARKED)
    }

    /// Only `rules` find the answer, in their order (a repeated rule keeps its first place; no
    /// rules find nothing, so every response scores 0).
    pub fn with_rules(rules: &[Rule]) -> MathVerifier {
        MathVerifier {
            rules: Rules::new(rules),
        }
    }

    /// The rules this verifier consults, in order.
    pub fn rules(&self) -> &[Rule] {
        self.rules.as_slice()
    }
}

/// The reference answer inside a reference solution, or the reference itself.
pub fn reference_answer(reference: &str) -> &str {
    let r = tail(reference);
    last_boxed(r)
        .or_else(|| after_hashes(r))
        .unwrap_or(reference)
}

/// At most `n` characters of `s`, for reward details.
fn clip(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if s.chars().nth(n).is_some() {
        out.push('…');
    }
    out
}

impl Verifier for MathVerifier {
    fn score(&self, response: &str, reference: &str) -> Reward {
        let Some(found) = extract_answer_with(response, self.rules()) else {
            return Reward::zero("no answer found");
        };
        let reference = reference_answer(reference);
        if found.rule == Rule::Boxed {
            // Several boxed answers that disagree are a hedge, not a final answer: a careful
            // grader refuses `either \boxed{5} or \boxed{6}` even when one of them is right.
            match distinct_boxed(tail(response)) {
                None => return Reward::zero("too many different boxed answers"),
                Some(boxes) if boxes.iter().any(|b| !equivalent(b, found.text)) => {
                    return Reward::zero("boxed answers that disagree");
                }
                Some(_) => {}
            }
        }
        if equivalent(found.text, reference) {
            Reward::new(1.0, "correct")
        } else {
            Reward::zero(format!(
                "wrong: {:?} ({:?}) vs reference {:?}",
                clip(found.text, 40),
                found.rule,
                clip(reference, 40)
            ))
        }
    }
}
