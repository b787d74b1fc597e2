//! The code reward of the dataset task (`reward = "code"`): both test shapes, both scorings,
//! every verdict a response can earn, and the refusals. Skips, saying why, where the sandbox
//! cannot start (`scripts/setup_sandbox.sh`).

use std::path::PathBuf;

use rollflash_env::dataset::FieldPath;
use rollflash_env::envs::dataset_task::DatasetReward;
use rollflash_env::envs::{DataFile, DatasetEnv, DatasetTaskConfig};
use rollflash_env::verify::code::CodeScoring;
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

/// HumanEval as `scripts/make_humaneval_data.sh` writes it, if it has been run.
fn humaneval_file() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ROLLFLASH_HUMANEVAL") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var("ROLLFLASH_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("rollflash")))
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache/rollflash")))
        .ok()?;
    let p = cache.join("humaneval/HumanEval.jsonl");
    p.exists().then_some(p)
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
