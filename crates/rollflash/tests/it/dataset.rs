//! `rollflash train` on the user's own data (`env.name = "dataset"`) as a process.

use std::process::Command;

/// 40 training and 8 held-out arithmetic rows in GSM8K's shape, in `dir`.
fn write_data(dir: &std::path::Path) -> (String, String) {
    let rows = |n: usize, first: usize| -> String {
        (first..first + n)
            .map(|i| {
                let (a, b) = (i % 50 + 2, (7 * i) % 40 + 1);
                format!(
                    "{}\n",
                    serde_json::json!({"id": format!("r{i}"), "q": format!("{a}+{b}"),
                                       "sol": format!("{a}+{b}={} #### {}", a + b, a + b)})
                )
            })
            .collect()
    };
    let train = dir.join("train.jsonl");
    let test = dir.join("test.jsonl");
    std::fs::write(&train, rows(40, 0)).unwrap();
    std::fs::write(&test, rows(8, 1000)).unwrap();
    (train.display().to_string(), test.display().to_string())
}

fn train(dir: &std::path::Path, sets: &[String]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollflash"));
    cmd.arg("train");
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd.current_dir(dir).output().unwrap()
}

fn sets(dir: &std::path::Path, train: &str, test: &str) -> Vec<String> {
    vec![
        format!("output_dir={:?}", dir.join("run").display().to_string()),
        "env.name=dataset".into(),
        format!("env.files=[{{path={train:?}}}]"),
        format!("env.heldout=[{{path={test:?}}}]"),
        "env.prompt=q".into(),
        "env.answer=sol".into(),
        "env.id=id".into(),
        r#"env.template="Q: {q}\nA: ""#.into(),
        "warmup.steps=0".into(),
        "train.steps=2".into(),
        "train.eval_problems=4".into(),
        "train.eval_samples=0".into(),
        "buffer.groups_per_batch=2".into(),
        "buffer.group_size=4".into(),
        "rollout.max_new_tokens=8".into(),
        "metrics.progress=false".into(),
    ]
}

#[test]
fn train_on_a_jsonl_file_trains_and_evaluates_on_the_held_out_file() {
    let dir = tempfile::tempdir().unwrap();
    let (train_path, test_path) = write_data(dir.path());
    let out = train(dir.path(), &sets(dir.path(), &train_path, &test_path));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout {stdout}\nstderr {stderr}");
    assert!(stdout.contains("env `dataset`"), "{stdout}");
    assert!(
        stdout.contains("greedy eval on 4 held-out tasks"),
        "evaluates before and after: {stdout}"
    );
    assert!(stdout.contains("trained 16"), "two steps of 2x4: {stdout}");
    let metrics = std::fs::read_to_string(dir.path().join("run/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "one line per step: {metrics}");
}

#[test]
fn bad_data_fails_the_config_load_naming_file_row_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let (train_path, test_path) = write_data(dir.path());
    let mut text = std::fs::read_to_string(&train_path).unwrap();
    text.push_str("{\"id\": \"bad\", \"q\": \"1+1\"}\n");
    std::fs::write(&train_path, text).unwrap();
    let mut s = sets(dir.path(), &train_path, &test_path);
    // Pointing at a model that does not exist: the data error must come first.
    s.push("model.path=\"/nonexistent-model\"".into());
    let out = train(dir.path(), &s);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for part in ["train.jsonl", "line 41", "`sol`"] {
        assert!(stderr.contains(part), "{part:?} not in {stderr}");
    }
    assert!(!stderr.contains("nonexistent-model"), "{stderr}");
}

#[test]
fn the_shipped_dataset_config_and_its_example_data_load() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args([
            "train",
            "--config",
            "configs/dataset_math.toml",
            "--dry-run",
        ])
        .current_dir(&root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("name = \"dataset\""), "{stdout}");
}

/// Each kind of bad data, through `rollflash train --config <file>` as a user runs it: the
/// run fails at config load (before the model, which does not exist here, is looked at)
/// with a message naming the file, the row and the field.
#[test]
fn bad_data_through_a_config_file_fails_fast_naming_file_row_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = |i: usize| {
        serde_json::json!({"id": format!("r{i}"), "q": format!("{i}+1"), "sol": format!("#### {}", i + 1)})
            .to_string()
    };
    let rows = |extra: &str| format!("{}\n{}\n{extra}", good(0), good(1));
    // (file text, template, parts the message must name)
    let cases: Vec<(&str, String, &str, Vec<&str>)> = vec![
        (
            "empty",
            String::new(),
            "{q}",
            vec!["empty.jsonl", "no rows", "`q`", "`sol`"],
        ),
        (
            "noanswer",
            rows("{\"id\": \"x\", \"q\": \"2+2\"}\n"),
            "{q}",
            vec!["noanswer.jsonl", "line 3", "`sol`"],
        ),
        (
            "unknown",
            rows(""),
            "{q} in {units}",
            vec!["unknown.jsonl", "line 1", "`units`"],
        ),
        (
            "unparsable",
            rows("{\"id\": \"x\", \"q\": \"2+2\", \"sol\": \"#### \\\\frac{1}{\"}\n"),
            "{q}",
            vec!["unparsable.jsonl", "line 3", "`sol`", "cannot parse"],
        ),
    ];
    for (name, text, template, parts) in cases {
        let data = dir.path().join(format!("{name}.jsonl"));
        std::fs::write(&data, text).unwrap();
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                "output_dir = {out:?}\n[model]\npath = \"/nonexistent-model\"\n\
                 [env]\nname = \"dataset\"\nfiles = [{{ path = {data:?} }}]\n\
                 prompt = \"q\"\nanswer = \"sol\"\ntemplate = {template:?}\n",
                out = dir.path().join(format!("run-{name}")).display().to_string(),
                data = data.display().to_string(),
            ),
        )
        .unwrap();
        let t0 = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
            .args(["train", "--config"])
            .arg(&config)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{name}: {stdout}");
        for part in &parts {
            assert!(stderr.contains(part), "{name}: {part:?} not in {stderr}");
        }
        assert!(!stderr.contains("nonexistent-model"), "{name}: {stderr}");
        assert!(
            !stdout.contains("warm-up") && !stdout.contains("eval"),
            "{stdout}"
        );
        assert!(
            !dir.path().join(format!("run-{name}")).exists(),
            "{name}: nothing is written before the data is checked"
        );
        // Generous: config load only, no model (a loaded CI machine still takes well under).
        assert!(t0.elapsed().as_secs() < 60, "{name}: {:?}", t0.elapsed());
    }
}

/// The shipped SmolLM2 reasoning-gym config parses and validates; its data (written by
/// `scripts/make_reasoning_gym_data.sh`) is swapped for the committed fixtures of the same
/// shape, so the check needs neither the script nor the model.
#[test]
fn the_shipped_reasoning_gym_config_loads_on_the_committed_fixtures() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args([
            "train",
            "--config",
            "configs/reasoning_gym_chain_sum.toml",
            "--set",
            "env.files=[{path=\"configs/data/reasoning_gym/chain_sum_train.jsonl\"}]",
            "--set",
            "env.heldout=[{path=\"configs/data/reasoning_gym/chain_sum_test.jsonl\"}]",
            "--dry-run",
        ])
        .current_dir(&root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("chain_sum_train.jsonl"), "{stdout}");
    assert!(stdout.contains("smollm2-hf"), "{stdout}");
}
