//! Math answer equivalence: extract the final answer from a response, normalise it, and
//! compare it to the reference by value.
//!
//! **Extraction order** ([`extract_answer`]), first rule that finds something wins:
//! 1. the last balanced `\boxed{…}` (or `\fbox{…}`);
//! 2. the last `<answer>…</answer>`;
//! 3. the rest of the line after the last `####` (GSM8K, and the built-in math task);
//! 4. the rest of the sentence after the last "answer is" / "answer:" (case-insensitive);
//! 5. the last number in the response (only when [`MathVerifier::last_number_fallback`]).
//!
//! **Normalisation** ([`normalize`]) strips `$…$`, `\(…\)`, `\[…\]`, `\left`/`\right`, LaTeX
//! spacing, `\text{…}` units (`5\text{ cm}` → `5`), degree signs, a leading `x =`, a trailing
//! `.`, thousands separators (`1,234` → `1234`, but `1,2` stays a pair), and rewrites
//! `\dfrac`/`\tfrac` to `\frac`.
//!
//! **Comparison** ([`equivalent`]): tuples and intervals compare element-wise in order; sets
//! (`\{3,2,1\}`), bare lists of solutions (`5, -3`) and unions of intervals
//! (`(1,2] \cup [3,4)`) in any order. Each element is evaluated with [`super::expr`]
//! (`2^{10}`, `-\frac{3}{4}`, `5!`, `\binom{5}{2}`, `\log_2 8`, `1.5e3`, `√2`, `sqrt(2)`) and
//! compared exactly when both sides are rational, else with relative tolerance 1e-6. Two
//! expressions over the same variables are compared by value at three fixed rational
//! points, exactly (`2b+3a` = `3a+2b`, `(x+1)^2` = `x^2+2x+1`; a polynomial identity that
//! holds at three generic points of exact arithmetic is all but certain). A percentage
//! matches both its number and its fraction (`50\%` = `50` = `0.5`). Elements that do not
//! evaluate (`\infty`) compare as normalised strings; `∅`, `\emptyset` and `\varnothing`
//! are one.
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

/// Which rule found the answer (see the module docs for the order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// The content of the last balanced `\boxed{…}` / `\fbox{…}`, in one pass: a stack of open
/// braces remembers which ones opened a box, so unbalanced boxes anywhere cost nothing extra.
pub fn last_boxed(s: &str) -> Option<&str> {
    let bytes = s.as_bytes();
    // For each open brace: Some(content start) when it opened a box.
    let mut stack: Vec<Option<usize>> = Vec::new();
    let mut best: Option<(usize, usize)> = None;
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
                    if best.is_none_or(|(b, _)| start > b) {
                        best = Some((start, i));
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    // Byte offsets sit next to ASCII braces, so they are character boundaries.
    best.and_then(|(a, b)| s.get(a..b))
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

/// The last number: digits with an optional sign, decimal point, thousands commas or `a/b`;
/// none in a response whose LaTeX is malformed ([`malformed`]): `\frac{5}{` is not 5.
fn last_number(s: &str) -> Option<&str> {
    if malformed(s) {
        return None;
    }
    let bytes = s.as_bytes();
    let end = bytes.iter().rposition(u8::is_ascii_digit)? + 1;
    let mut start = end;
    while start > 0 && matches!(bytes[start - 1], b'0'..=b'9' | b'.' | b',' | b'/') {
        start -= 1;
    }
    while start < end && matches!(bytes[start], b'.' | b',' | b'/') {
        start += 1;
    }
    // A minus sign, unless it is a subtraction (`5-3` ends in 3, not -3).
    let is_sign = start > 0
        && bytes[start - 1] == b'-'
        && (start < 2 || !(bytes[start - 2].is_ascii_alphanumeric() || bytes[start - 2] == b')'));
    if is_sign {
        start -= 1;
    }
    s.get(start..end)
}

/// One extraction rule: the answer text it finds, if any.
type Finder = fn(&str) -> Option<&str>;

/// Finds the final answer in `response` (see the module docs for the rule order).
/// `last_number_rule` enables rule 5.
pub fn extract_answer(response: &str, last_number_rule: bool) -> Option<Extracted<'_>> {
    let s = tail(response);
    let rules: [(Rule, Finder); 5] = [
        (Rule::Boxed, last_boxed),
        (Rule::AnswerTag, last_answer_tag),
        (Rule::Hashes, after_hashes),
        (Rule::AnswerIs, after_answer_is),
        (Rule::LastNumber, last_number),
    ];
    rules
        .into_iter()
        .filter(|(r, _)| last_number_rule || *r != Rule::LastNumber)
        .find_map(|(rule, f)| f(s).map(|text| Extracted { text, rule }))
}

/// Replaces every occurrence of each `(from, to)` pair, in order.
fn replace_all(s: String, pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .fold(s, |acc, (from, to)| acc.replace(from, to))
}

/// Removes a LaTeX command that is not followed by a letter (so `\left` goes but
/// `\leftarrow` stays).
fn remove_command(s: &str, cmd: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(p) = rest.find(cmd) {
        let after = &rest[p + cmd.len()..];
        out.push_str(&rest[..p]);
        if after.starts_with(|c: char| c.is_ascii_alphabetic()) {
            out.push_str(cmd);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Unwraps or drops text commands (`\text{…}`, `\mathrm{…}`, …): a group that is the whole
/// answer, or holds no letters, is unwrapped; a group with letters next to other content is a
/// unit and is dropped (`5\text{ cm}` → `5`).
fn strip_text_groups(s: &str) -> String {
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
        } else {
            // A unit's exponent goes with it: `25\text{ cm}^2`, `\mathrm{m}^{2}`.
            after += unit_exponent_len(&rest[after..]);
        }
        rest = &rest[after..];
        search_from = 0;
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
    let mut s = strip_delimiters(answer.trim());
    if let Some(inner) = strip_wrapper(s, "\\boxed{") {
        s = inner;
    }
    // `\$5` is five dollars; the other `$` are math delimiters.
    let s = s.replace("\\$", "").replace('$', "");
    let s = s.replace("{,}", ",");
    let s = strip_text_groups(&s);
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
    for cmd in ["\\left", "\\right", "\\displaystyle", "\\qquad", "\\quad"] {
        s = remove_command(&s, cmd);
    }
    let s = strip_thousands(&s);
    let mut s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    while s.ends_with('.') && !s.ends_with("..") {
        s.pop();
    }
    // `x=5` → `5`: a single short name on the left of the only `=`.
    if let Some((lhs, rhs)) = s.split_once('=') {
        let name = lhs.strip_prefix('\\').unwrap_or(lhs);
        if !rhs.contains('=')
            && !rhs.is_empty()
            && !name.is_empty()
            && name.len() <= 8
            && name.chars().all(|c| c.is_ascii_alphabetic())
        {
            s = rhs.to_string();
        }
    }
    s
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
        return a.trim_end_matches('%') == b.trim_end_matches('%') || symbolic_equivalent(a, b);
    }
    va.iter().any(|x| vb.iter().any(|y| x.equivalent(y)))
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

/// Two expressions over the same (non-empty) set of variables that agree at three points.
fn symbolic_equivalent(a: &str, b: &str) -> bool {
    let (Ok(na), Ok(nb)) = (
        super::expr::variables(a, Grammar::MATH),
        super::expr::variables(b, Grammar::MATH),
    ) else {
        return false;
    };
    if na.is_empty() || na != nb || na.len() > 8 {
        return false;
    }
    (0..3).all(|k| {
        let at: Vec<(String, Number)> = na
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), point(i, k)))
            .collect();
        match (
            super::expr::evaluate_with(a, Grammar::MATH, &at),
            super::expr::evaluate_with(b, Grammar::MATH, &at),
        ) {
            (Ok(x), Ok(y)) => x.value.equivalent(&y.value),
            _ => false,
        }
    })
}

/// Whether two answers are equivalent after normalisation (see the module docs).
pub fn equivalent(answer: &str, reference: &str) -> bool {
    if answer.chars().count() > MAX_ANSWER_CHARS || reference.chars().count() > MAX_ANSWER_CHARS {
        return answer.trim() == reference.trim();
    }
    let (a, r) = (normalize(answer), normalize(reference));
    if a.is_empty() || r.is_empty() {
        return false;
    }
    shapes_equivalent(shape(&a), shape(&r))
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
        (Shape::Set(xs), Shape::Set(ys)) => unordered(&xs, &ys, element_equivalent),
        (Shape::Union(xs), Shape::Union(ys)) => unordered(&xs, &ys, interval_eq),
        // Solutions listed without brackets: any order.
        (Shape::Tuple(None, xs), Shape::Tuple(None, ys)) => unordered(&xs, &ys, element_equivalent),
        (Shape::Tuple(bx, xs), Shape::Tuple(by, ys)) => {
            // A bare list matches a parenthesised tuple; other brackets must agree.
            let paren = Some(('(', ')'));
            let brackets_ok =
                bx == by || (bx.is_none() && by == paren) || (by.is_none() && bx == paren);
            brackets_ok
                && xs.len() == ys.len()
                && xs.iter().zip(&ys).all(|(x, y)| element_equivalent(x, y))
        }
        _ => false,
    }
}

/// Scores 1.0 when the final answer of the response is equivalent to the reference, else
/// 0.0 (see the module docs for extraction and comparison).
///
/// The reference may be a bare answer or a worked solution: when it contains `\boxed{…}` or
/// `####`, that part is the reference answer (so MATH and GSM8K solutions work as-is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MathVerifier {
    /// Accept the last number of the response when no explicit answer marker is present.
    /// Convenient for base models that do not box their answers; off for RL on a model that
    /// was taught a format, where a stray number should not earn reward.
    pub last_number_fallback: bool,
}

impl Default for MathVerifier {
    fn default() -> Self {
        MathVerifier {
            last_number_fallback: true,
        }
    }
}

impl MathVerifier {
    /// Only explicit answers count: `\boxed{}`, `<answer>`, `####`, "the answer is".
    pub fn strict() -> MathVerifier {
        MathVerifier {
            last_number_fallback: false,
        }
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
        let Some(found) = extract_answer(response, self.last_number_fallback) else {
            return Reward::zero("no answer found");
        };
        let reference = reference_answer(reference);
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
