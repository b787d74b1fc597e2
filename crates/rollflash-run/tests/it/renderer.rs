//! The renderer a run picks for its model (`stack::renderer`): a saved built-in model renders
//! plain under `auto`, and `chat` still gets its chat template.

use candle_core::{DType, Device};
use rollflash_model::config::ModelConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;
use rollflash_run::config::TrainConfig;

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
