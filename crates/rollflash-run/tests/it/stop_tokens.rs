//! One stop-token rule for every command: a model directory whose chat turns end in an id
//! other than the tokenizer's end-of-sequence token (Llama-3-Instruct's `<|eot_id|>` layout:
//! `config.json` lists one id, `generation_config.json` several) stops training rollouts,
//! evaluation and `serve`/`generate` on all of them. Before, `train` stopped on the
//! tokenizer's id alone and generated past the end of such a model's turn.

use candle_core::{DType, Device};
use rollflash_core::PolicyVersion;
use rollflash_model::config::ModelConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;
use rollflash_run::config::TrainConfig;
use rollflash_run::plan::RunPlan;
use rollflash_run::stack::{Policy, Stack};

/// The turn-end id of the layout (a token of the built-in vocabulary that is not its eos).
const EOT: u32 = 7;

/// The built-in model saved as a Hugging Face directory whose `generation_config.json` adds
/// [`EOT`] to `config.json`'s end-of-sequence id.
fn eot_model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let tok = Tokenizer::builtin();
    let eos = tok.eos_token_id().unwrap();
    assert_ne!(eos, EOT);
    let cfg = ModelConfig::builtin_default(tok.vocab_size(), eos);
    let w = Weights::random(&cfg, 3, DType::F32, &Device::Cpu).unwrap();
    rollflash_model::hf::save_dir(dir.path(), &cfg, &w, Some(&tok)).unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        format!(r#"{{"bos_token_id": 1, "eos_token_id": [{eos}, {EOT}], "do_sample": true}}"#),
    )
    .unwrap();
    dir
}

#[test]
fn the_model_lists_every_stop_id_once_tokenizer_eos_included() {
    let dir = eot_model_dir();
    let cfg = rollflash_model::hf::load_config(dir.path()).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let eos = tok.eos_token_id().unwrap();
    assert_eq!(cfg.stop_tokens(Some(&tok)), vec![eos, EOT]);
    // What `serve` and `generate` ask (the same function, over `hf::load_dir`).
    let loaded = rollflash_model::hf::load_dir(dir.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(
        loaded.config.stop_tokens(loaded.tokenizer.as_ref()),
        vec![eos, EOT]
    );
}

#[tokio::test]
async fn training_and_evaluation_rollouts_stop_on_the_turn_end_id() {
    let dir = eot_model_dir();
    let cfg = TrainConfig::load(
        None,
        &[
            format!("model.path = {:?}", dir.path().display().to_string()),
            "warmup.steps = 0".to_string(),
        ],
    )
    .unwrap();
    let plan = RunPlan::new(cfg).unwrap();
    let policy = Policy::load(&plan).unwrap();
    assert!(policy.stop_tokens().contains(&EOT));
    let model = policy.trainable(&plan).unwrap();
    let stack = Stack::build(&plan, &policy, &model, PolicyVersion(0)).unwrap();
    for (what, envs) in [("training", &stack.envs), ("evaluation", &stack.eval_envs)] {
        let stop = &envs.config().sampling.stop_token_ids;
        assert!(
            stop.contains(&EOT),
            "{what} rollouts stop on {stop:?}, not on the model's turn end {EOT}"
        );
    }
    stack.proxy.shutdown().await.unwrap();
}
