//! The countdown game (as in TinyZero): combine the given numbers with `+ - × ÷` and
//! parentheses to reach a target, using **each number exactly once**.
//!
//! The reference is JSON: `{"numbers": [3, 5, 7], "target": 22}` (`"nums"` is accepted for
//! `"numbers"`, as in TinyZero's data). The answer is the last `<answer>…</answer>` of the
//! response, else its last `\boxed{…}`; it may end in `= target` (`3*5+7 = 22`). Arithmetic
//! is exact (rationals), so `(8/3)*3` reaches 8 and a division that only approximately hits
//! the target does not.

use serde::Deserialize;

use super::expr::{evaluate, Grammar, Number, Rational};
use super::math::last_boxed;
use super::{Reward, Verifier};

/// The countdown reference: the numbers to use and the target to reach.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountdownProblem {
    /// Each must be used exactly once.
    #[serde(alias = "nums")]
    pub numbers: Vec<i64>,
    /// The value to reach.
    pub target: i64,
}

/// Scores countdown answers: 1.0 when the expression uses each number exactly once and equals
/// the target, [`CountdownVerifier::format_score`] when an answer was given but is wrong, 0.0
/// when there is no answer (or the reference is not valid JSON).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CountdownVerifier {
    /// Reward for a wrong but present answer. TinyZero uses 0.1 so early training learns to
    /// answer in the format at all.
    pub format_score: f64,
}

impl Default for CountdownVerifier {
    fn default() -> Self {
        CountdownVerifier { format_score: 0.1 }
    }
}

/// The answer text of a countdown response.
fn extract(response: &str) -> Option<&str> {
    let end = response.rfind("</answer>");
    let tagged = end.and_then(|end| {
        let start = response[..end].rfind("<answer>")? + "<answer>".len();
        Some(&response[start..end])
    });
    tagged.or_else(|| last_boxed(response)).map(str::trim)
}

/// Why `expr` is not a solution of `problem`, or `None` when it is.
fn check(expr: &str, problem: &CountdownProblem) -> Option<String> {
    // `lhs = rhs`: use whichever side is the expression over the numbers.
    let sides: Vec<&str> = expr.split('=').collect();
    if sides.len() > 2 {
        return Some("more than one `=`".into());
    }
    let mut want: Vec<i128> = problem.numbers.iter().map(|&n| i128::from(n)).collect();
    want.sort_unstable();
    let target = Number::Exact(Rational::int(i128::from(problem.target)));
    let mut why = String::from("empty answer");
    for side in sides {
        let e = match evaluate(side, Grammar::COUNTDOWN) {
            Ok(e) => e,
            Err(err) => {
                why = format!("not an expression: {err}");
                continue;
            }
        };
        let mut used: Vec<i128> = e
            .literals
            .iter()
            .filter_map(|n| n.exact().and_then(|r| r.as_integer()))
            .collect();
        used.sort_unstable();
        if used.len() != e.literals.len() || used != want {
            why = "numbers not used exactly once".into();
            continue;
        }
        // Exact only: an overflowed (approximate) value never counts as reaching the target.
        if e.value == target {
            return None;
        }
        why = format!("evaluates to {}, not {}", e.value, problem.target);
    }
    Some(why)
}

impl Verifier for CountdownVerifier {
    fn score(&self, response: &str, reference: &str) -> Reward {
        let problem: CountdownProblem = match serde_json::from_str(reference) {
            Ok(p) => p,
            Err(e) => return Reward::zero(format!("bad countdown reference: {e}")),
        };
        let Some(answer) = extract(super::math::tail(response)) else {
            return Reward::zero("no answer found");
        };
        match check(answer, &problem) {
            None => Reward::new(1.0, "correct"),
            Some(why) => Reward::new(self.format_score, format!("wrong: {why}")),
        }
    }
}
