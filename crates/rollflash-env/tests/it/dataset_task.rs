//! Tests of the dataset task (`envs::dataset_task`): rows for seeds, splits, templates, rewards,
//! and the bad-data errors at config load.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use rollflash_env::envs::dataset_task::{render_template, AnswerRule, HELD_OUT_SEED_BASE};
use rollflash_env::envs::{make_env, DataFile, DatasetEnv, DatasetTaskConfig, EnvConfig, EnvSpec};
use rollflash_env::Env;
use serde_json::json;

/// `n` arithmetic rows `{"id", "question", "answer"}` (answers GSM8K-style, `… #### c`),
/// ids starting at `first`.
fn arith_rows(n: usize, first: usize) -> String {
    (0..n)
        .map(|i| {
            let (a, b) = (first + i, 3 * i + 1);
            format!(
                "{}\n",
                json!({"id": format!("r{}", first + i), "question": format!("{a}+{b}"),
                       "answer": format!("{a}+{b}={} #### {}", a + b, a + b)})
            )
        })
        .collect()
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn task(files: Vec<DataFile>) -> DatasetTaskConfig {
    let mut c = DatasetTaskConfig::new(files);
    c.prompt = "question".parse().unwrap();
    c.id = Some("id".parse().unwrap());
    c
}

/// The id of the row `seed` poses.
async fn id_of(env: &mut DatasetEnv, seed: u64) -> String {
    let r = env.reset(seed).await.unwrap();
    r.info["id"].as_str().unwrap().to_string()
}

/// The config's error message, checking it names each of `parts`.
fn config_err(c: &DatasetTaskConfig, parts: &[&str]) -> String {
    let msg = rollflash_core::error_chain(&c.validate().unwrap_err());
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not contain {p:?}");
    }
    msg
}

#[tokio::test]
async fn consecutive_seeds_walk_a_fresh_permutation_per_epoch_from_the_origin() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = task(vec![DataFile::new(write(
        &dir,
        "t.jsonl",
        &arith_rows(25, 0),
    ))]);
    c.seed_origin = 1_000_003 * 7; // what `rollflash train --set seed=7` sets
    let mut env = DatasetEnv::new(&c).unwrap();
    assert_eq!(env.data().epoch_len(), 25);
    let mut epochs = Vec::new();
    for e in 0..3u64 {
        let mut ids = Vec::new();
        for k in 0..25 {
            ids.push(id_of(&mut env, c.seed_origin + 25 * e + k).await);
        }
        let distinct: HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), 25, "epoch {e} repeats a row: {ids:?}");
        epochs.push(ids);
    }
    assert_ne!(epochs[0], epochs[1], "each epoch is a fresh shuffle");
    assert_ne!(epochs[1], epochs[2]);
    // A pure function of the seed: a fresh environment (a resumed run) poses the same row.
    let mut again = DatasetEnv::new(&c).unwrap();
    assert_eq!(id_of(&mut again, c.seed_origin + 30).await, epochs[1][5]);
    // Another shuffle seed, another order.
    let mut c2 = c.clone();
    c2.shuffle_seed = 1;
    let mut other = DatasetEnv::new(&c2).unwrap();
    let mut ids = Vec::new();
    for k in 0..25 {
        ids.push(id_of(&mut other, c.seed_origin + k).await);
    }
    assert_ne!(ids, epochs[0]);
}

#[tokio::test]
async fn eval_seeds_pose_held_out_rows_only_in_file_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = task(vec![DataFile::new(write(
        &dir,
        "t.jsonl",
        &arith_rows(20, 0),
    ))]);
    c.heldout = vec![DataFile::new(write(&dir, "h.jsonl", &arith_rows(5, 100)))];
    let mut env = DatasetEnv::new(&c).unwrap();
    for i in 0..12u64 {
        let r = env.reset(HELD_OUT_SEED_BASE + i).await.unwrap();
        assert_eq!(r.info["id"], json!(format!("r{}", 100 + i % 5)));
        assert_eq!(r.info["split"], json!("heldout"));
    }
    for s in 0..60u64 {
        let r = env.reset(s).await.unwrap();
        let id: usize = r.info["id"].as_str().unwrap()[1..].parse().unwrap();
        assert!(id < 20, "training seed {s} posed held-out row {id}");
        assert_eq!(r.info["split"], json!("train"));
    }
    // Without a held-out split an eval seed is an error that says what to set.
    let mut bare = DatasetEnv::new(&task(c.files.clone())).unwrap();
    let e = bare
        .reset(HELD_OUT_SEED_BASE)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("heldout_fraction"), "{e}");
}

#[tokio::test]
async fn a_held_out_fraction_is_seeded_and_never_trained_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = task(vec![DataFile::new(write(
        &dir,
        "t.jsonl",
        &arith_rows(40, 0),
    ))]);
    c.heldout_fraction = 0.25;
    let mut env = DatasetEnv::new(&c).unwrap();
    assert_eq!(env.data().heldout().len(), 10);
    assert_eq!(env.data().train().len(), 30);
    let held: HashSet<String> = env.data().heldout().iter().map(|r| r.id.clone()).collect();
    let mut trained = HashSet::new();
    for s in 0..300u64 {
        trained.insert(id_of(&mut env, s).await);
    }
    assert_eq!(trained.len(), 30, "every training row comes up");
    assert!(trained.is_disjoint(&held), "a held-out row was trained on");
    for i in 0..10 {
        assert!(held.contains(&id_of(&mut env, HELD_OUT_SEED_BASE + i).await));
    }
    // The split follows `shuffle_seed`.
    let mut c2 = c.clone();
    c2.shuffle_seed = 5;
    let env2 = DatasetEnv::new(&c2).unwrap();
    let held2: HashSet<String> = env2.data().heldout().iter().map(|r| r.id.clone()).collect();
    assert_ne!(held, held2);
}

#[tokio::test]
async fn mixture_weights_set_each_files_share_of_an_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(&dir, "a.jsonl", &arith_rows(10, 0));
    let b = write(&dir, "b.jsonl", &arith_rows(10, 500));
    let mut c = task(vec![
        DataFile {
            weight: 2.0,
            ..DataFile::new(a)
        },
        DataFile {
            weight: 0.5,
            ..DataFile::new(b)
        },
    ]);
    c.shuffle_seed = 3;
    let mut env = DatasetEnv::new(&c).unwrap();
    assert_eq!(env.data().epoch_len(), 25);
    let mut from_b = HashSet::new();
    let mut counts = std::collections::HashMap::new();
    for s in 0..25u64 {
        let id = id_of(&mut env, s).await;
        *counts.entry(id.clone()).or_insert(0) += 1;
        if id.starts_with("r50") {
            from_b.insert(id);
        }
    }
    assert_eq!(from_b.len(), 5, "half of b per epoch");
    for i in 0..10 {
        assert_eq!(counts[&format!("r{i}")], 2, "every row of a twice");
    }
}

#[test]
fn templates_render_fields_and_keep_other_braces() {
    let row = json!({"question": "2+3", "n": 4, "flag": true})
        .as_object()
        .unwrap()
        .clone();
    let t = "{question}\nPut the final answer in \\boxed{}. {{question}} {n} {flag} { x}";
    assert_eq!(
        render_template(t, &row).unwrap(),
        "2+3\nPut the final answer in \\boxed{}. {question} 4 true { x}"
    );
    assert_eq!(render_template("{nope}", &row).unwrap_err().0, "nope");
}

#[test]
fn a_template_naming_an_unknown_field_names_file_row_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = task(vec![DataFile::new(write(
        &dir,
        "t.jsonl",
        &arith_rows(3, 0),
    ))]);
    c.template = Some("{question} in {units}".into());
    config_err(&c, &["t.jsonl", "line 1", "`units`"]);
}

#[test]
fn bad_data_errors_name_file_row_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let files = |name: &str, text: &str| vec![DataFile::new(write(&dir, name, text))];
    // An empty file.
    config_err(
        &task(files("empty.jsonl", "\n")),
        &["empty.jsonl", "no rows", "`question`", "`answer`"],
    );
    // A missing answer field.
    let text = format!(
        "{}{}\n",
        arith_rows(2, 0),
        json!({"id": "x", "question": "1+1"})
    );
    config_err(
        &task(files("noanswer.jsonl", &text)),
        &["noanswer.jsonl", "line 3", "`answer`"],
    );
    // An answer the verifier cannot parse at all (empty, or nothing after `####` but a brace).
    let text = format!(
        "{}{}\n",
        arith_rows(1, 0),
        json!({"id": "x", "question": "1+1", "answer": "  "})
    );
    config_err(
        &task(files("blank.jsonl", &text)),
        &["blank.jsonl", "line 2", "`answer`", "cannot parse"],
    );
    let text = format!("{}\n", json!({"question": "1+1", "answer": "\\boxed{"}));
    config_err(
        &task(files("brace.jsonl", &text)),
        &["brace.jsonl", "line 1", "`answer`", "cannot parse"],
    );
    // A missing file names it; blank lines do not shift the reported line.
    config_err(
        &task(vec![DataFile::new(dir.path().join("absent.jsonl"))]),
        &["absent.jsonl"],
    );
    let text = format!(
        "\n{}\n{}\n",
        arith_rows(1, 0).trim(),
        json!({"question": "1"})
    );
    config_err(&task(files("gaps.jsonl", &text)), &["gaps.jsonl", "line 3"]);
}

#[test]
fn config_values_are_checked_before_any_file_is_read() {
    let mut c = task(vec![DataFile::new("/nonexistent.jsonl")]);
    c.heldout_fraction = 1.0;
    config_err(&c, &["heldout_fraction"]);
    let mut c = task(vec![DataFile {
        weight: 0.0,
        ..DataFile::new("/nonexistent.jsonl")
    }]);
    config_err(&c, &["files[0].weight"]);
    c.files[0].weight = 1.0;
    c.extract.clear();
    config_err(&c, &["extract"]);
    config_err(&task(vec![]), &["files"]);
    // Through the spec, the field is prefixed with the environment.
    let mut c = task(vec![DataFile::new("/nonexistent.jsonl")]);
    c.format_weight = f64::NAN;
    let e = EnvSpec::new(EnvConfig::Dataset(Box::new(c)))
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("dataset.format_weight"), "{e}");
}

/// Resets `env` to seed 0 and answers with `action`.
async fn answer(env: &mut DatasetEnv, action: &str) -> rollflash_env::Step {
    env.reset(0).await.unwrap();
    env.step(action).await.unwrap()
}

#[tokio::test]
async fn rewards_right_wrong_unmarked_and_format() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{}\n",
        json!({"id": "a", "question": "What is half of 1?", "answer": "\\frac{1}{2}"})
    );
    let mut c = task(vec![DataFile::new(write(&dir, "t.jsonl", &text))]);
    c.template = Some("{question}\nPut the final answer in \\boxed{}.".into());
    let mut env = DatasetEnv::new(&c).unwrap();
    assert_eq!(
        env.reset(0).await.unwrap().observation,
        "What is half of 1?\nPut the final answer in \\boxed{}."
    );
    let right = answer(&mut env, "so \\boxed{0.5}").await;
    assert_eq!(right.reward, 1.0);
    assert!(right.terminated);
    assert_eq!(right.info["format_free"], json!(1.0));
    assert_eq!(answer(&mut env, "\\boxed{1/3}").await.reward, 0.0);
    // Unmarked: the last number is not an accepted rule by default, though format-free counts it.
    let bare = answer(&mut env, "it is 0.5").await;
    assert_eq!(bare.reward, 0.0);
    assert_eq!(bare.info["format_free"], json!(1.0));
    assert_eq!(answer(&mut env, "no idea").await.reward, 0.0);

    // Only `####` accepted: a boxed answer earns nothing; last number on request.
    let mut c2 = c.clone();
    c2.extract = vec![AnswerRule::Hashes];
    let mut env2 = DatasetEnv::new(&c2).unwrap();
    env2.reset(0).await.unwrap();
    assert_eq!(env2.step("\\boxed{1/2}").await.unwrap().reward, 0.0);
    env2.reset(0).await.unwrap();
    assert_eq!(env2.step("#### 1/2").await.unwrap().reward, 1.0);
    c2.extract = vec![AnswerRule::LastNumber];
    let mut env3 = DatasetEnv::new(&c2).unwrap();
    env3.reset(0).await.unwrap();
    assert_eq!(env3.step("it is 0.5").await.unwrap().reward, 1.0);

    // The format reward adds its weight.
    let mut c4 = c.clone();
    c4.format_weight = 0.1;
    let mut env4 = DatasetEnv::new(&c4).unwrap();
    env4.reset(0).await.unwrap();
    let s = env4
        .step("<think>half</think><answer>\\boxed{1/2}</answer>")
        .await
        .unwrap();
    assert!((s.reward - 1.1).abs() < 1e-12, "{}", s.reward);
    assert_eq!(s.info["format"], json!(1.0));
    // Step before reset, and after the end, are out of order.
    let mut env5 = DatasetEnv::new(&c).unwrap();
    assert!(env5.step("x").await.is_err());
}

/// `extract` is the verifier's rule list: only the listed rules, in the listed order (issue 35:
/// "the answer is 11." scored 0 under `["boxed", "last_number"]`, its unlisted "answer is" mark
/// found first and refused, the listed last number never tried).
#[tokio::test]
async fn extract_consults_only_its_rules_in_its_order() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{}\n",
        json!({"id": "a", "question": "3+8", "answer": "11"})
    );
    let mut c = task(vec![DataFile::new(write(&dir, "t.jsonl", &text))]);
    c.extract = vec![AnswerRule::Boxed, AnswerRule::LastNumber];
    let mut env = DatasetEnv::new(&c).unwrap();
    let s = answer(&mut env, "3 + 8 = 11, so the answer is 11.").await;
    assert_eq!(s.reward, 1.0, "{:?}", s.info["detail"]);
    assert_eq!(
        answer(&mut env, "3 + 8 = 12, so the answer is 12.")
            .await
            .reward,
        0.0
    );

    // Both listed marks present: the first listed decides.
    let both = "#### 11\nso \\boxed{12}";
    c.extract = vec![AnswerRule::Hashes, AnswerRule::Boxed];
    let mut hashes_first = DatasetEnv::new(&c).unwrap();
    assert_eq!(answer(&mut hashes_first, both).await.reward, 1.0);
    c.extract = vec![AnswerRule::Boxed, AnswerRule::Hashes];
    let mut boxed_first = DatasetEnv::new(&c).unwrap();
    assert_eq!(answer(&mut boxed_first, both).await.reward, 0.0);
}

#[tokio::test]
async fn gsm8k_solutions_and_parquet_files_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("question", Arc::new(StringArray::from(vec!["3+4", "10-2"]))),
        (
            "answer",
            Arc::new(StringArray::from(vec!["3+4=7\n#### 7", "10-2=8\n#### 8"])),
        ),
        ("level", Arc::new(Int64Array::from(vec![1, 2]))),
    ];
    let batch = RecordBatch::try_from_iter(cols).unwrap();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let mut c = DatasetTaskConfig::new(vec![DataFile::new(&path)]);
    c.prompt = "question".parse().unwrap();
    c.template = Some("[{level}] {question} =".into());
    let mut env = make_env(&EnvSpec::new(EnvConfig::Dataset(Box::new(c.clone())))).unwrap();
    let mut seen = HashSet::new();
    for s in 0..2 {
        let r = env.reset(s).await.unwrap();
        seen.insert(r.observation.clone());
        let answer = if r.observation.contains("3+4") { 7 } else { 8 };
        let step = env.step(&format!("#### {answer}")).await.unwrap();
        assert_eq!(step.reward, 1.0, "{:?}", step.info);
        assert!(r.info["id"].as_str().unwrap().contains("row "));
    }
    assert_eq!(
        seen,
        HashSet::from(["[1] 3+4 =".to_string(), "[2] 10-2 =".to_string()])
    );
    // A missing Parquet column names it.
    c.answer = "solution".parse().unwrap();
    config_err(&c, &["t.parquet", "`solution`"]);
}

#[test]
fn the_config_parses_from_toml_shaped_json_and_rejects_unknown_fields() {
    let spec: EnvSpec = serde_json::from_value(json!({
        "name": "dataset",
        "files": [{"path": "a.jsonl", "weight": 2.0}],
        "heldout_fraction": 0.1,
        "extract": ["####", "boxed", "<answer>", "last_number"],
    }))
    .unwrap();
    let EnvConfig::Dataset(c) = &spec.env else {
        panic!("dataset")
    };
    assert_eq!(c.files[0].weight, 2.0);
    assert_eq!(c.prompt, "prompt");
    assert_eq!(
        c.extract,
        vec![
            AnswerRule::Hashes,
            AnswerRule::Boxed,
            AnswerRule::AnswerTag,
            AnswerRule::LastNumber
        ]
    );
    let bad = serde_json::from_value::<EnvSpec>(json!({
        "name": "dataset", "files": [{"path": "a.jsonl"}], "prompt_field": "q"
    }));
    assert!(bad.is_err(), "unknown field accepted");
    let bad = serde_json::from_value::<EnvSpec>(json!({
        "name": "dataset", "files": [{"path": "a.jsonl", "wieght": 1}]
    }));
    assert!(bad.is_err(), "unknown file field accepted");
    // The origin a run sets applies to dataset specs only.
    let s = spec.clone().with_task_seed_origin(42);
    let EnvConfig::Dataset(c) = &s.env else {
        panic!("dataset")
    };
    assert_eq!(c.seed_origin, 42);
}

#[tokio::test]
async fn files_are_loaded_once_per_config_and_its_clones() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "t.jsonl", &arith_rows(4, 0));
    let c = task(vec![DataFile::new(&path)]);
    c.validate().unwrap();
    std::fs::remove_file(&path).unwrap();
    // A clone (what a run's per-trajectory factory holds) uses the loaded rows, also after
    // the run moved the origin; a clone that changes the data settings reads the files.
    let spec = EnvSpec::new(EnvConfig::Dataset(Box::new(c.clone()))).with_task_seed_origin(9);
    let mut env = make_env(&spec).unwrap();
    assert!(env.reset(9).await.is_ok());
    let mut changed = c.clone();
    changed.shuffle_seed = 1;
    assert!(rollflash_core::error_chain(&changed.validate().unwrap_err()).contains("t.jsonl"));
}

/// A conversation prompt (`messages = "…"`) reaches the reset as chat messages, with the
/// `system` field prepended when the conversation has no system message; its plain form is
/// the contents a blank line apart. JSONL and Parquet (a list of `{role, content}` structs,
/// as verl's and TRL's conversational datasets store it) alike.
#[tokio::test]
async fn conversation_prompts_become_chat_messages_with_the_system_field() {
    use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
    use arrow_schema::{DataType, Field};
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        json!({"id": "a", "sys": "Be terse.", "answer": "7",
               "chat": [{"role": "user", "content": "3+4?"}]}),
        json!({"id": "b", "sys": "ignored", "answer": "8",
               "chat": [{"role": "system", "content": "Own system."},
                        {"role": "user", "content": "Example: 1+1?"},
                        {"role": "assistant", "content": "2"},
                        {"role": "user", "content": "5+3?"}]}),
    ];
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    let jsonl = write(&dir, "chat.jsonl", &text);
    // The same rows as Parquet.
    let pq = dir.path().join("chat.parquet");
    let fields = vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
    ];
    let mut chat = ListBuilder::new(StructBuilder::from_fields(fields, 4));
    for r in &rows {
        for m in r["chat"].as_array().unwrap() {
            let s = chat.values();
            for (k, key) in ["role", "content"].iter().enumerate() {
                s.field_builder::<StringBuilder>(k)
                    .unwrap()
                    .append_value(m[*key].as_str().unwrap());
            }
            s.append(true);
        }
        chat.append(true);
    }
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(StringArray::from(vec!["a", "b"]))),
        (
            "sys",
            Arc::new(StringArray::from(vec!["Be terse.", "ignored"])),
        ),
        ("answer", Arc::new(StringArray::from(vec!["7", "8"]))),
        ("chat", Arc::new(chat.finish())),
    ];
    let batch = RecordBatch::try_from_iter(cols).unwrap();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&pq).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    for path in [jsonl, pq] {
        let mut c = DatasetTaskConfig::new(vec![DataFile::new(&path)]);
        c.messages = Some("chat".parse().unwrap());
        c.system = Some("sys".parse().unwrap());
        c.id = Some("id".parse().unwrap());
        let mut env = DatasetEnv::new(&c).unwrap();
        let mut by_id = std::collections::HashMap::new();
        for s in 0..2 {
            let r = env.reset(s).await.unwrap();
            let id = r.info["id"].as_str().unwrap().to_string();
            let answer = if id == "a" {
                "\\boxed{7}"
            } else {
                "\\boxed{8}"
            };
            assert_eq!(env.step(answer).await.unwrap().reward, 1.0);
            by_id.insert(id, r);
        }
        let roles = |id: &str| -> Vec<(String, String)> {
            by_id[id]
                .messages()
                .unwrap()
                .into_iter()
                .map(|m| (m.role, m.content))
                .collect()
        };
        let p = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            roles("a"),
            vec![p("system", "Be terse."), p("user", "3+4?")],
            "{path:?}"
        );
        assert_eq!(by_id["a"].observation, "Be terse.\n\n3+4?");
        assert_eq!(
            roles("b"),
            vec![
                p("system", "Own system."),
                p("user", "Example: 1+1?"),
                p("assistant", "2"),
                p("user", "5+3?")
            ],
            "the conversation's own system message wins: {path:?}"
        );
        assert_eq!(
            by_id["b"].observation,
            "Own system.\n\nExample: 1+1?\n\n2\n\n5+3?"
        );
    }
}

/// A string prompt is one user message (with the system field before it).
#[tokio::test]
async fn a_string_prompt_is_one_user_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "t.jsonl", &arith_rows(1, 0));
    let mut env = DatasetEnv::new(&task(vec![DataFile::new(&path)])).unwrap();
    let r = env.reset(0).await.unwrap();
    let m = r.messages().unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].role.as_str(), m[0].content.as_str()), ("user", "0+1"));
}

/// Bad conversations name the file, the line and the message's field.
#[test]
fn bad_conversations_name_file_row_and_message_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = json!({"answer": "1", "chat": [{"role": "user", "content": "q"}]});
    let cases = [
        (json!({"answer": "1", "chat": "q"}), "`chat`"),
        (json!({"answer": "1", "chat": []}), "`chat`: no messages"),
        (
            json!({"answer": "1", "chat": [{"role": "usr", "content": "q"}]}),
            "`chat[0].role`: unknown role",
        ),
        (
            json!({"answer": "1", "chat": [{"role": "user"}]}),
            "`chat[0].content`: missing",
        ),
        (
            json!({"answer": "1", "chat": [{"role": "user", "content": "q"},
                                           {"role": "assistant", "content": "a"}]}),
            "`chat[1].role`: the last message must be the user's",
        ),
    ];
    for (i, (bad, part)) in cases.into_iter().enumerate() {
        let path = write(&dir, &format!("bad{i}.jsonl"), &format!("{good}\n{bad}\n"));
        let mut c = DatasetTaskConfig::new(vec![DataFile::new(&path)]);
        c.messages = Some("chat".parse().unwrap());
        config_err(&c, &[&format!("bad{i}.jsonl"), "line 2", part]);
    }
    // A template renders string prompts only.
    let path = write(&dir, "ok.jsonl", &format!("{good}\n"));
    let mut c = DatasetTaskConfig::new(vec![DataFile::new(&path)]);
    c.messages = Some("chat".parse().unwrap());
    c.template = Some("{chat}".into());
    config_err(&c, &["template", "messages"]);
}

/// `reward = "countdown"`: the answer field is the target, the numbers field the numbers;
/// a solution scores 1, a wrong or unmarked one 0, the format reward adds its weight; bad
/// rows name file, line and field.
#[tokio::test]
async fn countdown_rows_are_scored_by_the_countdown_check() {
    use rollflash_env::envs::dataset_task::DatasetReward;
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        json!({"q": "Use 3 5 7 to make 22", "target": 22, "nums": [3, 5, 7]}),
        json!({"q": "Use 2 4 to make 8", "target": "8", "nums": "2, 4"}),
    ];
    let path = write(
        &dir,
        "cd.jsonl",
        &rows.iter().map(|r| format!("{r}\n")).collect::<String>(),
    );
    let mut c = DatasetTaskConfig::new(vec![DataFile::new(&path)]);
    c.prompt = "q".parse().unwrap();
    c.answer = "target".parse().unwrap();
    c.reward = DatasetReward::Countdown;
    c.numbers = Some("nums".parse().unwrap());
    c.format_weight = 0.5;
    let mut env = DatasetEnv::new(&c).unwrap();
    for seed in 0..2 {
        let r = env.reset(seed).await.unwrap();
        let (right, wrong) = if r.observation.contains("22") {
            ("3*5+7", "3+5+7")
        } else {
            ("2*4", "4-2")
        };
        let good = format!("<think>ok</think><answer>{right}</answer>");
        assert_eq!(env.step(&good).await.unwrap().reward, 1.5, "{good}");
        env.reset(seed).await.unwrap();
        let s = env
            .step(&format!("<answer>{wrong}</answer>"))
            .await
            .unwrap();
        assert_eq!(s.info["correct"], json!(0.0), "{wrong}");
        env.reset(seed).await.unwrap();
        let s = env.step(&format!("\\boxed{{{right}}}")).await.unwrap();
        assert_eq!(
            s.info["correct"],
            json!(1.0),
            "a boxed expression counts too"
        );
    }
    // Bad rows.
    let cases = [
        (json!({"q": "x", "target": "ten", "nums": [1]}), "`target`"),
        (json!({"q": "x", "target": 3}), "`nums`: missing"),
        (json!({"q": "x", "target": 3, "nums": [1, "a"]}), "`nums`"),
        (json!({"q": "x", "target": 3, "nums": "1 b"}), "`nums`"),
    ];
    for (i, (bad, part)) in cases.into_iter().enumerate() {
        let p = write(
            &dir,
            &format!("cd{i}.jsonl"),
            &format!("{}\n{bad}\n", rows[0]),
        );
        let mut b = c.clone();
        b.files = vec![DataFile::new(&p)];
        config_err(&b, &[&format!("cd{i}.jsonl"), "line 2", part]);
    }
    let mut m = DatasetTaskConfig::new(vec![DataFile::new(&path)]);
    m.numbers = Some("nums".parse().unwrap());
    config_err(&m, &["numbers", "countdown"]);
}

/// A Parquet countdown file stores its numbers as a list column (`list<int64>`, as
/// `pandas.to_parquet` writes a column of lists): the list reaches the countdown check.
#[tokio::test]
async fn countdown_numbers_from_a_parquet_list_column() {
    use arrow_array::builder::{Int64Builder, ListBuilder};
    use rollflash_env::envs::dataset_task::DatasetReward;
    let dir = tempfile::tempdir().unwrap();
    let mut nums = ListBuilder::new(Int64Builder::new());
    for row in [[3i64, 5, 7], [2, 4, 9]] {
        nums.values().append_slice(&row);
        nums.append(true);
    }
    let batch = RecordBatch::try_from_iter([
        (
            "q",
            Arc::new(StringArray::from(vec!["make 22", "make 17"])) as ArrayRef,
        ),
        (
            "target",
            Arc::new(Int64Array::from(vec![22, 17])) as ArrayRef,
        ),
        ("nums", Arc::new(nums.finish()) as ArrayRef),
    ])
    .unwrap();
    let path = dir.path().join("cd.parquet");
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let mut c = DatasetTaskConfig::new(vec![DataFile::new(&path)]);
    c.prompt = "q".parse().unwrap();
    c.answer = "target".parse().unwrap();
    c.reward = DatasetReward::Countdown;
    c.numbers = Some("nums".parse().unwrap());
    let mut env = DatasetEnv::new(&c).unwrap();
    for seed in 0..2 {
        let r = env.reset(seed).await.unwrap();
        let right = if r.observation.contains("22") {
            "3*5+7"
        } else {
            "2*4+9"
        };
        let s = env
            .step(&format!("<answer>{right}</answer>"))
            .await
            .unwrap();
        assert_eq!(s.reward, 1.0, "{right}");
        env.reset(seed).await.unwrap();
        // A number the row does not have is refused: the list really is the row's.
        let s = env.step("<answer>11*2</answer>").await.unwrap();
        assert_eq!(s.reward, 0.0);
    }
}

/// The committed reasoning-gym fixtures (`configs/data/reasoning_gym/`, written by
/// `scripts/make_reasoning_gym_data.sh` from reasoning-gym 0.1.25) load as the shipped
/// configs read them, and the generator's own answers earn full reward: chain_sum's number,
/// boxed, and countdown's reference expression, tagged.
#[tokio::test]
async fn reasoning_gym_fixtures_load_and_their_own_answers_score() {
    use rollflash_env::envs::dataset_task::DatasetReward;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs/data/reasoning_gym");
    let rows = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(root.join(name))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    for (task, reward) in [
        ("chain_sum", DatasetReward::Math),
        ("countdown", DatasetReward::Countdown),
    ] {
        let mut c = DatasetTaskConfig::new(vec![DataFile::new(
            root.join(format!("{task}_train.jsonl")),
        )]);
        c.heldout = vec![DataFile::new(root.join(format!("{task}_test.jsonl")))];
        c.prompt = "question".parse().unwrap();
        c.id = Some("id".parse().unwrap());
        c.reward = reward.clone();
        let mut env = DatasetEnv::new(&c).unwrap();
        let all: Vec<_> = rows(&format!("{task}_train.jsonl"))
            .into_iter()
            .chain(rows(&format!("{task}_test.jsonl")))
            .collect();
        assert_eq!(
            env.data().train().len() + env.data().heldout().len(),
            all.len()
        );
        let by_id: std::collections::HashMap<String, serde_json::Value> = all
            .into_iter()
            .map(|r| (r["id"].as_str().unwrap().to_string(), r))
            .collect();
        let seeds = (0..env.data().train().len() as u64)
            .chain((0..env.data().heldout().len() as u64).map(|i| HELD_OUT_SEED_BASE + i));
        for seed in seeds {
            let r = env.reset(seed).await.unwrap();
            let row = &by_id[r.info["id"].as_str().unwrap()];
            let response = match reward {
                DatasetReward::Math => format!("\\boxed{{{}}}", row["answer"].as_str().unwrap()),
                DatasetReward::Countdown => {
                    format!("<answer>{}</answer>", row["expression"].as_str().unwrap())
                }
                DatasetReward::Code | DatasetReward::Python(_) => {
                    unreachable!("the committed data sets are math and countdown")
                }
            };
            let s = env.step(&response).await.unwrap();
            assert_eq!(s.reward, 1.0, "{task} {response}: {:?}", s.info);
        }
    }
}
