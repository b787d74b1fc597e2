//! A run directory as the dashboard reads it, and the two files it adds to one:
//! `timeline.jsonl` ([`TimelineLog`], one [`TimelineEvent`] a line) and `trajectories.jsonl`
//! ([`TrajectoryLog`], one [`TrajectoryRecord`] a line). `metrics.jsonl` and `summary.json`
//! are the run crate's; they are read here as plain JSON.
//!
//! Every file is appended a whole line at a time and flushed, so a reader during the run
//! sees complete lines, except perhaps a last one being written: a last line without its
//! newline is skipped (the next read has it). Any other line that does not parse is an
//! error naming the file and the line.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rollflash_core::timeline::{TimelineEvent, TimelineSink};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::trajectories::TrajectoryRecord;
use rollflash_core::IoError;

/// The per-step metrics the run appends.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// Timeline events.
pub const TIMELINE_FILE: &str = "timeline.jsonl";
/// Sampled trajectories.
pub const TRAJECTORIES_FILE: &str = "trajectories.jsonl";
/// What a finished run adds (evaluations before and after, totals).
pub const SUMMARY_FILE: &str = "summary.json";

/// A run directory's file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    Io(#[from] IoError),
    /// A line that is not the record the file holds.
    #[error("{} line {line}", path.display())]
    Malformed {
        path: PathBuf,
        /// 1-based.
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads a JSON-lines file; a missing file is empty (the run has not written it yet).
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, FileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(FileError::Io(IoError::new(
                "cannot read",
                path.to_path_buf(),
                source,
            )))
        }
    };
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            // The line the run is writing right now.
            Err(_) if i + 1 == lines.len() && !complete => {}
            Err(source) => {
                return Err(FileError::Malformed {
                    path: path.to_path_buf(),
                    line: i + 1,
                    source,
                })
            }
        }
    }
    Ok(out)
}

/// The files of one run directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// The run writing (or having written) to `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        RunDir { root: root.into() }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `metrics.jsonl`: one JSON object per step.
    pub fn metrics(&self) -> Result<Vec<Value>, FileError> {
        read_jsonl(&self.root.join(METRICS_FILE))
    }

    /// `timeline.jsonl`.
    pub fn timeline(&self) -> Result<Vec<TimelineEvent>, FileError> {
        read_jsonl(&self.root.join(TIMELINE_FILE))
    }

    /// `trajectories.jsonl`.
    pub fn trajectories(&self) -> Result<Vec<TrajectoryRecord>, FileError> {
        read_jsonl(&self.root.join(TRAJECTORIES_FILE))
    }

    /// `summary.json`, once the run has finished.
    pub fn summary(&self) -> Result<Option<Value>, FileError> {
        let path = self.root.join(SUMMARY_FILE);
        match std::fs::read_to_string(&path) {
            Ok(t) => serde_json::from_str(&t)
                .map(Some)
                .map_err(|source| FileError::Malformed {
                    path,
                    line: 1,
                    source,
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(FileError::Io(IoError::new("cannot read", path, source))),
        }
    }
}

/// A JSON-lines file open for appending, one flushed line per record.
#[derive(Debug)]
struct Appender {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl Appender {
    /// Opens `path`: truncated for a new run, appended to when `append` (a resumed one).
    /// A resumed file first loses a torn last line (a run killed mid-write, or a disk that
    /// filled mid-line): appending after it would glue the next record to the fragment and
    /// leave a malformed line in the middle, which readers refuse.
    fn open(path: PathBuf, append: bool) -> Result<Self, FileError> {
        let err = |source| FileError::Io(IoError::new("cannot write", path.clone(), source));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&path)
            .map_err(err)?;
        if append {
            let dropped = drop_torn_tail(&file).map_err(err)?;
            if dropped > 0 {
                tracing::warn!(
                    path = %path.display(),
                    bytes = dropped,
                    "dropped a torn last line (written when the run stopped)"
                );
            }
        }
        Ok(Appender {
            path,
            file: Mutex::new(file),
        })
    }

    fn append(&self, v: &impl serde::Serialize) -> Result<(), FileError> {
        let err = |source| FileError::Io(IoError::new("cannot write", self.path.clone(), source));
        let mut line = serde_json::to_vec(v).map_err(|e| err(std::io::Error::other(e)))?;
        line.push(b'\n');
        // One write call per line: a reader sees whole lines or a torn last one.
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(&line).and_then(|()| f.flush()).map_err(err)
    }
}

/// Truncates `file` after its last newline; returns how many bytes that removed (0 when
/// the file is empty or ends with a newline). Reads backwards from the end, a block at a
/// time, so a large file with a short torn tail costs one block.
fn drop_torn_tail(file: &std::fs::File) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    const BLOCK: u64 = 64 * 1024;
    let len = file.metadata()?.len();
    let mut reader = file;
    let mut end = len;
    let mut buf = vec![0u8; BLOCK as usize];
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let n = (end - start) as usize;
        reader.seek(SeekFrom::Start(start))?;
        reader.read_exact(&mut buf[..n])?;
        if let Some(i) = buf[..n].iter().rposition(|&b| b == b'\n') {
            let keep = start + i as u64 + 1;
            if keep < len {
                file.set_len(keep)?;
            }
            return Ok(len - keep);
        }
        end = start;
    }
    // No newline at all: the whole file is one torn line.
    if len > 0 {
        file.set_len(0)?;
    }
    Ok(len)
}

/// `timeline.jsonl`, written as the drivers report events. A failed write is logged once
/// and the run goes on: the timeline is for watching, not for resuming.
#[derive(Debug)]
pub struct TimelineLog {
    out: Appender,
    warned: std::sync::atomic::AtomicBool,
}

impl TimelineLog {
    /// Creates (or, when `append`, continues) `dir/timeline.jsonl`.
    pub fn create(dir: &Path, append: bool) -> Result<Self, FileError> {
        Ok(TimelineLog {
            out: Appender::open(dir.join(TIMELINE_FILE), append)?,
            warned: false.into(),
        })
    }
}

impl TimelineSink for TimelineLog {
    fn record(&self, event: TimelineEvent) {
        if let Err(e) = self.out.append(&event) {
            if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(error = %rollflash_core::error_chain(&e), "timeline not written; the run goes on");
            }
        }
    }
}

/// `trajectories.jsonl`.
#[derive(Debug)]
pub struct TrajectoryLog {
    out: Appender,
}

impl TrajectoryLog {
    /// Creates (or, when `append`, continues) `dir/trajectories.jsonl`.
    pub fn create(dir: &Path, append: bool) -> Result<Self, FileError> {
        Ok(TrajectoryLog {
            out: Appender::open(dir.join(TRAJECTORIES_FILE), append)?,
        })
    }

    /// Appends records.
    pub fn append(&self, records: &[TrajectoryRecord]) -> Result<(), FileError> {
        records.iter().try_for_each(|r| self.out.append(r))
    }
}
