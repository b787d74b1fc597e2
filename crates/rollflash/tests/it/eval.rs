//! `rollflash eval` as a process, and the shipped agentic config.

use std::path::PathBuf;
use std::process::Command;

use candle_core::{DType, Device};
use rollflash::config::TrainConfig;
use rollflash_model::config::ModelConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;

fn frozenlake_toml() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs/frozenlake.toml")
}

#[test]
fn the_shipped_frozenlake_config_parses_and_is_multi_turn() {
    let c = TrainConfig::load(Some(&frozenlake_toml()), &[]).unwrap();
    assert_eq!(c.env.name(), "frozen_lake");
    assert!(c.rollout.max_turns > 1);
    assert!(
        c.warmup.steps > 0,
        "the tiny model needs the move format first"
    );
    assert_eq!(
        rollflash::pipeline::success_threshold(&c.env.env),
        1.0,
        "reaching the goal is a success"
    );
}

#[test]
fn eval_prints_the_success_rate_of_a_checkpoint() {
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
        .args(["--problems", "3", "--set", "rollout.max_turns=2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout {stdout}\nstderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A random policy almost never reaches the goal in two moves; the line is what matters.
    assert!(
        stdout.contains("on `frozen_lake`: success rate ") && stdout.contains("of 3 tasks"),
        "{stdout}"
    );
}
