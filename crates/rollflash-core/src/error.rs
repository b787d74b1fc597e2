//! Errors shared by every crate: `IoError`, a file operation that failed (what was being done,
//! on which path, and the operating system's reason as its source), the one shape every
//! crate's error enum wraps for it; and [`error_chain`], how an error is printed on one line
//! with its causes. Values only: the core still does no I/O, it names the failures of those
//! that do.

use std::path::PathBuf;

/// A file operation that failed: `what` was being done (`"cannot read"`, `"cannot create"`) on
/// `path`, and why (`source`).
#[derive(Debug, thiserror::Error)]
#[error("{what} {}", path.display())]
pub struct IoError {
    /// The operation, as the start of a sentence: `"cannot write"`.
    pub what: &'static str,
    /// The file or directory it was done on.
    pub path: PathBuf,
    /// The operating system's reason.
    #[source]
    pub source: std::io::Error,
}

impl IoError {
    /// The error of `what` on `path`.
    pub fn new(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        IoError {
            what,
            path: path.into(),
            source,
        }
    }

    /// The conversion `map_err` wants: `fs::read(p).map_err(IoError::at("cannot read", p))?`.
    pub fn at(
        what: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> IoError {
        let path = path.into();
        move |source| IoError { what, path, source }
    }
}

/// An error and its sources on one line, `a: b: c`, each said once. Our errors name their
/// context and keep the cause as their source, so `Display` alone drops the reason (and
/// `reqwest`'s says only "error sending request"); logs, trajectory failure reasons and wire
/// messages print this instead. A cause whose text is already in the line (a third-party
/// error that repeats its source in its own message) is skipped.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}
