//! TensorBoard event files written natively (`metrics.tensorboard = true`): every numeric
//! metric of each step (the keys of `metrics.jsonl`, nested maps flattened as `map/key`)
//! and the held-out evaluations, as scalars under `output_dir/tensorboard/`, flushed per
//! step so a TensorBoard pointed at the directory sees the run as it runs.
//!
//! The format is TensorFlow's: a file `events.out.tfevents.<secs>.<hostname>` of TFRecord
//! frames (u64 length, masked CRC32C of the length, the bytes, masked CRC32C of the bytes),
//! each a `tensorflow.Event` protobuf. The first event carries `file_version:
//! "brain.Event:2"`; every later one `wall_time`, `step` and a `summary` of `value { tag,
//! simple_value }`. Only those six fields of three messages are ever written, so they are
//! encoded here by hand (a few varints, a fixed64 and a fixed32) rather than through a
//! protobuf code generator and TensorFlow's `.proto` files; the field numbers are quoted
//! from `tensorflow/core/util/event.proto` and `tensorflow/core/framework/summary.proto`.
//!
//! A resumed run writes a new file, after cutting the older files back to the steps before
//! the checkpoint (the same steps `metrics.jsonl` keeps), so no step appears twice; a fresh
//! run in a used output directory removes the earlier run's files.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::eval::EvalResult;
use rollflash_core::IoError;

/// The event files' folder under a run's output directory.
pub const DIR: &str = "tensorboard";

/// What every event file starts with (TensorBoard reads files without it, but TensorFlow's
/// writers always put it first and tools look for it).
const FILE_VERSION: &str = "brain.Event:2";

/// The prefix TensorBoard recognises event files by.
const FILE_PREFIX: &str = "events.out.tfevents.";

/// One open event file.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    file: std::fs::File,
}

impl EventWriter {
    /// Creates `dir` if needed and a new event file in it, named after the current second
    /// and this host. The name's second is moved past every event file already there, so
    /// TensorBoard (which reads a folder's files in name order) reads a resumed run's file
    /// after the files it continues, even when both were opened within one second.
    pub fn create(dir: &Path) -> Result<Self, IoError> {
        std::fs::create_dir_all(dir).map_err(IoError::at("cannot create", dir))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let newest = event_files(dir)?.iter().filter_map(|p| file_secs(p)).max();
        let secs = newest.map_or(now, |n| now.max(n + 1));
        let path = dir.join(format!("{FILE_PREFIX}{secs}.{}", hostname()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(IoError::at("cannot create", &path))?;
        let mut w = EventWriter { path, file };
        let mut first = Vec::new();
        put_f64(&mut first, EVENT_WALL_TIME, unix_now());
        put_bytes(&mut first, EVENT_FILE_VERSION, FILE_VERSION.as_bytes());
        w.write_frames(&[first])?;
        Ok(w)
    }

    /// Writes one event: `values` as scalars at `step`, stamped `wall_time` (Unix seconds),
    /// and flushes it to the OS. Values are stored as f32 (`simple_value`); non-finite ones
    /// are kept (TensorBoard draws NaN and ∞).
    pub fn scalars(
        &mut self,
        step: u64,
        wall_time: f64,
        values: &[(String, f64)],
    ) -> Result<(), IoError> {
        if values.is_empty() {
            return Ok(());
        }
        let mut summary = Vec::new();
        for (tag, v) in values {
            let mut value = Vec::new();
            put_bytes(&mut value, VALUE_TAG, tag.as_bytes());
            // f32 is TensorBoard's scalar type; the narrowing is the format's.
            put_f32(&mut value, VALUE_SIMPLE_VALUE, *v as f32);
            put_bytes(&mut summary, SUMMARY_VALUE, &value);
        }
        let mut event = Vec::new();
        put_f64(&mut event, EVENT_WALL_TIME, wall_time);
        put_varint_field(&mut event, EVENT_STEP, step);
        put_bytes(&mut event, EVENT_SUMMARY, &summary);
        self.write_frames(&[event])
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One write and one flush per call: a reader never sees half an event unless the
    /// process dies inside the write, and then only the last frame is torn.
    fn write_frames(&mut self, events: &[Vec<u8>]) -> Result<(), IoError> {
        let mut buf = Vec::new();
        for e in events {
            frame(&mut buf, e);
        }
        self.file
            .write_all(&buf)
            .and_then(|()| self.file.flush())
            .map_err(IoError::at("cannot write", &self.path))
    }
}

/// The scalars of one `metrics.jsonl` record: every numeric field under its key, every
/// numeric field of a nested map as `map/key` (`staleness_hist/0`,
/// `weight_sync_ms_by_backend/engine-1`), in the record's order. `step` is the event's step,
/// not a scalar; nulls (a backend that failed its update) and non-numbers are left out.
pub fn step_scalars(record: &Value) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let Some(map) = record.as_object() else {
        return out;
    };
    for (k, v) in map {
        if k == "step" {
            continue;
        }
        match v {
            Value::Number(n) => out.extend(n.as_f64().map(|x| (k.clone(), x))),
            Value::Object(inner) => {
                for (k2, v2) in inner {
                    if let Some(x) = v2.as_f64() {
                        out.push((format!("{k}/{k2}"), x));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The scalars of a held-out evaluation, under `eval/`: greedy success rate and mean
/// reward, the math task's format-free accuracy and sampled pass@1 when measured.
pub fn eval_scalars(e: &EvalResult) -> Vec<(String, f64)> {
    let mut out = vec![
        ("eval/greedy_success".to_string(), e.success_rate),
        ("eval/greedy_mean_reward".to_string(), e.mean_reward),
    ];
    if let Some(f) = e.format_free {
        out.push(("eval/format_free".into(), f));
    }
    if let Some(s) = e.sampled {
        out.push(("eval/sampled_pass1".into(), s.success_rate));
        out.push(("eval/sampled_mean_reward".into(), s.mean_reward));
    }
    out
}

/// The current time as TensorBoard's `wall_time`: Unix seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Removes every event file in `dir` (a fresh run in a used output directory: its steps
/// would mix with the earlier run's); returns how many. A missing `dir` has none.
pub fn remove_all(dir: &Path) -> Result<usize, IoError> {
    let files = event_files(dir)?;
    for p in &files {
        std::fs::remove_file(p).map_err(IoError::at("cannot remove", p))?;
    }
    Ok(files.len())
}

/// Cuts every event file in `dir` back to its events before step `from` (a resume from a
/// checkpoint taken after `from` steps: the later steps are trained again and written to
/// the new file). A torn last frame (a killed run) is cut too. Returns how many summary
/// events were dropped. Files are cut with `set_len` at a frame boundary, so a crash
/// during the cut leaves each file either whole or cut.
pub fn drop_steps_from(dir: &Path, from: u64) -> Result<usize, IoError> {
    let mut dropped = 0;
    for p in event_files(dir)? {
        let bytes = std::fs::read(&p).map_err(IoError::at("cannot read", &p))?;
        let mut keep = 0;
        let mut cut = false;
        for f in Frames::new(&bytes) {
            match f {
                Some((end, event)) => match summary_step(event) {
                    Some(step) if step >= from => {
                        cut = true;
                        dropped += 1;
                    }
                    _ if !cut => keep = end,
                    // Events are written in step order; anything after the first dropped
                    // one is dropped with it.
                    _ => dropped += 1,
                },
                None => break,
            }
        }
        if keep < bytes.len() {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .map_err(IoError::at("cannot open", &p))?;
            f.set_len(keep as u64)
                .map_err(IoError::at("cannot truncate", &p))?;
        }
    }
    Ok(dropped)
}

/// The event files in `dir`, in name order; none when `dir` does not exist.
fn event_files(dir: &Path) -> Result<Vec<PathBuf>, IoError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(IoError::at("cannot list", dir)(e)),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(IoError::at("cannot list", dir))?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(FILE_PREFIX))
        {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// The `<secs>` of `events.out.tfevents.<secs>.<host>`.
fn file_secs(p: &Path) -> Option<u64> {
    let name = p.file_name()?.to_str()?.strip_prefix(FILE_PREFIX)?;
    name.split('.').next()?.parse().ok()
}

/// This machine's name for the file name (Linux's, else `$HOSTNAME`, else `localhost`),
/// with anything but letters, digits, `-` and `_` replaced, so the name stays one path
/// component with the seconds as its first dot-separated field.
fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

// Field numbers (event.proto: `Event`; summary.proto: `Summary`, `Summary.Value`).
/// `double wall_time = 1;`
const EVENT_WALL_TIME: u32 = 1;
/// `int64 step = 2;`
const EVENT_STEP: u32 = 2;
/// `string file_version = 3;` (of the `what` oneof)
const EVENT_FILE_VERSION: u32 = 3;
/// `Summary summary = 5;` (of the `what` oneof)
const EVENT_SUMMARY: u32 = 5;
/// `repeated Value value = 1;`
const SUMMARY_VALUE: u32 = 1;
/// `string tag = 1;`
const VALUE_TAG: u32 = 1;
/// `float simple_value = 2;` (of the `value` oneof)
const VALUE_SIMPLE_VALUE: u32 = 2;

// Protobuf wire types.
const WIRE_VARINT: u32 = 0;
const WIRE_FIXED64: u32 = 1;
const WIRE_LEN: u32 = 2;
const WIRE_FIXED32: u32 = 5;

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn put_key(buf: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(buf, u64::from((field << 3) | wire));
}

fn put_varint_field(buf: &mut Vec<u8>, field: u32, v: u64) {
    put_key(buf, field, WIRE_VARINT);
    put_varint(buf, v);
}

fn put_f64(buf: &mut Vec<u8>, field: u32, v: f64) {
    put_key(buf, field, WIRE_FIXED64);
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_f32(buf: &mut Vec<u8>, field: u32, v: f32) {
    put_key(buf, field, WIRE_FIXED32);
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
    put_key(buf, field, WIRE_LEN);
    put_varint(buf, b.len() as u64);
    buf.extend_from_slice(b);
}

/// TFRecord's CRC: CRC32C, rotated right by 15 and offset, because a CRC over data that
/// embeds CRCs is weak (TensorFlow's `crc32c::Mask`).
fn masked_crc(b: &[u8]) -> u32 {
    let c = crc32c::crc32c(b);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends one TFRecord frame holding `data`.
fn frame(buf: &mut Vec<u8>, data: &[u8]) {
    let len = (data.len() as u64).to_le_bytes();
    buf.extend_from_slice(&len);
    buf.extend_from_slice(&masked_crc(&len).to_le_bytes());
    buf.extend_from_slice(data);
    buf.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// The frames of an event file: `Some((end offset, event bytes))` per intact frame, then
/// `None` at the first torn or corrupt one (where a cut-back file ends).
struct Frames<'a> {
    bytes: &'a [u8],
    at: usize,
    done: bool,
}

impl<'a> Frames<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Frames {
            bytes,
            at: 0,
            done: false,
        }
    }

    fn next_frame(&self) -> Option<(usize, &'a [u8])> {
        let b = self.bytes.get(self.at..)?;
        let len_bytes = b.get(..8)?;
        let len_crc = u32::from_le_bytes(b.get(8..12)?.try_into().ok()?);
        if masked_crc(len_bytes) != len_crc {
            return None;
        }
        let len = usize::try_from(u64::from_le_bytes(len_bytes.try_into().ok()?)).ok()?;
        let data = b.get(12..12usize.checked_add(len)?)?;
        let data_crc = u32::from_le_bytes(b.get(12 + len..16 + len)?.try_into().ok()?);
        (masked_crc(data) == data_crc).then_some((self.at + 16 + len, data))
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Option<(usize, &'a [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.at >= self.bytes.len() {
            return None;
        }
        let f = self.next_frame();
        match f {
            Some((end, _)) => self.at = end,
            None => self.done = true,
        }
        Some(f)
    }
}

fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// The step of an event that carries a summary; `None` for other events (the file
/// version) and for bytes that do not parse.
fn summary_step(event: &[u8]) -> Option<u64> {
    let mut at = 0;
    let mut step = 0;
    let mut summary = false;
    while at < event.len() {
        let key = get_varint(event, &mut at)?;
        let (field, wire) = (key >> 3, (key & 7) as u32);
        match wire {
            WIRE_VARINT => {
                let v = get_varint(event, &mut at)?;
                if field == u64::from(EVENT_STEP) {
                    step = v;
                }
            }
            WIRE_FIXED64 => at += 8,
            WIRE_FIXED32 => at += 4,
            WIRE_LEN => {
                let len = usize::try_from(get_varint(event, &mut at)?).ok()?;
                summary |= field == u64::from(EVENT_SUMMARY);
                at = at.checked_add(len)?;
            }
            _ => return None,
        }
    }
    (at == event.len() && summary).then_some(step)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    #[test]
    // TensorFlow's formula as it writes it, to check the rotation against.
    #[allow(clippy::manual_rotate)]
    fn the_masked_crc_is_tensorflows() {
        // CRC32C's check value (RFC 3720 §B.4: "123456789" → 0xE3069283), then TensorFlow's
        // mask of it: ((c >> 15) | (c << 17)) + 0xa282ead8.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        let c: u32 = 0xE306_9283;
        assert_eq!(
            masked_crc(b"123456789"),
            ((c >> 15) | (c << 17)).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn a_scalar_event_encodes_field_by_field() {
        let mut w = Vec::new();
        put_f64(&mut w, EVENT_WALL_TIME, 1.5);
        put_varint_field(&mut w, EVENT_STEP, 300);
        let mut value = Vec::new();
        put_bytes(&mut value, VALUE_TAG, b"r");
        put_f32(&mut value, VALUE_SIMPLE_VALUE, 0.5);
        let mut summary = Vec::new();
        put_bytes(&mut summary, SUMMARY_VALUE, &value);
        put_bytes(&mut w, EVENT_SUMMARY, &summary);
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 0xac, 0x02]); // step 300 as a varint
                                                     // summary (10 bytes) { value (8 bytes) { tag "r", simple_value 0.5 } }
        want.extend_from_slice(&[0x2a, 10, 0x0a, 8, 0x0a, 1, b'r', 0x15]);
        want.extend_from_slice(&0.5f32.to_le_bytes());
        assert_eq!(w, want);
        assert_eq!(summary_step(&w), Some(300));
    }

    #[test]
    fn records_flatten_to_scalars_without_step_or_nulls() {
        let r = json!({
            "step": 3, "reward": 0.25, "note": "x",
            "staleness_hist": {"0": 6, "1": 2},
            "weight_sync_ms_by_backend": {"engine-0": 1.5, "engine-1": null},
        });
        let s = step_scalars(&r);
        let tags: Vec<&str> = s.iter().map(|(t, _)| t.as_str()).collect();
        assert!(tags.contains(&"reward"));
        assert!(tags.contains(&"staleness_hist/1"));
        assert!(tags.contains(&"weight_sync_ms_by_backend/engine-0"));
        assert!(!tags.contains(&"step"));
        assert!(!tags.contains(&"weight_sync_ms_by_backend/engine-1"));
        assert!(!tags.contains(&"note"));
    }

    fn steps_in(dir: &Path) -> Vec<u64> {
        let mut out = Vec::new();
        for p in event_files(dir).unwrap() {
            let b = std::fs::read(&p).unwrap();
            for f in Frames::new(&b) {
                out.extend(summary_step(f.unwrap().1));
            }
        }
        out
    }

    #[test]
    fn a_resume_cuts_older_files_back_and_its_file_sorts_after_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(DIR);
        let mut w = EventWriter::create(&dir).unwrap();
        for step in 0..5 {
            w.scalars(step, 10.0 + step as f64, &[("reward".into(), 0.1)])
                .unwrap();
        }
        let first = w.path().to_path_buf();
        drop(w);
        // A kill tore the last frame.
        let mut b = std::fs::read(&first).unwrap();
        b.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&first, &b).unwrap();

        assert_eq!(drop_steps_from(&dir, 3).unwrap(), 2);
        assert_eq!(steps_in(&dir), vec![0, 1, 2]);
        let mut w = EventWriter::create(&dir).unwrap();
        assert!(w.path() > first.as_path(), "{:?}", w.path());
        for step in 3..6 {
            w.scalars(step, 20.0, &[("reward".into(), 0.2)]).unwrap();
        }
        assert_eq!(steps_in(&dir), vec![0, 1, 2, 3, 4, 5]);
        // Both files still start with the file version event.
        for p in event_files(&dir).unwrap() {
            let b = std::fs::read(&p).unwrap();
            let (_, e) = Frames::new(&b).next().unwrap().unwrap();
            assert!(e.windows(13).any(|w| w == FILE_VERSION.as_bytes()));
        }
        assert_eq!(remove_all(&dir).unwrap(), 2);
        assert!(steps_in(&dir).is_empty());
    }
}
