//! Tests of `dataset`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, Float32Array, Float64Array, Int32Array, Int64Array, LargeStringArray,
    RecordBatch, StringArray,
};
use parquet::arrow::ArrowWriter;
use rollflash_env::dataset::{
    load, Dataset, DatasetConfig, DatasetError, DatasetFormat, InMemoryDataset, Record, Sampler,
    SamplerCursor,
};
use serde_json::json;

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn write_parquet(dir: &tempfile::TempDir, name: &str, columns: Vec<(&str, ArrayRef)>) -> PathBuf {
    let path = dir.path().join(name);
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path
}

/// Loads `cfg` expecting an error; checks the message names the file and each of `parts`.
fn load_err(cfg: &DatasetConfig, parts: &[&str]) -> DatasetError {
    let err = load(cfg).unwrap_err();
    let msg = err.to_string();
    let file = cfg.path.file_name().unwrap().to_str().unwrap();
    assert!(msg.contains(file), "{msg:?} does not name the file {file}");
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not contain {p:?}");
    }
    err
}

fn cfg(path: &Path) -> DatasetConfig {
    DatasetConfig::new(path)
}

// ---------------------------------------------------------------- JSONL

#[test]
fn jsonl_loads_records_with_extra_fields() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "train.jsonl",
        "{\"prompt\": \"1+1=\", \"answer\": \"2\", \"level\": 1}\n\
         \n\
         {\"prompt\": \"2+2=\", \"answer\": 4}\r\n\
         {\"prompt\": \"half\", \"answer\": 0.5, \"tags\": [\"x\"]}",
    );
    let ds = load(&cfg(&path)).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(
        ds.get(0).unwrap(),
        Record {
            prompt: "1+1=".into(),
            answer: "2".into(),
            extra: json!({"level": 1}).as_object().unwrap().clone(),
        }
    );
    assert_eq!(ds.get(1).unwrap().answer, "4");
    assert_eq!(ds.get(2).unwrap().answer, "0.5");
    assert_eq!(ds.get(2).unwrap().extra["tags"], json!(["x"]));
    assert!(ds.get(3).is_none());
}

#[test]
fn jsonl_custom_field_names_and_explicit_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "data.txt",
        "{\"question\": \"q\", \"solution\": \"s\", \"prompt\": \"kept\"}\n",
    );
    let c = DatasetConfig {
        prompt_field: "question".parse().unwrap(),
        answer_field: "solution".parse().unwrap(),
        format: Some(DatasetFormat::Jsonl),
        ..cfg(&path)
    };
    let ds = load(&c).unwrap();
    let r = ds.get(0).unwrap();
    assert_eq!((r.prompt.as_str(), r.answer.as_str()), ("q", "s"));
    assert_eq!(r.extra["prompt"], json!("kept"));
    // Without the explicit format, `.txt` says nothing.
    load_err(&cfg(&path), &["format"]);
}

#[test]
fn jsonl_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let ok = "{\"prompt\": \"p\", \"answer\": \"a\"}\n";
    let cases: [(&str, String, &[&str]); 6] = [
        (
            "bad_json.jsonl",
            format!("{ok}{{\"prompt\": \"p\", \"answer\": }}\n"),
            &["line 2", "invalid JSON"],
        ),
        (
            "missing.jsonl",
            format!("{ok}{ok}{{\"prompt\": \"p\"}}\n"),
            &["line 3", "missing field `answer`"],
        ),
        (
            "wrong_prompt.jsonl",
            "{\"prompt\": 5, \"answer\": \"a\"}\n".to_string(),
            &["line 1", "`prompt`", "a number", "expected a string"],
        ),
        (
            "null_answer.jsonl",
            format!("{ok}\n{{\"prompt\": \"p\", \"answer\": null}}\n"),
            &["line 3", "`answer`", "null"],
        ),
        (
            "array.jsonl",
            format!("{ok}[1, 2]\n"),
            &["line 2", "expected a JSON object"],
        ),
        (
            "too_big.jsonl",
            format!(
                "{ok}{{\"prompt\": \"{}\", \"answer\": \"a\"}}\n{ok}",
                "x".repeat(200)
            ),
            &["line 2", "100-byte limit"],
        ),
    ];
    for (name, text, parts) in cases {
        let path = write(&dir, name, &text);
        let c = DatasetConfig {
            max_row_bytes: 100,
            ..cfg(&path)
        };
        load_err(&c, parts);
    }
}

#[test]
fn row_cap_is_exact_and_bounds_reading() {
    let dir = tempfile::tempdir().unwrap();
    let line = "{\"prompt\": \"p\", \"answer\": \"a\"}";
    let path = write(&dir, "exact.jsonl", &format!("{line}\n{line}"));
    let at_cap = DatasetConfig {
        max_row_bytes: line.len(),
        ..cfg(&path)
    };
    assert_eq!(load(&at_cap).unwrap().len(), 2);
    let below = DatasetConfig {
        max_row_bytes: line.len() - 1,
        ..cfg(&path)
    };
    load_err(&below, &["line 1"]);
    // A single 64 MiB line with no newline is refused after reading just past the cap.
    let huge = dir.path().join("huge.jsonl");
    std::fs::write(&huge, vec![b'x'; 64 << 20]).unwrap();
    load_err(&cfg(&huge), &["line 1", "max_row_bytes"]);
}

#[test]
fn io_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_err(&cfg(&dir.path().join("absent.jsonl")), &[]);
    assert!(matches!(err, DatasetError::Io(_)));
    let err = load_err(&cfg(&dir.path().join("absent.parquet")), &[]);
    assert!(matches!(err, DatasetError::Io(_)));
}

#[test]
fn config_serde_defaults_and_validation() {
    let c: DatasetConfig = serde_json::from_str(r#"{"path": "d/train.parquet"}"#).unwrap();
    assert_eq!(c, DatasetConfig::new("d/train.parquet"));
    assert_eq!(c.resolved_format().unwrap(), DatasetFormat::Parquet);
    let c: DatasetConfig =
        serde_json::from_str(r#"{"path": "x.data", "format": "jsonl", "prompt_field": "q"}"#)
            .unwrap();
    assert_eq!(c.resolved_format().unwrap(), DatasetFormat::Jsonl);
    assert_eq!(c.prompt_field, "q");
    assert!(serde_json::from_str::<DatasetConfig>(r#"{"path": "a", "colour": 1}"#).is_err());
    let same = DatasetConfig {
        answer_field: "prompt".parse().unwrap(),
        ..DatasetConfig::new("a.jsonl")
    };
    assert!(load(&same)
        .unwrap_err()
        .to_string()
        .contains("answer_field"));
    let zero = DatasetConfig {
        max_row_bytes: 0,
        ..DatasetConfig::new("a.jsonl")
    };
    assert!(load(&zero)
        .unwrap_err()
        .to_string()
        .contains("max_row_bytes"));
}

// ---------------------------------------------------------------- Parquet

#[test]
fn parquet_loads_strings_and_numeric_answers() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_parquet(
        &dir,
        "ints.parquet",
        vec![
            (
                "prompt",
                Arc::new(StringArray::from(vec!["1+1=", "20*2+2="])) as ArrayRef,
            ),
            ("answer", Arc::new(Int64Array::from(vec![2, 42]))),
            ("level", Arc::new(Int32Array::from(vec![1, 3]))),
            ("score", Arc::new(Float32Array::from(vec![0.1f32, 0.5]))),
            (
                "blob",
                Arc::new(BinaryArray::from(vec![Some(b"x".as_ref()), None])),
            ),
        ],
    );
    let ds = load(&cfg(&path)).unwrap();
    assert_eq!(ds.len(), 2);
    let r = ds.get(1).unwrap();
    assert_eq!((r.prompt.as_str(), r.answer.as_str()), ("20*2+2=", "42"));
    assert_eq!(r.extra["level"], json!(3));
    assert_eq!(ds.get(0).unwrap().extra["score"], json!(0.1));
    // Columns of other types are skipped whole, null or not.
    assert!(ds.records().iter().all(|r| !r.extra.contains_key("blob")));

    // Lists of scalars become JSON arrays (nulls inside and a null row kept as null).
    let mut tags =
        arrow_array::builder::ListBuilder::new(arrow_array::builder::StringBuilder::new());
    tags.values().append_value("easy");
    tags.values().append_null();
    tags.append(true);
    tags.append(false);
    let path = write_parquet(
        &dir,
        "lists.parquet",
        vec![
            (
                "prompt",
                Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef,
            ),
            ("answer", Arc::new(StringArray::from(vec!["1", "2"]))),
            ("tags", Arc::new(tags.finish())),
        ],
    );
    let ds = load(&cfg(&path)).unwrap();
    assert_eq!(ds.get(0).unwrap().extra["tags"], json!(["easy", null]));
    assert_eq!(ds.get(1).unwrap().extra["tags"], json!(null));

    let path = write_parquet(
        &dir,
        "large.parquet",
        vec![
            (
                "question",
                Arc::new(LargeStringArray::from(vec!["a", "b"])) as ArrayRef,
            ),
            ("value", Arc::new(Float64Array::from(vec![0.5, 3.0]))),
            ("answer", Arc::new(StringArray::from(vec!["x", "y"]))),
        ],
    );
    let c = DatasetConfig {
        prompt_field: "question".parse().unwrap(),
        answer_field: "value".parse().unwrap(),
        ..cfg(&path)
    };
    let ds = load(&c).unwrap();
    let answers: Vec<String> = ds.records().iter().map(|r| r.answer.clone()).collect();
    assert_eq!(answers, ["0.5", "3"]);
    assert_eq!(ds.get(1).unwrap().extra["answer"], json!("y"));
}

#[test]
fn parquet_errors_name_file_and_row_or_column() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = |v: Vec<Option<&str>>| Arc::new(StringArray::from(v)) as ArrayRef;
    let answers = || Arc::new(StringArray::from(vec!["a", "b", "c"])) as ArrayRef;

    let path = write_parquet(
        &dir,
        "null_prompt.parquet",
        vec![
            ("prompt", prompts(vec![Some("p"), None, Some("q")])),
            ("answer", answers()),
        ],
    );
    load_err(&cfg(&path), &["row 2", "`prompt`", "null"]);

    let path = write_parquet(
        &dir,
        "no_answer.parquet",
        vec![("prompt", prompts(vec![Some("p"), Some("q"), Some("r")]))],
    );
    load_err(&cfg(&path), &["no column `answer`", "prompt"]);

    let path = write_parquet(
        &dir,
        "int_prompt.parquet",
        vec![
            (
                "prompt",
                Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef,
            ),
            ("answer", answers()),
        ],
    );
    load_err(&cfg(&path), &["column `prompt`", "Int64", "string"]);

    let big = "x".repeat(300);
    let path = write_parquet(
        &dir,
        "big_row.parquet",
        vec![
            ("prompt", prompts(vec![Some("p"), Some("q"), Some(&big)])),
            ("answer", answers()),
        ],
    );
    let c = DatasetConfig {
        max_row_bytes: 100,
        ..cfg(&path)
    };
    load_err(&c, &["row 3", "100-byte limit"]);

    let path = write(&dir, "corrupt.parquet", "this is not parquet at all");
    let err = load_err(&cfg(&path), &[]);
    assert!(matches!(err, DatasetError::Parquet { .. }), "{err}");
}

// ---------------------------------------------------------------- Sampler

#[test]
fn sampler_epochs_are_seeded_permutations() {
    let len = 50;
    let a: Vec<usize> = Sampler::new(len, 7).take(3 * len).collect();
    let b: Vec<usize> = Sampler::new(len, 7).take(3 * len).collect();
    assert_eq!(a, b, "same seed, same order");
    let epochs: Vec<&[usize]> = a.chunks(len).collect();
    for e in &epochs {
        let set: HashSet<usize> = e.iter().copied().collect();
        assert_eq!(set.len(), len, "each epoch is a permutation");
        assert!(set.iter().all(|i| *i < len));
    }
    assert_ne!(epochs[0], epochs[1], "epochs are shuffled differently");
    assert_ne!(epochs[0], (0..len).collect::<Vec<_>>().as_slice());
    let other: Vec<usize> = Sampler::new(len, 8).take(len).collect();
    assert_ne!(other.as_slice(), epochs[0], "seeds differ");
    assert_eq!(Sampler::permutation(len, 7, 2), epochs[2]);
    // Pinned so a change of shuffling algorithm (which would silently change every
    // resumed run) is noticed.
    assert_eq!(Sampler::permutation(8, 0, 0), [3, 2, 0, 4, 1, 5, 6, 7]);
}

#[test]
fn sampler_resumes_from_its_cursor() {
    let len = 13;
    let mut a = Sampler::new(len, 3);
    let _: Vec<usize> = a.by_ref().take(37).collect();
    let cursor = a.cursor();
    assert_eq!(
        cursor,
        SamplerCursor {
            epoch: 2,
            offset: 11
        }
    );
    let json = serde_json::to_string(&cursor).unwrap();
    let restored: SamplerCursor = serde_json::from_str(&json).unwrap();
    let b = Sampler::resume(len, 3, restored).unwrap();
    let rest_a: Vec<usize> = a.take(60).collect();
    let rest_b: Vec<usize> = b.take(60).collect();
    assert_eq!(rest_a, rest_b);
    // The end of an epoch resumes into the next one.
    let end = Sampler::resume(
        len,
        3,
        SamplerCursor {
            epoch: 0,
            offset: len,
        },
    )
    .unwrap();
    let next = Sampler::resume(
        len,
        3,
        SamplerCursor {
            epoch: 1,
            offset: 0,
        },
    )
    .unwrap();
    assert_eq!(
        end.take(len).collect::<Vec<_>>(),
        next.take(len).collect::<Vec<_>>()
    );
    assert!(Sampler::resume(
        len,
        3,
        SamplerCursor {
            epoch: 0,
            offset: len + 1
        }
    )
    .is_err());
    assert_eq!(Sampler::new(0, 1).next(), None);
}

#[test]
fn in_memory_dataset_through_the_trait() {
    let ds: Box<dyn Dataset> = Box::new(InMemoryDataset::new(vec![Record {
        prompt: "p".into(),
        answer: "a".into(),
        extra: Default::default(),
    }]));
    assert_eq!(ds.len(), 1);
    assert!(!ds.is_empty());
    assert_eq!(ds.get(0).unwrap().answer, "a");
}
