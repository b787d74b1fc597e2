//! Tests of dotted field paths on verl's GSM8K layout: the same rows as Parquet and as JSONL
//! load to the same records and task rows, and bad paths name the file, the row and the path.
//!
//! The layout is the one verl's `examples/data_preprocess/gsm8k.py` writes (columns
//! `data_source`, `prompt` as a list of `{role, content}`, `ability`, `reward_model` as
//! `{style, ground_truth}`, `extra_info` as `{split, index, answer, question}`; `index` is an
//! int64, the rest strings). The rows are made up here in GSM8K's style.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields};
use parquet::arrow::ArrowWriter;
use rollflash_env::dataset::{load, DatasetConfig, DatasetError, FieldPath, FieldPathError};
use rollflash_env::envs::{DatasetEnv, DatasetTaskConfig, EnvConfig, EnvSpec};
use rollflash_env::Env;
use serde_json::{json, Value};

/// One verl GSM8K row; `ground_truth: None` makes `reward_model` null.
pub(crate) struct Row {
    question: &'static str,
    solution: &'static str,
    ground_truth: Option<&'static str>,
}

const INSTRUCTION: &str = "Give the final answer after \"####\".";

pub(crate) fn rows() -> Vec<Row> {
    vec![
        Row {
            question: "Tom packs 3 boxes of 4 apples. How many apples does he pack?",
            solution: "3 boxes of 4 is 3*4=<<3*4=12>>12 apples.\n#### 12",
            ground_truth: Some("12"),
        },
        Row {
            question: "A pen costs $2 and a book $5. What do 2 pens and a book cost?",
            solution: "2 pens cost 2*2=<<2*2=4>>4, with the book 4+5=<<4+5=9>>9.\n#### 9",
            ground_truth: Some("9"),
        },
        Row {
            question: "Ann reads 25 pages a day. How many pages does she read in 8 days?",
            solution: "25*8=<<25*8=200>>200\n#### 200",
            ground_truth: Some("200"),
        },
    ]
}

pub(crate) fn jsonl(dir: &tempfile::TempDir, name: &str, rows: &[Row]) -> PathBuf {
    let text: String = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let reward_model = match r.ground_truth {
                Some(g) => json!({"style": "rule", "ground_truth": g}),
                None => Value::Null,
            };
            format!(
                "{}\n",
                json!({
                    "data_source": "openai/gsm8k",
                    "prompt": [{"role": "user", "content": format!("{} {INSTRUCTION}", r.question)}],
                    "ability": "math",
                    "reward_model": reward_model,
                    "extra_info": {"split": "train", "index": i, "answer": r.solution,
                                   "question": r.question},
                })
            )
        })
        .collect();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn strings(fields: &[&str]) -> Fields {
    fields
        .iter()
        .map(|f| Field::new(*f, DataType::Utf8, true))
        .collect()
}

/// The rows in verl's Parquet schema, written with the `parquet` crate's Arrow writer.
pub(crate) fn parquet(dir: &tempfile::TempDir, name: &str, rows: &[Row]) -> PathBuf {
    let mut prompt = ListBuilder::new(StructBuilder::from_fields(strings(&["role", "content"]), 0));
    let mut reward_model = StructBuilder::from_fields(strings(&["style", "ground_truth"]), 0);
    let extra_fields: Fields = vec![
        Field::new("split", DataType::Utf8, true),
        Field::new("index", DataType::Int64, true),
        Field::new("answer", DataType::Utf8, true),
        Field::new("question", DataType::Utf8, true),
    ]
    .into();
    let mut extra_info = StructBuilder::from_fields(extra_fields, 0);
    fn text(b: &mut StructBuilder, i: usize, v: Option<&str>) {
        b.field_builder::<StringBuilder>(i)
            .unwrap()
            .append_option(v);
    }
    for (i, r) in rows.iter().enumerate() {
        let message = prompt.values();
        text(message, 0, Some("user"));
        text(message, 1, Some(&format!("{} {INSTRUCTION}", r.question)));
        message.append(true);
        prompt.append(true);
        text(&mut reward_model, 0, r.ground_truth.map(|_| "rule"));
        text(&mut reward_model, 1, r.ground_truth);
        reward_model.append(r.ground_truth.is_some());
        text(&mut extra_info, 0, Some("train"));
        extra_info
            .field_builder::<Int64Builder>(1)
            .unwrap()
            .append_value(i as i64);
        text(&mut extra_info, 2, Some(r.solution));
        text(&mut extra_info, 3, Some(r.question));
        extra_info.append(true);
    }
    let n = rows.len();
    let batch = RecordBatch::try_from_iter(vec![
        (
            "data_source",
            Arc::new(StringArray::from(vec!["openai/gsm8k"; n])) as ArrayRef,
        ),
        ("prompt", Arc::new(prompt.finish())),
        ("ability", Arc::new(StringArray::from(vec!["math"; n]))),
        ("reward_model", Arc::new(reward_model.finish())),
        ("extra_info", Arc::new(extra_info.finish())),
    ])
    .unwrap();
    let path = dir.path().join(name);
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path
}

fn path(p: &str) -> FieldPath {
    p.parse().unwrap()
}

fn verl_config(file: PathBuf) -> DatasetConfig {
    DatasetConfig {
        prompt_field: path("prompt"),
        prompt_messages: true,
        answer_field: path("reward_model.ground_truth"),
        ..DatasetConfig::new(file)
    }
}

/// The dataset task over `file` as a verl user configures it.
pub(crate) fn verl_task(file: &std::path::Path, extra: Value) -> DatasetTaskConfig {
    let mut spec = json!({
        "name": "dataset",
        "files": [{"path": file}],
        "messages": "prompt",
        "answer": "reward_model.ground_truth",
        "id": "extra_info.index",
    });
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let spec: EnvSpec = serde_json::from_value(spec).unwrap();
    let EnvConfig::Dataset(c) = spec.env else {
        panic!("dataset")
    };
    *c
}

#[test]
fn verl_parquet_and_the_same_jsonl_load_to_equal_records() {
    let dir = tempfile::tempdir().unwrap();
    let pq = load(&verl_config(parquet(&dir, "train.parquet", &rows()))).unwrap();
    let jl = load(&verl_config(jsonl(&dir, "train.jsonl", &rows()))).unwrap();
    assert_eq!(pq.records(), jl.records());
    let r = &pq.records()[1];
    assert_eq!(r.answer, "9");
    assert_eq!(
        r.prompt,
        format!("{} {INSTRUCTION}", rows()[1].question),
        "the conversation's plain rendering"
    );
    // The whole row is kept, structs as objects; a nested answer stays in its struct.
    assert_eq!(
        r.extra["reward_model"],
        json!({"style": "rule", "ground_truth": "9"})
    );
    assert_eq!(r.extra["extra_info"]["index"], json!(1));
    assert_eq!(r.extra["extra_info"]["split"], json!("train"));
    assert_eq!(r.extra["data_source"], json!("openai/gsm8k"));
    assert_eq!(r.extra["prompt"][0]["role"], json!("user"));
}

/// The same rows written by pyarrow — what verl's preprocessing writes with (`datasets` →
/// `to_parquet`), its types inferred from the Python rows as there — load to the records our
/// own writer's file gives: the reader follows the file's schema, not our writer's. Skipped,
/// saying why, where a venv with pyarrow cannot be made (no python3, no PyPI).
#[test]
fn verl_parquet_written_by_pyarrow_loads_like_ours() {
    let dir = tempfile::tempdir().unwrap();
    let python = match crate::python_reward::venv_with(dir.path(), "pyarrow==21.0.0") {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped: verl_parquet_written_by_pyarrow_loads_like_ours: {why}");
            return;
        }
    };
    let rows_file = jsonl(&dir, "rows.jsonl", &rows());
    let ours = load(&verl_config(parquet(&dir, "ours.parquet", &rows()))).unwrap();
    // pyarrow's default compression (Snappy, which `datasets` keeps), and the others files
    // on the Hub come in.
    for compression in ["snappy", "zstd", "gzip", "lz4", "none"] {
        let out = dir.path().join(format!("pyarrow-{compression}.parquet"));
        let script = "import json, sys\n\
                      import pyarrow as pa, pyarrow.parquet as pq\n\
                      rows = [json.loads(l) for l in open(sys.argv[1])]\n\
                      pq.write_table(pa.Table.from_pylist(rows), sys.argv[2], \
                                     compression=sys.argv[3])\n\
                      print(pq.read_schema(sys.argv[2]))\n";
        let run = std::process::Command::new(&python)
            .arg("-c")
            .arg(script)
            .arg(&rows_file)
            .arg(&out)
            .arg(compression)
            .output()
            .unwrap();
        let schema = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        // What pyarrow made of verl's layout: structs and a list of structs.
        assert!(schema.contains("reward_model: struct<"), "{schema}");
        assert!(schema.contains("prompt: list<"), "{schema}");
        assert!(schema.contains("index: int64"), "{schema}");
        let theirs = load(&verl_config(out))
            .unwrap_or_else(|e| panic!("pyarrow's file, {compression}: {e}"));
        assert_eq!(theirs.records(), ours.records(), "{compression}");
    }
}

#[tokio::test]
async fn the_task_reads_nested_answer_and_id_and_keeps_data_source() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        parquet(&dir, "train.parquet", &rows()),
        jsonl(&dir, "train.jsonl", &rows()),
    ];
    let mut loaded = Vec::new();
    for f in &files {
        let c = verl_task(f, json!({}));
        c.validate().unwrap();
        let mut env = DatasetEnv::new(&c).unwrap();
        let mut rows = env.data().train().to_vec();
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(rows[2].id, "2", "the id is extra_info.index");
        assert_eq!(rows[2].answer, "200");
        assert_eq!(rows[2].data_source.as_deref(), Some("openai/gsm8k"));
        assert_eq!(
            rows[2].fields["extra_info"]["answer"],
            json!(rows_solution(2))
        );
        let reset = env.reset(0).await.unwrap();
        assert_eq!(reset.info["data_source"], json!("openai/gsm8k"));
        let id = reset.info["id"].as_str().unwrap().to_string();
        let truth = rows.iter().find(|r| r.id == id).unwrap().answer.clone();
        let step = env
            .step(&format!("So it is {truth}.\n#### {truth}"))
            .await
            .unwrap();
        assert_eq!(step.reward, 1.0);
        assert_eq!(step.info["data_source"], json!("openai/gsm8k"));
        loaded.push(rows);
    }
    // The same rows from either file, but for where they came from.
    let strip = |rows: &[rollflash_env::envs::dataset_task::TaskRow]| {
        rows.iter()
            .map(|r| {
                (
                    r.prompt.clone(),
                    r.messages.clone(),
                    r.answer.clone(),
                    r.id.clone(),
                    r.data_source.clone(),
                    r.fields.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&loaded[0]), strip(&loaded[1]));

    // A nested string prompt through a template, also by path.
    let c = verl_task(
        &files[0],
        json!({"messages": null, "prompt": "extra_info.question",
               "template": "[{data_source}] {extra_info.question} ({reward_model.style})"}),
    );
    let env = DatasetEnv::new(&c).unwrap();
    let row = env.data().train().iter().find(|r| r.id == "0").unwrap();
    assert_eq!(
        row.prompt,
        format!("[openai/gsm8k] {} (rule)", rows()[0].question)
    );

    // With a template, `prompt` is not read: verl's `prompt` column (a conversation list)
    // does not stop a template that renders from other columns, in either format; a
    // number (`extra_info.index`) renders as its text.
    for f in &files {
        let c = verl_task(
            f,
            json!({"messages": null,
                   "template": "#{extra_info.index} Q: {extra_info.question}\nA: "}),
        );
        let env = DatasetEnv::new(&c).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let row = env.data().train().iter().find(|r| r.id == "1").unwrap();
        assert_eq!(row.prompt, format!("#1 Q: {}\nA: ", rows()[1].question));
        assert_eq!(
            row.fields["prompt"][0]["role"],
            json!("user"),
            "the row is whole"
        );
    }
}

fn rows_solution(i: usize) -> &'static str {
    rows()[i].solution
}

/// Loads `c` expecting an error whose message names each of `parts`.
fn load_err(c: &DatasetConfig, parts: &[&str]) -> DatasetError {
    let err = load(c).unwrap_err();
    let msg = err.to_string();
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not contain {p:?}");
    }
    err
}

#[test]
fn bad_paths_name_file_row_path_and_what_was_found() {
    let dir = tempfile::tempdir().unwrap();
    let mut broken = rows();
    broken[1].ground_truth = None;
    let formats = [
        (
            "train.parquet",
            "row",
            parquet(&dir, "train.parquet", &rows()),
        ),
        ("train.jsonl", "line", jsonl(&dir, "train.jsonl", &rows())),
    ];
    for (name, unit, file) in formats {
        let c = DatasetConfig {
            answer_field: path("reward_model.truth"),
            ..verl_config(file.clone())
        };
        let err = load_err(
            &c,
            &[
                name,
                &format!("{unit} 1"),
                "`reward_model.truth`",
                "`reward_model` has no key `truth`",
                "ground_truth",
            ],
        );
        assert!(matches!(err, DatasetError::BadPath { .. }), "{err}");
        let c = DatasetConfig {
            answer_field: path("extra_info.index.value"),
            ..verl_config(file.clone())
        };
        let err = load_err(
            &c,
            &[
                name,
                &format!("{unit} 1"),
                "`extra_info.index` is a number, not an object",
            ],
        );
        assert!(matches!(err, DatasetError::BadPath { .. }), "{err}");
        // A nested id goes through a string: every row fails, the first is named.
        let c = verl_task(&file, json!({"id": "ability.name"}));
        let msg = rollflash_core::error_chain(&c.validate().unwrap_err());
        for p in [
            name,
            &format!("{unit} 1"),
            "`ability.name`",
            "`ability` is a string, not an object",
        ] {
            assert!(msg.contains(p), "{msg:?} does not contain {p:?}");
        }
    }
    // A null struct fails on its own row, alike in both formats.
    for (name, at, file) in [
        (
            "broken.parquet",
            "row 2",
            parquet(&dir, "broken.parquet", &broken),
        ),
        (
            "broken.jsonl",
            "line 2",
            jsonl(&dir, "broken.jsonl", &broken),
        ),
    ] {
        load_err(
            &verl_config(file),
            &[name, at, "`reward_model` is null, not an object"],
        );
    }
    // Parquet checks the column a path starts in against the schema, once.
    let file = parquet(&dir, "schema.parquet", &rows());
    let c = DatasetConfig {
        answer_field: path("ability.text"),
        ..verl_config(file.clone())
    };
    load_err(
        &c,
        &[
            "schema.parquet",
            "column `ability`",
            "Utf8",
            "a struct column",
        ],
    );
    let c = DatasetConfig {
        answer_field: path("reward.ground_truth"),
        ..verl_config(file)
    };
    load_err(
        &c,
        &["schema.parquet", "no column `reward`", "reward_model"],
    );
    // In JSONL the row itself lacks the first key.
    let c = DatasetConfig {
        answer_field: path("reward.ground_truth"),
        ..verl_config(jsonl(&dir, "first_key.jsonl", &rows()))
    };
    load_err(
        &c,
        &["first_key.jsonl", "line 1", "the row has no key `reward`"],
    );
}

#[test]
fn field_paths_are_checked_when_the_config_is_read() {
    assert_eq!(FieldPath::parse(""), Err(FieldPathError::Empty));
    for (p, position) in [("a..b", 2), (".a", 1), ("a.", 2)] {
        assert_eq!(
            FieldPath::parse(p),
            Err(FieldPathError::EmptyKey {
                path: p.into(),
                position
            })
        );
    }
    let p = path("reward_model.ground_truth");
    assert_eq!(
        p.keys().collect::<Vec<_>>(),
        ["reward_model", "ground_truth"]
    );
    assert_eq!(p.head(), "reward_model");
    assert!(!p.is_top_level() && path("answer").is_top_level());
    // Serialised as written, so a config prints back as the user wrote it.
    assert_eq!(
        serde_json::to_value(&p).unwrap(),
        json!("reward_model.ground_truth")
    );

    let spec = |field: &str, value: &str| {
        serde_json::from_value::<EnvSpec>(json!({
            "name": "dataset", "files": [{"path": "a.jsonl"}], field: value
        }))
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    let msg = spec("answer", "reward_model.");
    assert!(msg.contains("key 2 is empty"), "{msg}");
    let msg = spec("id", "");
    assert!(msg.contains("must not be empty"), "{msg}");
    // A template's field names are paths too, refused before any file is read.
    let mut c = DatasetTaskConfig::new(vec![rollflash_env::envs::DataFile::new("absent.jsonl")]);
    c.template = Some("Q: {extra_info..question}".into());
    let msg = c.validate().unwrap_err().to_string();
    assert!(
        msg.contains("template") && msg.contains("key 2 is empty"),
        "{msg}"
    );
}
