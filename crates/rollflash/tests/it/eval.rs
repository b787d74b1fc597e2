//! `rollflash eval` as a process, and the shipped agentic config.

use std::path::PathBuf;
use std::process::Command;

use candle_core::{DType, Device};
use rollflash_model::config::ModelConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;
use rollflash_run::config::TrainConfig;

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
        rollflash_run::eval::success_threshold(&c.env.spec().expect("built-in").env),
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

/// The agentic warm-up's demonstrations: optimal play always reaches the goal of a solvable
/// lake; with `random_move_prob` some moves are random, so some episodes end elsewhere —
/// the same seeds, so the difference is the noise alone.
#[tokio::test]
async fn noisy_demonstrations_leave_the_optimal_path_some_of_the_time() {
    use rollflash_run::agentic_warmup::demonstration;
    let c = TrainConfig::load(Some(&frozenlake_toml()), &[]).unwrap();
    let Some(rollflash_env::envs::EnvConfig::FrozenLake(lake)) = c.env.spec().map(|s| &s.env)
    else {
        panic!("frozen lake config");
    };
    let tok = Tokenizer::builtin();
    let (mut optimal_ok, mut noisy_ok, mut differ) = (0, 0, 0);
    for seed in 0..40u64 {
        let a = demonstration(lake, &tok, seed, 10, 2000, 0.0)
            .await
            .unwrap();
        let b = demonstration(lake, &tok, seed, 10, 2000, 0.4)
            .await
            .unwrap();
        assert!(a.mask.contains(&1.0), "moves are trained on");
        assert_eq!(a.mask.len(), a.ids.len());
        optimal_ok += usize::from(a.reward == 1.0);
        noisy_ok += usize::from(b.reward == 1.0);
        differ += usize::from(a.ids != b.ids);
        let again = demonstration(lake, &tok, seed, 10, 2000, 0.4)
            .await
            .unwrap();
        assert_eq!(b, again, "reproducible from the seed");
    }
    assert_eq!(
        optimal_ok, 40,
        "random maps are solvable and BFS play solves them"
    );
    assert!(differ >= 20, "{differ} of 40 noisy demonstrations differ");
    assert!(noisy_ok < 40, "some noisy demonstrations fail: {noisy_ok}");
}

/// A directory saved from the built-in model (a warm-up cache, a checkpoint) carries the
/// built-in chat template, but the model learnt plain renderings: `auto` must render plain
/// (it picked the chat template before, so `model.path = <warm-up dir>` needed
/// `rollout.renderer = "plain"`); `chat` still gets the template.
#[test]
fn auto_renders_a_saved_builtin_model_plain() {
    let dir = tempfile::tempdir().unwrap();
    let tok = Tokenizer::builtin();
    let cfg = ModelConfig::builtin_default(tok.vocab_size(), tok.eos_token_id().unwrap());
    let w = Weights::random(&cfg, 1, DType::F32, &Device::Cpu).unwrap();
    rollflash_model::hf::save_dir(dir.path(), &cfg, &w, Some(&tok)).unwrap();
    let auto = TrainConfig::load(None, &[]).unwrap();
    let r = rollflash_run::stack::renderer(auto.rollout.renderer, Some(dir.path())).unwrap();
    assert!(matches!(r, rollflash_rollout::Renderer::Plain { .. }));
    let chat = TrainConfig::load(None, &["rollout.renderer=\"chat\"".to_string()]).unwrap();
    let r = rollflash_run::stack::renderer(chat.rollout.renderer, Some(dir.path())).unwrap();
    assert!(matches!(r, rollflash_rollout::Renderer::Chat { .. }));
}

/// `train.eval_every`: the periodic evaluation on its own engine reports what `rollflash
/// eval` of the checkpoint written at the same step reports (greedy, the same held-out tasks),
/// and none at the last step (the evaluation after RL covers it).
#[test]
fn the_periodic_evaluation_equals_eval_of_the_checkpoint_of_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut sets = crate::util::tiny_lake_sets(dir.path());
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
