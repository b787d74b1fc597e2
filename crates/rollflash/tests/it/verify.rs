//! `rollflash verify --stdin`: an outside trainer's grader (the TRL side-by-side's reward
//! function) gives each response exactly the reward the dataset task gives it, with the same
//! `extract` rules and `format_weight = 0`; a malformed line names its line.

use std::io::Write;
use std::process::{Command, Stdio};

use rollflash_env::envs::dataset_task::AnswerRule;
use rollflash_env::envs::{DataFile, DatasetEnv, DatasetTaskConfig};
use rollflash_env::Env;

/// `rollflash verify --stdin` with `args` on `input`: its stdout and whether it succeeded.
fn verify(args: &[&str], input: &str) -> (String, String, bool) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args(["verify", "--stdin"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

#[tokio::test]
async fn verify_stdin_gives_the_dataset_task_s_reward() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.jsonl");
    std::fs::write(
        &rows,
        "{\"prompt\": \"What is 4 + 7?\", \"answer\": \"11\"}\n",
    )
    .unwrap();
    let responses = [
        "4 + 7 = 11",
        "The sum is \\boxed{11}.",
        "\\boxed{12} or maybe 11",
        "the answer is 11.",
        "11 apples and 3",
        "I think it is 12",
        "",
    ];
    for (extract, names) in [
        (
            vec![AnswerRule::Boxed, AnswerRule::LastNumber],
            "boxed,last_number",
        ),
        // The task's default rules, and no --extract.
        (Vec::new(), ""),
    ] {
        let mut task = DatasetTaskConfig::new(vec![DataFile::new(&rows)]);
        if !extract.is_empty() {
            task.extract = extract;
        }
        task.format_weight = 0.0;
        task.validate().unwrap();
        let mut env = DatasetEnv::new(&task).unwrap();
        let mut expected = Vec::new();
        for r in responses {
            env.reset(0).await.unwrap();
            expected.push(env.step(r).await.unwrap().reward);
        }
        let input: String = responses
            .iter()
            .map(|r| {
                format!(
                    "{}\n",
                    serde_json::json!({"reference": "11", "response": r})
                )
            })
            .collect();
        let args: &[&str] = if names.is_empty() {
            &[]
        } else {
            &["--extract", names]
        };
        let (out, err, ok) = verify(args, &input);
        assert!(ok, "{err}");
        let got: Vec<f64> = out
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["reward"]
                    .as_f64()
                    .unwrap()
            })
            .collect();
        assert_eq!(got, expected, "{names}");
        assert!(got.contains(&1.0) && got.contains(&0.0), "{names}: {got:?}");
    }

    let (_, err, ok) = verify(
        &[],
        "{\"reference\": \"1\", \"response\": \"1\"}\n{\"reference\": 3}\n",
    );
    assert!(!ok);
    assert!(err.contains("line 2"), "{err}");
    let (_, err, ok) = verify(&["--extract", "boxed,last_word"], "");
    assert!(!ok);
    assert!(err.contains("last_word"), "{err}");
}
