//! Regression: a built-in policy cached as a Hugging Face directory (the warm-up cache,
//! `output_dir/warmup-<key>/`) scored 0 when loaded back as `model.path`. The pin: the
//! built-in model after a training step, saved with its tokenizer by `hf::save_dir` and
//! loaded with `hf::load_dir`, has the same config, token ids, special tokens, logits and
//! greedy generations as the in-memory one — so a loaded copy can only differ in how prompts
//! are rendered, never in the model.

use std::error::Error;
use std::sync::Arc;

use candle_core::{DType, Device};
use rollflash_core::{PolicyVersion, RequestId};
use rollflash_model::config::ModelConfig;
use rollflash_model::engine::{Engine, EngineConfig, EngineRequest};
use rollflash_model::hf::{load_dir, save_dir};
use rollflash_model::model::Transformer;
use rollflash_model::sampling::SamplingParams;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::{
    token_stats, AdamW, GradAccumulator, OptimizerConfig, TrainableModel,
};

use crate::common::sharp_weights;

type TestResult = Result<(), Box<dyn Error>>;

/// Prompts in the math task's format, as the environment manager and `generate` see them.
const PROMPTS: [&str; 3] = [
    "Q: 12+7+30\nA: ",
    "Q: 7*3+12+5\nA: ",
    "Q: 99+1\nA: 99+1=100 #### 100",
];

/// The prompt as the environment manager builds it: `<bos>`, then the text without specials.
fn env_prompt(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, Box<dyn Error>> {
    let mut ids: Vec<u32> = tok.bos_token_id().into_iter().collect();
    ids.extend(tok.encode(text, false)?);
    Ok(ids)
}

/// Greedy continuations of every prompt, stopping at `eos`.
fn greedy(
    model: Transformer,
    prompts: &[Vec<u32>],
    eos: u32,
) -> Result<Vec<Vec<u32>>, Box<dyn Error>> {
    let mut engine = Engine::new(Arc::new(model), PolicyVersion(0), EngineConfig::default())?;
    for (i, prompt) in prompts.iter().enumerate() {
        engine.submit(EngineRequest {
            id: RequestId(i as u64),
            prompt: prompt.clone(),
            params: SamplingParams {
                temperature: 0.0,
                max_new_tokens: 24,
                stop_token_ids: vec![eos],
                ..Default::default()
            },
            resume: None,
        })?;
    }
    let mut done = engine.run_to_completion()?;
    done.sort_by_key(|c| c.id.0);
    Ok(done.into_iter().map(|c| c.output.tokens).collect())
}

#[test]
fn builtin_model_saved_as_hf_dir_reloads_identically() -> TestResult {
    let device = Device::Cpu;
    let tok = Tokenizer::builtin();
    let eos = tok.eos_token_id().ok_or("built-in tokenizer has no eos")?;
    let cfg = ModelConfig::builtin_default(tok.vocab_size(), eos);
    let weights = sharp_weights(&cfg, 11, 10.0, DType::F32);

    // One optimizer step, so the saved tensors are the trainable variables' updated values
    // (the warm-up caches `TrainableModel::weights()`), tied embedding included.
    let trainable = TrainableModel::new(&cfg, &weights, DType::F32, &device)?;
    let seq = env_prompt(&tok, PROMPTS[2])?;
    let stats = token_stats(trainable.model(), &[seq.as_slice()], 1.0, false)?;
    let loss = stats.logprobs.sum_all()?.neg()?;
    let mut acc = GradAccumulator::default();
    acc.add(&trainable, &loss.backward()?)?;
    let mut opt = AdamW::new(OptimizerConfig {
        lr: 1e-2,
        ..Default::default()
    });
    opt.step(&trainable, &acc)?;
    let in_memory = trainable.snapshot()?;

    let dir = tempfile::tempdir()?;
    save_dir(dir.path(), &cfg, &trainable.weights(), Some(&tok))?;
    let loaded = load_dir(dir.path(), DType::F32, &device)?;
    let loaded_tok = loaded.tokenizer.ok_or("saved directory has no tokenizer")?;

    assert_eq!(loaded.config, cfg);
    assert_eq!(
        (
            loaded_tok.bos_token_id(),
            loaded_tok.eos_token_id(),
            loaded_tok.pad_token_id(),
            loaded_tok.vocab_size()
        ),
        (
            tok.bos_token_id(),
            tok.eos_token_id(),
            tok.pad_token_id(),
            tok.vocab_size()
        )
    );
    for text in PROMPTS {
        for special in [false, true] {
            assert_eq!(
                loaded_tok.encode(text, special)?,
                tok.encode(text, special)?,
                "{text:?}, add_special_tokens = {special}"
            );
        }
        // A plain-text prompt encoded the Hugging Face way (`add_special_tokens=True`) is the
        // prompt the environment manager builds.
        assert_eq!(
            loaded_tok.encode(text, true)?,
            env_prompt(&loaded_tok, text)?
        );
    }

    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| env_prompt(&tok, p))
        .collect::<Result<_, _>>()?;
    for prompt in &prompts {
        let a = in_memory.forward_logits(prompt)?;
        let b = loaded.model.forward_logits(prompt)?;
        let diff = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff == 0.0, "logits differ by {diff}");
    }

    let want = greedy(in_memory, &prompts, eos)?;
    let got = greedy(loaded.model, &prompts, eos)?;
    assert_eq!(got, want);
    assert!(want.iter().all(|g| !g.is_empty()));
    Ok(())
}
