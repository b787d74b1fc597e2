//! What to run: a language, its source, its standard input and arguments.

use std::path::Path;

/// A language the sandbox can run. Each knows its interpreter's command line and how it
/// reports a syntax error or an exhausted memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Language {
    /// Python 3, run as `python3 -I -B main.py`: isolated mode (no user site directory, no
    /// `PYTHON*` variables, the script's directory not on `sys.path`) and no bytecode files.
    Python,
}

impl Language {
    /// The source file's name inside the sandbox.
    pub fn file_name(self) -> &'static str {
        match self {
            Language::Python => "main.py",
        }
    }

    /// The interpreter's arguments before the program's own, for the source at `source`.
    pub(crate) fn argv(self, interpreter: &Path, source: &str) -> Vec<String> {
        match self {
            Language::Python => vec![
                interpreter.display().to_string(),
                "-I".into(),
                "-B".into(),
                source.into(),
            ],
        }
    }

    /// Whether stderr's last line says the program did not parse.
    pub(crate) fn is_syntax_error(self, last_line: &str) -> bool {
        match self {
            Language::Python => ["SyntaxError", "IndentationError", "TabError"]
                .iter()
                .any(|e| last_line.starts_with(e)),
        }
    }

    /// Whether stderr's last line says an allocation failed.
    pub(crate) fn is_memory_error(self, last_line: &str) -> bool {
        match self {
            Language::Python => last_line.starts_with("MemoryError"),
        }
    }

    /// Whether stderr's last line is a failed assertion: the program's own test said no.
    pub(crate) fn is_failed_check(self, last_line: &str) -> bool {
        match self {
            Language::Python => last_line.starts_with("AssertionError"),
        }
    }
}

/// One program to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// Its language.
    pub language: Language,
    /// Its source text.
    pub source: String,
    /// Bytes given on its standard input (then closed).
    pub stdin: Vec<u8>,
    /// Arguments after the source file (`sys.argv[1:]`).
    pub args: Vec<String>,
    /// When set, the run passes only if stdout equals this, both trimmed of whitespace at
    /// both ends of every line and of blank lines at either end (the usual judge rule for
    /// stdin/stdout cases); otherwise a clean exit passes.
    pub expected_stdout: Option<String>,
}

impl Program {
    /// A Python program with no input, arguments or expected output.
    pub fn python(source: impl Into<String>) -> Program {
        Program {
            language: Language::Python,
            source: source.into(),
            stdin: Vec::new(),
            args: Vec::new(),
            expected_stdout: None,
        }
    }

    /// With `stdin` as its input.
    pub fn with_stdin(mut self, stdin: impl Into<Vec<u8>>) -> Program {
        self.stdin = stdin.into();
        self
    }

    /// With `args` after the source file.
    pub fn with_args(mut self, args: Vec<String>) -> Program {
        self.args = args;
        self
    }

    /// Passing only when stdout matches `expected` (see [`Program::expected_stdout`]).
    pub fn expecting(mut self, expected: impl Into<String>) -> Program {
        self.expected_stdout = Some(expected.into());
        self
    }
}

/// `text` with whitespace cut from both ends of every line and blank lines cut from both ends.
pub(crate) fn normalise_output(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let start = lines
        .iter()
        .position(|l| !l.is_empty())
        .unwrap_or(lines.len());
    let end = lines
        .iter()
        .rposition(|l| !l.is_empty())
        .map_or(start, |e| e + 1);
    lines[start..end.max(start)].join("\n")
}
