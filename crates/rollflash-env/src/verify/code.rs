//! The code reward: the response's program, run against a row's tests in the sandbox.
//!
//! Unlike the other verifiers this one is not a pure function: it runs the model's code, so it
//! is async and goes through a [`Sandbox`] (a bounded pool of isolated executions). Two test
//! shapes, those of the public data sets:
//!
//! - **Assert style** (HumanEval, MBPP): the row's prompt, test code defining
//!   `check(candidate)`, and an entry point. When the response's code defines the entry point,
//!   the program is the prompt's import lines, then that code; otherwise the code is a
//!   completion of the prompt, and the program is the prompt followed by it. Then the tests and
//!   `check(entry_point)`. A failed assertion is a wrong answer.
//! - **stdin/stdout cases** (APPS, CodeContests): the program is run once per case with the
//!   case's input, and its output compared with the expected one, whitespace-trimmed per line.

use rollflash_sandbox::{Execution, Program, Sandbox, SandboxError, Verdict};
use serde::{Deserialize, Serialize};

/// A row's tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CodeTests {
    /// HumanEval/MBPP: `check(entry_point)` from `test` must pass.
    Assert {
        /// The prompt the model completes (a function signature and docstring).
        prompt: String,
        /// Test code defining `check(candidate)`.
        test: String,
        /// The function under test.
        entry_point: String,
    },
    /// APPS/CodeContests: each input must give its output.
    Io {
        /// `(stdin, expected stdout)` pairs.
        cases: Vec<(String, String)>,
    },
}

impl CodeTests {
    /// How many tests a score counts (cases; an assert block is one).
    pub fn count(&self) -> usize {
        match self {
            CodeTests::Assert { .. } => 1,
            CodeTests::Io { cases } => cases.len(),
        }
    }
}

/// How passed tests become a reward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CodeScoring {
    /// 1 when every test passes, else 0; stops at the first failing case.
    #[default]
    PassFail,
    /// The fraction of tests passed; runs every case.
    Fraction,
}

/// Where a response's code is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CodeExtract {
    /// The last closed fenced block ([`extract_code`]): what chat models write, and what
    /// the public recipes score.
    #[default]
    LastFence,
    /// The whole response is the program (a base model completing a function body, or a
    /// prompt that asks for bare code).
    Whole,
}

impl CodeExtract {
    /// The code of `response` under this rule; `None` when there is none.
    pub fn code(self, response: &str) -> Option<String> {
        match self {
            CodeExtract::LastFence => extract_code(response),
            CodeExtract::Whole => Some(response.to_string()).filter(|c| !c.trim().is_empty()),
        }
    }
}

/// The score of one response.
#[derive(Debug, Clone, PartialEq)]
pub struct CodeScore {
    /// The reward, in `[0, 1]`.
    pub reward: f64,
    /// [`Verdict::Passed`] when all tests passed, else the first failing test's verdict (in
    /// case order), or [`Verdict::NoCode`].
    pub verdict: Verdict,
    /// Tests run that passed.
    pub passed: usize,
    /// Tests the row has.
    pub total: usize,
    /// The first failing run's stderr (its end, where the error is), for the trajectory.
    pub detail: String,
}

/// The code of the last fenced block (```` ``` ```` or ```` ```python ````) of `response`;
/// `None` when it has no closed block, or only empty ones.
pub fn extract_code(response: &str) -> Option<String> {
    let mut last = None;
    let mut open: Option<Vec<&str>> = None;
    for line in response.lines() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => open = Some(Vec::new()),
            (Some(body), true) => {
                last = Some(body.join("\n"));
                open = None;
            }
            (Some(body), false) => body.push(line),
            (None, false) => {}
        }
    }
    last.filter(|c| !c.trim().is_empty())
}

/// Whether `code` defines a function named `name` at its top level.
fn defines(code: &str, name: &str) -> bool {
    code.lines().any(|l| {
        let l = l.strip_prefix("async ").unwrap_or(l);
        l.strip_prefix("def ")
            .and_then(|rest| rest.strip_prefix(name))
            .is_some_and(|rest| rest.trim_start().starts_with('('))
    })
}

/// The assert-style program for `code`.
pub fn assert_program(prompt: &str, test: &str, entry_point: &str, code: &str) -> String {
    let body = if defines(code, entry_point) {
        // The model wrote the whole function: keep only what the prompt imports, since a
        // prompt need not be code (MBPP's is prose).
        let imports: Vec<&str> = prompt
            .lines()
            .filter(|l| l.starts_with("import ") || l.starts_with("from "))
            .collect();
        format!("{}\n{code}", imports.join("\n"))
    } else {
        format!("{prompt}{code}")
    };
    format!("{body}\n\n{test}\n\ncheck({entry_point})\n")
}

/// The last lines of a run's stderr (where a traceback says what failed).
fn tail(e: &Execution) -> String {
    let lines: Vec<&str> = e.stderr.lines().collect();
    lines[lines.len().saturating_sub(3)..].join("\n")
}

/// Scores `response` against `tests`. An error means the sandbox failed, not the program.
pub async fn score_code(
    sandbox: &Sandbox,
    tests: &CodeTests,
    response: &str,
    extract: CodeExtract,
    scoring: CodeScoring,
) -> Result<CodeScore, SandboxError> {
    let total = tests.count();
    let Some(code) = extract.code(response) else {
        return Ok(CodeScore {
            reward: 0.0,
            verdict: Verdict::NoCode,
            passed: 0,
            total,
            detail: match extract {
                CodeExtract::LastFence => "no fenced code block",
                CodeExtract::Whole => "an empty response",
            }
            .into(),
        });
    };
    let runs: Vec<Execution> = match tests {
        CodeTests::Assert {
            prompt,
            test,
            entry_point,
        } => {
            let program = Program::python(assert_program(prompt, test, entry_point, &code));
            vec![sandbox.run(&program).await?]
        }
        CodeTests::Io { cases } => {
            let program = |(input, output): &(String, String)| {
                Program::python(code.clone())
                    .with_stdin(input.as_bytes())
                    .expecting(output.clone())
            };
            match scoring {
                CodeScoring::PassFail => {
                    let mut runs = Vec::new();
                    for case in cases {
                        let e = sandbox.run(&program(case)).await?;
                        let failed = e.verdict != Verdict::Passed;
                        runs.push(e);
                        if failed {
                            break;
                        }
                    }
                    runs
                }
                // The pool bounds how many of these run at once.
                CodeScoring::Fraction => {
                    futures::future::try_join_all(
                        cases
                            .iter()
                            .map(|c| async move { sandbox.run(&program(c)).await }),
                    )
                    .await?
                }
            }
        }
    };
    let passed = runs.iter().filter(|e| e.verdict == Verdict::Passed).count();
    let failed = runs.iter().find(|e| e.verdict != Verdict::Passed);
    let all = passed == total && total > 0;
    let reward = match scoring {
        CodeScoring::PassFail => f64::from(u8::from(all)),
        CodeScoring::Fraction if total == 0 => 0.0,
        CodeScoring::Fraction => passed as f64 / total as f64,
    };
    Ok(CodeScore {
        reward,
        verdict: failed.map_or(Verdict::Passed, |e| e.verdict),
        passed,
        total,
        detail: failed.map(tail).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_closed_fenced_block_is_the_code() {
        let r = "Plan:\n```\nold()\n```\nThen:\n```python\ndef f(x):\n    return x\n```\nDone.";
        assert_eq!(extract_code(r).as_deref(), Some("def f(x):\n    return x"));
        assert_eq!(extract_code("no code here"), None);
        assert_eq!(extract_code("```python\nunclosed"), None);
        assert_eq!(extract_code("```\n\n```"), None);
        assert_eq!(
            extract_code("  ```py\nx = 1\n  ```").as_deref(),
            Some("x = 1")
        );
    }

    #[test]
    fn a_whole_function_keeps_the_prompt_s_imports_and_a_completion_follows_the_prompt() {
        let prompt =
            "from typing import List\n\ndef f(xs: List[int]) -> int:\n    \"\"\"Sum.\"\"\"\n";
        let whole = assert_program(
            prompt,
            "def check(c): assert c([1]) == 1",
            "f",
            "def f(xs):\n    return sum(xs)",
        );
        assert!(
            whole.starts_with("from typing import List\ndef f(xs):"),
            "{whole}"
        );
        assert!(whole.ends_with("check(f)\n"));
        let completion = assert_program(prompt, "T", "f", "    return sum(xs)");
        assert!(completion.starts_with(prompt), "{completion}");
        assert!(completion.contains("\"\"\"Sum.\"\"\"\n    return sum(xs)"));
        assert!(defines("async def f (x):", "f"));
        assert!(!defines("def fx(x):", "f"));
    }
}
