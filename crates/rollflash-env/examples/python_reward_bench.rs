//! Measures the Python reward pool against the built-in Rust math verifier on the same rows (BENCHMARKS.md, "Python reward functions").
//!
//! `cargo run --release -p rollflash-env --example python_reward_bench [-- PYTHON]`: 2 000
//! GSM8K-style samples (half right, `#### n`), scored by verl's own `gsm8k.py` (strict) in
//! pools of 1, 2 and 4 workers — all samples submitted at once (throughput), and one at a
//! time (the latency a sample's reward adds) — and by `MathVerifier` with the `####` rule,
//! inline on one thread. The TRL line scores the same samples with a batched function.

// A benchmark binary: a failed set-up is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Instant;

use rollflash_env::verify::math::Rule;
use rollflash_env::verify::python::{Call, PythonPool, PythonPoolConfig, RewardStyle};
use rollflash_env::verify::{MathVerifier, Verifier};
use serde_json::json;

const N: usize = 2000;
const SEQUENTIAL: usize = 300;

const GSM8K: &str = r#####"
import re
def extract_solution(solution_str):
    solution_str = solution_str[-300:]
    solutions = re.findall("#### (\\-?[0-9\\.\\,]+)", solution_str)
    return None if not solutions else solutions[-1].replace(",", "").replace("$", "")
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = extract_solution(solution_str)
    return 1.0 if answer == ground_truth else 0.0
def trl_correct(prompts, completions, ground_truth, **kw):
    return [1.0 if extract_solution(c) == g else 0.0 for c, g in zip(completions, ground_truth)]
"#####;

fn samples() -> Vec<(String, String)> {
    (0..N)
        .map(|i| {
            let (a, b) = (i % 97 + 3, (13 * i) % 89 + 1);
            let truth = (a * b).to_string();
            let said = if i % 2 == 0 { a * b } else { a * b + 1 };
            let response = format!(
                "First, {a} groups of {b} make {a}*{b}=<<{a}*{b}={said}>>{said} items in all, \
                 so the answer follows.\n#### {said}"
            );
            (response, truth)
        })
        .collect()
}

fn call(path: &std::path::Path, style: RewardStyle, response: &str, truth: &str) -> Call {
    let args = match style {
        RewardStyle::Verl => json!({"data_source": "openai/gsm8k", "solution_str": response,
                                    "ground_truth": truth, "extra_info": {"split": "train"}}),
        RewardStyle::Trl => json!({"prompt": "q", "completion": response,
                                   "columns": {"ground_truth": truth}}),
    };
    Call {
        path: path.to_path_buf(),
        function: match style {
            RewardStyle::Verl => "compute_score".into(),
            RewardStyle::Trl => "trl_correct".into(),
        },
        style,
        args,
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let python = std::env::args().nth(1).unwrap_or_else(|| "python3".into());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gsm8k.py");
    std::fs::write(&path, GSM8K).unwrap();
    let rows = samples();

    let v = MathVerifier::with_rules(&[Rule::Hashes]);
    let t = Instant::now();
    let right: f64 = rows.iter().map(|(r, a)| v.score(r, a).value).sum();
    let rust = t.elapsed().as_secs_f64();
    println!(
        "rust MathVerifier (####), 1 thread: {:.0} calls/s, {:.1} µs/sample, {right} right",
        N as f64 / rust,
        rust / N as f64 * 1e6
    );

    for style in [RewardStyle::Verl, RewardStyle::Trl] {
        for workers in [1, 2, 4] {
            let cfg = PythonPoolConfig {
                python: PathBuf::from(&python),
                workers,
                ..PythonPoolConfig::default()
            };
            let pool = PythonPool::start(cfg).await.unwrap();
            // Warm: the first call imports the module.
            pool.score(call(&path, style, &rows[0].0, &rows[0].1))
                .await
                .unwrap();
            let t = Instant::now();
            let scores = futures::future::join_all(
                rows.iter()
                    .map(|(r, a)| pool.score(call(&path, style, r, a))),
            )
            .await;
            let all = t.elapsed().as_secs_f64();
            let right: f64 = scores.iter().map(|s| s.as_ref().unwrap().value).sum();
            let t = Instant::now();
            for (r, a) in rows.iter().take(SEQUENTIAL) {
                pool.score(call(&path, style, r, a)).await.unwrap();
            }
            let one = t.elapsed().as_secs_f64() / SEQUENTIAL as f64;
            let calls = pool
                .stats()
                .calls
                .load(std::sync::atomic::Ordering::Relaxed);
            println!(
                "python {style:?}, {workers} worker(s): {:.0} samples/s all at once ({calls} calls), \
                 {:.0} µs/sample one at a time, {right} right",
                N as f64 / all,
                one * 1e6
            );
        }
    }
}
