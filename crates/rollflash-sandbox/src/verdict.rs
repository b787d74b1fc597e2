//! What an execution did: its verdict, its (capped) output and how it ended.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a program fared, most specific reason first. Serialised in snake case; that name is
/// what trajectories and metrics show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Exited cleanly (and printed the expected output, when one was given).
    Passed,
    /// Ran, but printed something else than expected or failed an assertion of its tests.
    WrongAnswer,
    /// Exited with an error (an exception, a non-zero status, a signal).
    RuntimeError,
    /// Passed its wall-clock deadline or its CPU-time limit, and was killed.
    Timeout,
    /// Failed to allocate under its memory limit.
    Memory,
    /// Wrote more than the output cap, and was killed.
    OutputLimit,
    /// Did not parse.
    SyntaxError,
    /// There was no program to run (the response held no code); never produced by the
    /// sandbox itself, which always has a program.
    NoCode,
}

impl Verdict {
    /// Every verdict, in declaration order (for per-kind counts).
    pub const ALL: [Verdict; 8] = [
        Verdict::Passed,
        Verdict::WrongAnswer,
        Verdict::RuntimeError,
        Verdict::Timeout,
        Verdict::Memory,
        Verdict::OutputLimit,
        Verdict::SyntaxError,
        Verdict::NoCode,
    ];

    /// The snake-case name (`"wrong_answer"`), as serialised.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::WrongAnswer => "wrong_answer",
            Verdict::RuntimeError => "runtime_error",
            Verdict::Timeout => "timeout",
            Verdict::Memory => "memory",
            Verdict::OutputLimit => "output_limit",
            Verdict::SyntaxError => "syntax_error",
            Verdict::NoCode => "no_code",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The result of one execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// The verdict.
    pub verdict: Verdict,
    /// Standard output, at most the output cap (lossy UTF-8).
    pub stdout: String,
    /// Standard error, at most the output cap (lossy UTF-8).
    pub stderr: String,
    /// The sandbox's exit status: the program's code, or 128 + the signal that ended it
    /// (bubblewrap's convention; a remote server's report of a signal is converted to it).
    /// `None` when the host killed it (deadline, output cap), and for a remote execution
    /// that timed out or passed the output cap, so both sandboxes give the same shape.
    pub exit_code: Option<i32>,
    /// Wall time from spawn to reaped (remote: the server's `execution_time`, else the
    /// request's round trip).
    pub wall: Duration,
}
