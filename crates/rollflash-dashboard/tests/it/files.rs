//! Readers and writers of a run directory: round trips, a malformed line named by file and
//! line, a torn last line (the one being written) skipped, a torn line left by a stopped run
//! dropped when the next run continues the file, a missing file empty.

use rollflash_core::timeline::{EventKind, TimelineEvent, TimelineSink};
use rollflash_dashboard::files::{read_jsonl, TIMELINE_FILE};
use rollflash_dashboard::{FileError, RunDir, TimelineLog};
use serde_json::Value;

fn event(start_ms: u64) -> TimelineEvent {
    TimelineEvent {
        lane: "engine-0".into(),
        kind: EventKind::Generate,
        start_ms,
        end_ms: start_ms + 10,
        version: 1,
        count: 2,
        tokens: 30,
    }
}

#[test]
fn the_timeline_log_round_trips_and_a_resume_appends() {
    let dir = tempfile::tempdir().unwrap();
    let log = TimelineLog::create(dir.path(), false).unwrap();
    log.record(event(0));
    log.record(event(100));
    drop(log);
    let again = TimelineLog::create(dir.path(), true).unwrap();
    again.record(event(200));
    let read = RunDir::new(dir.path()).timeline().unwrap();
    assert_eq!(read, vec![event(0), event(100), event(200)]);
    // A new run truncates.
    TimelineLog::create(dir.path(), false).unwrap();
    assert!(RunDir::new(dir.path()).timeline().unwrap().is_empty());
}

/// A run stopped mid-write (killed, or its disk full) leaves a torn last line; the resumed
/// run's records must not be glued to it, which would leave a malformed line mid-file.
#[test]
fn a_resume_drops_a_torn_last_line_before_appending() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(TIMELINE_FILE);
    let log = TimelineLog::create(dir.path(), false).unwrap();
    log.record(event(0));
    log.record(event(100));
    drop(log);
    let whole = std::fs::metadata(&path).unwrap().len();
    let torn = serde_json::to_string(&event(150)).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(&torn.as_bytes()[..torn.len() / 2]).unwrap();
    drop(f);
    let again = TimelineLog::create(dir.path(), true).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        whole,
        "torn bytes dropped"
    );
    again.record(event(200));
    assert_eq!(
        RunDir::new(dir.path()).timeline().unwrap(),
        vec![event(0), event(100), event(200)]
    );

    // A file that is nothing but a torn line (no newline at all) is emptied; an intact one
    // is left as it is.
    std::fs::write(&path, &torn.as_bytes()[..10]).unwrap();
    TimelineLog::create(dir.path(), true).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    let line = format!("{torn}\n");
    std::fs::write(&path, line.repeat(5000)).unwrap(); // > one 64 KiB block
    TimelineLog::create(dir.path(), true).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        (line.len() * 5000) as u64
    );
    // A torn tail longer than a block: the newline is found blocks back.
    std::fs::write(&path, format!("{}{}", line.repeat(3), "x".repeat(200_000))).unwrap();
    TimelineLog::create(dir.path(), true).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        (line.len() * 3) as u64
    );
}

#[test]
fn a_malformed_line_names_the_file_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    std::fs::write(
        &path,
        "{\"step\":0}\n{\"step\":1}\nnot json\n{\"step\":3}\n",
    )
    .unwrap();
    let e = RunDir::new(dir.path()).metrics().unwrap_err();
    assert!(matches!(e, FileError::Malformed { line: 3, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("metrics.jsonl line 3"), "{msg}");
}

#[test]
fn a_torn_last_line_is_the_one_being_written_and_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(TIMELINE_FILE);
    let whole = serde_json::to_string(&event(0)).unwrap();
    std::fs::write(&path, format!("{whole}\n{}", &whole[..whole.len() / 2])).unwrap();
    assert_eq!(read_jsonl::<TimelineEvent>(&path).unwrap(), vec![event(0)]);
    // The same line finished with its newline but still broken is an error.
    std::fs::write(&path, format!("{whole}\n{}\n", &whole[..whole.len() / 2])).unwrap();
    let e = read_jsonl::<TimelineEvent>(&path).unwrap_err();
    assert!(e.to_string().contains("timeline.jsonl line 2"), "{e}");
}

#[test]
fn missing_files_are_empty_and_summary_is_absent() {
    let dir = tempfile::tempdir().unwrap();
    let run = RunDir::new(dir.path());
    assert!(run.metrics().unwrap().is_empty());
    assert!(run.timeline().unwrap().is_empty());
    assert!(run.trajectories().unwrap().is_empty());
    assert_eq!(run.summary().unwrap(), None::<Value>);
}
