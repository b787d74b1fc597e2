//! Tests of Python reward functions written the way users write them: verl's GSM8K scorer
//! (strict `####` extraction) on verl's Parquet, a TRL batched length penalty, a function
//! importing a package from its own venv, and hostile functions (raise, NaN, a string, the
//! wrong length, a hang, `os._exit`), each of which fails its samples and never the pool.
//!
//! Every test skips, saying so, when no `python3` is on `PATH`.

use std::path::{Path, PathBuf};
use std::process::Command;

use rollflash_env::envs::{DatasetEnv, DatasetTaskConfig};
use rollflash_env::verify::python::{
    Call, PythonPool, PythonPoolConfig, RewardStyle, Score, Scored,
};
use rollflash_env::Env;
use serde_json::{json, Value};

use crate::verl_format::{parquet, rows, verl_task};

/// `python3`, when there is one.
fn python3() -> Option<PathBuf> {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipped: no python3 on PATH");
    }
    ok.then(|| PathBuf::from("python3"))
}

fn pool_config(python: PathBuf, workers: usize) -> PythonPoolConfig {
    PythonPoolConfig {
        python,
        workers,
        timeout_secs: 2.0,
        ..PythonPoolConfig::default()
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// verl's `verl/utils/reward_score/gsm8k.py`, as it is (strict: only `#### <number>`).
const VERL_GSM8K: &str = r#####"
import re

_SOLUTION_CLIP_CHARS = 300


def extract_solution(solution_str, method="strict"):
    assert method in ["strict", "flexible"]
    if len(solution_str) > _SOLUTION_CLIP_CHARS:
        solution_str = solution_str[-_SOLUTION_CLIP_CHARS:]
    if method == "strict":
        solutions = re.findall("#### (\\-?[0-9\\.\\,]+)", solution_str)
        if len(solutions) == 0:
            final_answer = None
        else:
            final_answer = solutions[-1].replace(",", "").replace("$", "")
    else:
        answer = re.findall("(\\-?[0-9\\.\\,]+)", solution_str)
        final_answer = None
        if len(answer) == 0:
            pass
        else:
            invalid_str = ["", "."]
            for final_answer in reversed(answer):
                if final_answer not in invalid_str:
                    break
    return final_answer


def compute_score(data_source, solution_str, ground_truth, extra_info=None, method="strict",
                  format_score=0.0, score=1.0):
    assert data_source == "openai/gsm8k", data_source
    assert extra_info["split"] == "train"
    answer = extract_solution(solution_str=solution_str, method=method)
    if answer is None:
        return {"score": 0.0, "acc": False, "pred": None}
    ok = answer == ground_truth
    return {"score": score if ok else format_score, "acc": ok, "pred": answer}
"#####;

/// The ground truths of `verl_format::rows()`, by `extra_info.index`.
const TRUTHS: [&str; 3] = ["12", "9", "200"];

async fn score_env(
    env: &mut DatasetEnv,
    seed: u64,
    respond: impl Fn(&str) -> String,
) -> (f64, Value) {
    let r = env.reset(seed).await.unwrap();
    let id: usize = r.info["id"].as_str().unwrap().parse().unwrap();
    let step = env.step(&respond(TRUTHS[id])).await.unwrap();
    (step.reward, Value::Object(step.info))
}

#[tokio::test]
async fn verl_gsm8k_scorer_on_verl_parquet_scores_strict_answers() {
    let Some(python) = python3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = parquet(&dir, "train.parquet", &rows());
    let scorer = write(dir.path(), "gsm8k.py", VERL_GSM8K);
    let task = verl_task(
        &file,
        json!({"reward": {"python": {"path": scorer, "style": "verl"}}}),
    );
    task.validate().unwrap();
    task.set_python_pool(PythonPool::start(pool_config(python, 2)).await.unwrap());
    let mut env = DatasetEnv::new(&task).unwrap();
    for seed in 0..3 {
        let (r, info) = score_env(&mut env, seed, |t| format!("so the total is\n#### {t}")).await;
        assert_eq!(r, 1.0, "{info}");
        assert_eq!(info["verdict"], "ok");
        assert_eq!(info["python/ok"], 1.0);
        assert_eq!(info["reward/acc"], 1.0, "verl's extra keys become metrics");
        assert!(
            info.get("reward/pred").is_none(),
            "non-numeric extras are not metrics"
        );
        assert_eq!(info["data_source"], "openai/gsm8k");
        // Strict: the right number without `####` scores nothing.
        let (r, info) = score_env(&mut env, seed, |t| format!("The answer is {t}.")).await;
        assert_eq!(r, 0.0, "{info}");
        assert_eq!(info["reward/acc"], 0.0);
        let (r, _) = score_env(&mut env, seed, |_| "#### 7".into()).await;
        assert_eq!(r, 0.0);
    }
}

#[tokio::test]
async fn without_a_pool_a_python_reward_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = parquet(&dir, "train.parquet", &rows());
    let scorer = write(dir.path(), "gsm8k.py", VERL_GSM8K);
    let task = verl_task(&file, json!({"reward": {"python": {"path": scorer}}}));
    let e = DatasetEnv::new(&task).unwrap_err().to_string();
    assert!(
        e.contains("`reward`") && e.contains("[reward.python]"),
        "{e}"
    );
    let task = verl_task(
        &file,
        json!({"reward": {"python": {"path": dir.path().join("nope.py")}}}),
    );
    let e = task.validate().unwrap_err().to_string();
    assert!(
        e.contains("reward.python.path") && e.contains("nope.py"),
        "{e}"
    );
}

/// A TRL reward function as TRL's docs write them.
const TRL_LENGTH: &str = r#"
import json, os

def length_penalty(prompts, completions, **kwargs):
    assert len(prompts) == len(completions)
    assert all(len(v) == len(completions) for v in kwargs.values()), kwargs
    with open(os.environ.get("BATCH_LOG", "/dev/null"), "a") as f:
        f.write(json.dumps({"n": len(completions), "keys": sorted(kwargs)}) + "\n")
    return [-len(c) / 100.0 for c in completions]
"#;

fn trl_call(path: &Path, function: &str, completion: &str) -> Call {
    Call {
        path: path.to_path_buf(),
        function: function.into(),
        style: RewardStyle::Trl,
        args: json!({"prompt": "Say something.", "completion": completion,
                     "columns": {"answer": "x", "level": 3}}),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn trl_functions_score_a_group_in_one_call() {
    let Some(python) = python3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "rewards.py", TRL_LENGTH);
    let log = dir.path().join("batches.jsonl");
    // The worker inherits the environment; the function logs each call's size there.
    std::env::set_var("BATCH_LOG", &log);
    let pool = PythonPool::start(pool_config(python, 1)).await.unwrap();
    let completions: Vec<String> = (0..8).map(|i| "x".repeat(10 * i)).collect();
    // Sent together (one thread: all eight are queued before the dispatcher runs), as a
    // group's samples finishing together are: one call.
    let scores: Vec<Scored> = futures::future::join_all(
        completions
            .iter()
            .map(|c| pool.score(trl_call(&f, "length_penalty", c))),
    )
    .await;
    for (i, s) in scores.iter().enumerate() {
        let Score { value, .. } = s.as_ref().unwrap();
        assert!((value + 0.1 * i as f64).abs() < 1e-9, "{i}: {value}");
    }
    let calls: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(calls, vec![json!({"n": 8, "keys": ["answer", "level"]})]);
    assert_eq!(
        pool.stats()
            .calls
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

/// Functions that fail in every way the issue lists.
const HOSTILE: &str = r#"
import os, time

def fine(data_source, solution_str, ground_truth, extra_info):
    return 0.5

def raises(data_source, solution_str, ground_truth, extra_info):
    return 1 / 0

def nan(data_source, solution_str, ground_truth, extra_info):
    return float("nan")

def string(data_source, solution_str, ground_truth, extra_info):
    return "1.0"

def no_score(data_source, solution_str, ground_truth, extra_info):
    return {"acc": 1.0}

def hangs(data_source, solution_str, ground_truth, extra_info):
    time.sleep(600)

def exits(data_source, solution_str, ground_truth, extra_info):
    print("about to die")
    os._exit(3)

def prints(data_source, solution_str, ground_truth, extra_info):
    print("a stray print must not break the protocol")
    return 1.0

def wrong_length(prompts, completions, **kw):
    return [1.0]

def not_a_list(prompts, completions, **kw):
    return 1.0
"#;

fn verl_call(path: &Path, function: &str) -> Call {
    Call {
        path: path.to_path_buf(),
        function: function.into(),
        style: RewardStyle::Verl,
        args: json!({"data_source": "s", "solution_str": "r", "ground_truth": "1",
                     "extra_info": {}}),
    }
}

#[tokio::test]
async fn hostile_functions_fail_their_samples_not_the_pool() {
    let Some(python) = python3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "hostile.py", HOSTILE);
    let mut cfg = pool_config(python, 1);
    cfg.timeout_secs = 1.0;
    let pool = PythonPool::start(cfg).await.unwrap();
    let cases: [(&str, &str); 8] = [
        ("raises", "ZeroDivisionError"),
        ("nan", "not a finite number"),
        ("string", "returned str '1.0'"),
        ("no_score", "without `score`"),
        ("hangs", "timed out after 1 s"),
        ("exits", "worker exited"),
        ("missing", "has no function 'missing'"),
        ("prints", ""),
    ];
    for (function, expect) in cases {
        let got = pool.score(verl_call(&f, function)).await;
        match (expect, &got) {
            ("", Ok(s)) => assert_eq!(s.value, 1.0),
            (e, Err(msg)) => assert!(msg.contains(e), "{function}: {msg}"),
            _ => panic!("{function}: {got:?}"),
        }
        // The pool (restarted where needed) serves the next sample.
        let next = pool.score(verl_call(&f, "fine")).await.unwrap();
        assert_eq!(next.value, 0.5, "after {function}");
    }
    let exits = pool.score(verl_call(&f, "exits")).await.unwrap_err();
    assert!(
        exits.contains("exit status: 3") && exits.contains("about to die"),
        "{exits}"
    );
    for (function, expect) in [
        ("wrong_length", "returned 1 scores for 2 completions"),
        ("not_a_list", "not a list of floats"),
    ] {
        let two = futures::future::join(
            pool.score(trl_call(&f, function, "a")),
            pool.score(trl_call(&f, function, "b")),
        )
        .await;
        for got in [two.0, two.1] {
            let msg = got.unwrap_err();
            assert!(msg.contains(expect), "{function}: {msg}");
        }
    }
    let stats = pool.stats();
    use std::sync::atomic::Ordering::Relaxed;
    // `hangs` and both `exits` cost a worker each.
    assert_eq!(stats.restarts.load(Relaxed), 3);
    assert_eq!(stats.failed.load(Relaxed), 7 + 1 + 4);
}

/// Functions that start a process (`sleep`, its pid written to `PIDS`) and leave it behind:
/// one hangs past the deadline, one kills its own worker.
const SPAWNS: &str = r#"
import os, subprocess, time

def _child():
    p = subprocess.Popen(["sleep", "300"])
    with open(PIDS, "a") as f:
        f.write(f"{p.pid}\n")

def hangs(data_source, solution_str, ground_truth, extra_info=None):
    _child()
    time.sleep(300)

def exits(data_source, solution_str, ground_truth, extra_info=None):
    _child()
    os._exit(4)
"#;

/// Whether process `pid` still runs (a zombie waiting for its reaper does not).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[tokio::test]
async fn what_a_function_starts_dies_with_its_worker() {
    let Some(python) = python3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let f = write(
        dir.path(),
        "spawns.py",
        &SPAWNS.replace("PIDS", &format!("{:?}", pids.display().to_string())),
    );
    let mut cfg = pool_config(python, 1);
    cfg.timeout_secs = 1.0;
    let pool = PythonPool::start(cfg).await.unwrap();
    for (function, expect) in [("hangs", "timed out"), ("exits", "worker exited")] {
        let got = pool.score(verl_call(&f, function)).await.unwrap_err();
        assert!(got.contains(expect), "{function}: {got}");
        let text = std::fs::read_to_string(&pids).unwrap();
        let pid = text.lines().last().unwrap().to_string();
        // SIGKILL is delivered at once; the grace covers a loaded machine's scheduling.
        // (An async wait: the pool's tasks, which kill, run on this test's thread.)
        let mut gone = false;
        for _ in 0..100 {
            gone = !running(&pid);
            if gone {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(
            gone,
            "{function}: its `sleep` (pid {pid}) outlived the worker"
        );
    }
}

#[tokio::test]
async fn a_failed_sample_is_a_counted_verdict_with_its_reason() {
    let Some(python) = python3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = parquet(&dir, "train.parquet", &rows());
    let f = write(dir.path(), "hostile.py", HOSTILE);
    let task = verl_task(
        &file,
        json!({"reward": {"python": {"path": f, "function": "raises"}}}),
    );
    task.set_python_pool(PythonPool::start(pool_config(python, 1)).await.unwrap());
    let mut env = DatasetEnv::new(&task).unwrap();
    let (r, info) = score_env(&mut env, 0, |t| format!("#### {t}")).await;
    assert_eq!(r, 0.0);
    assert_eq!(info["verdict"], "reward_failed");
    assert_eq!(info["python/reward_failed"], 1.0);
    assert!(
        info["reward_error"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError"),
        "{info}"
    );
}

#[tokio::test]
async fn by_source_routes_rows_to_their_function() {
    let Some(python) = python3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = parquet(&dir, "train.parquet", &rows());
    let f = write(dir.path(), "hostile.py", HOSTILE);
    let task: DatasetTaskConfig = verl_task(
        &file,
        json!({"reward": {"python": {"path": f, "function": "raises",
              "by_source": {"openai/gsm8k": {"path": f, "function": "fine"}}}}}),
    );
    task.set_python_pool(PythonPool::start(pool_config(python, 1)).await.unwrap());
    let mut env = DatasetEnv::new(&task).unwrap();
    let (r, info) = score_env(&mut env, 1, |t| t.to_string()).await;
    assert_eq!(r, 0.5, "{info}");
}

/// A venv of its own with one Python package, or why not (no network, no venv).
pub(crate) fn venv_with(dir: &Path, package: &str) -> Result<PathBuf, String> {
    let venv = dir.join("venv");
    let out = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .map_err(|e| format!("python3 -m venv: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "python3 -m venv: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let python = venv.join("bin/python");
    let out = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--timeout",
            "15",
            "--retries",
            "1",
            package,
        ])
        .output()
        .map_err(|e| format!("pip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pip install {package}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(python)
}

#[tokio::test]
async fn a_function_imports_a_package_from_the_configured_venv() {
    if python3().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let python = match venv_with(dir.path(), "six==1.17.0") {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped: cannot build a venv with a package: {why}");
            return;
        }
    };
    let f = write(
        dir.path(),
        "uses_six.py",
        r#"
import sys, six

def compute_score(data_source, solution_str, ground_truth, extra_info):
    # Which interpreter runs us, so the test can see it is the venv's.
    return {"score": float(six.text_type(ground_truth) in solution_str),
            "in_venv": float(sys.prefix != sys.base_prefix)}
"#,
    );
    let pool = PythonPool::start(pool_config(python, 1)).await.unwrap();
    let s = pool.score(verl_call(&f, "compute_score")).await.unwrap();
    assert_eq!(s.value, 0.0);
    assert_eq!(s.extra, vec![("in_venv".to_string(), 1.0)]);
}

#[tokio::test]
async fn a_missing_interpreter_stops_the_start_with_its_name() {
    let cfg = pool_config(PathBuf::from("/nonexistent/bin/python"), 1);
    let e = PythonPool::start(cfg).await.unwrap_err().to_string();
    assert!(e.contains("/nonexistent/bin/python"), "{e}");
    let bad = PythonPoolConfig {
        workers: 0,
        ..PythonPoolConfig::default()
    };
    let e = PythonPool::start(bad).await.unwrap_err().to_string();
    assert!(e.contains("reward.python.workers"), "{e}");
}
