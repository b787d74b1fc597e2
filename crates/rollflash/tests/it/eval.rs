//! `rollflash eval` as a process: a checkpoint's success rate on the shipped agentic config,
//! and a run's periodic evaluation equal to `rollflash eval` of the checkpoint of its step.
//! The shipped config's own checks and its warm-up's demonstrations are `rollflash-run`'s
//! (`agentic.rs`).

use std::process::Command;

use candle_core::{DType, Device};
use rollflash_model::config::ModelConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;

use crate::tiny_run::frozenlake_toml;

#[test]
fn eval_prints_the_success_rate_of_a_checkpoint() {
    let stdout = eval_random_lake(&["--problems", "3", "--set", "rollout.max_turns=2"]);
    // A random policy almost never reaches the goal in two moves; the line is what matters.
    assert!(
        stdout.contains("on `frozen_lake`: success rate ") && stdout.contains("of 3 tasks"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("sampled pass@1"),
        "greedy only by default: {stdout}"
    );
}

/// `--samples K`: sampled pass@1 beside greedy, each with its standard error; the greedy
/// one is the binomial `sqrt(p (1 - p) / n)` of the printed rate.
#[test]
fn eval_samples_adds_sampled_pass_at_1_with_standard_errors() {
    let stdout = eval_random_lake(&[
        "--problems",
        "4",
        "--samples",
        "3",
        "--set",
        "rollout.max_turns=2",
        "--set",
        "rollout.temperature=0.5",
    ]);
    assert!(
        stdout.contains("sampled pass@1 ") && stdout.contains("(3 per task, T=0.5)"),
        "{stdout}"
    );
    let rate: f64 = field(&stdout, "success rate ");
    let se: f64 = field(&stdout, &format!("success rate {rate:.3} ± "));
    let want = (rate * (1.0 - rate) / 4.0).sqrt();
    assert!(
        (se - want).abs() < 6e-4,
        "se {se}, binomial {want}: {stdout}"
    );
}

/// `rollflash eval` of the built-in model with seeded random weights on the shipped agentic
/// config with `args`; its standard output, after checking that it succeeded.
fn eval_random_lake(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let tok = Tokenizer::builtin();
    let cfg = ModelConfig::builtin_default(tok.vocab_size(), tok.eos_token_id().unwrap());
    let w = Weights::random(&cfg, 1, DType::F32, &Device::Cpu).unwrap();
    rollflash_model::hf::save_dir(dir.path(), &cfg, &w, Some(&tok)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args(["eval", "--checkpoint"])
        .arg(dir.path())
        .arg("--config")
        .arg(frozenlake_toml())
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "stdout {stdout}\nstderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The number after `prefix` in `text`.
fn field(text: &str, prefix: &str) -> f64 {
    let rest = &text[text.find(prefix).unwrap() + prefix.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().unwrap()
}

/// `train.eval_every`: the periodic evaluation on its own engine reports what `rollflash
/// eval` of the checkpoint written at the same step reports (greedy, the same held-out tasks),
/// and none at the last step (the evaluation after RL covers it).
#[test]
fn the_periodic_evaluation_equals_eval_of_the_checkpoint_of_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut sets = crate::tiny_run::tiny_lake_sets(dir.path());
    sets.extend([
        "warmup.steps=0".to_string(),
        // The random policy's greedy moves are invalid at every version here (mean reward
        // -0.2), so this checks where the numbers go and that both paths agree, not that the
        // probe serves the newest version rather than an older one.
        "train.steps=4".into(),
        "train.eval_problems=6".into(),
        "train.eval_samples=0".into(),
        "train.eval_every=2".into(),
        "checkpoint.every=2".into(),
        "checkpoint.keep=4".into(),
        "metrics.report=false".into(),
    ]);
    let set_args: Vec<String> = sets
        .iter()
        .flat_map(|s| ["--set".into(), s.clone()])
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .arg("train")
        .args(&set_args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "train failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rollflash_run::metrics::read(&dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(rows.len(), 4);
    for (i, row) in rows.iter().enumerate() {
        // Step index 1 published policy 2; the last step's policy is evaluated after RL.
        assert_eq!(row.get("eval_greedy").is_some(), i == 1, "row {i}: {row}");
    }
    let periodic = rows[1]["eval_mean_reward"].as_f64().unwrap();
    let greedy = rows[1]["eval_greedy"].as_f64().unwrap();
    let ckpt = dir.path().join("checkpoints/step-00000002");
    let out = Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args(["eval", "--checkpoint"])
        .arg(&ckpt)
        .args(["--problems", "6"])
        .args(&set_args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "eval failed: {stdout}");
    assert!(
        stdout.contains(&format!("success rate {greedy:.3}"))
            && stdout.contains(&format!("mean reward {periodic:.3}")),
        "periodic evaluation: success {greedy}, mean reward {periodic}; rollflash eval: {stdout}"
    );
}
