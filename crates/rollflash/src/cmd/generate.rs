//! `rollflash generate`: one prompt through the engine, for trying a model by hand.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use rollflash_core::{PolicyVersion, RequestId};
use rollflash_model::chat::{ChatMessage, ChatTemplate};
use rollflash_model::engine::{Engine, EngineConfig, EngineRequest};
use rollflash_model::sampling::SamplingParams;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// A Hugging Face model directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[command(flatten)]
    placement: super::PlacementArgs,
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let placement = a.placement.open()?;
    let loaded = rollflash_model::hf::load_dir(&a.model, placement.dtype, &placement.device)
        .with_context(|| format!("loading model from {}", a.model.display()))?;
    let tok = loaded
        .tokenizer
        .with_context(|| format!("{} has no tokenizer.json", a.model.display()))?;
    let text = if a.chat {
        let template = match loaded.chat_template {
            Some(t) => t,
            None => ChatTemplate::builtin()?,
        };
        template.render(&[ChatMessage::user(a.prompt.clone())], true)?
    } else {
        a.prompt.clone()
    };
    // Plain text gets the tokenizer's special tokens (a leading `<bos>` where it has one), as
    // transformers' `add_special_tokens=True` does and as training prompts start; a rendered
    // chat template already contains its own.
    let prompt = tok.encode(&text, !a.chat)?;
    let stop = loaded.config.stop_tokens(Some(&tok));
    let mut engine = Engine::new(
        Arc::new(loaded.model),
        PolicyVersion(0),
        EngineConfig {
            threads: a.threads,
            ..Default::default()
        },
    )?;
    engine.submit(EngineRequest {
        id: RequestId(0),
        prompt: prompt.clone(),
        params: SamplingParams {
            temperature: a.temperature,
            top_p: a.top_p,
            top_k: a.top_k,
            max_new_tokens: a.max_new_tokens,
            stop_token_ids: stop,
            seed: Some(a.seed),
        },
        resume: None,
    })?;
    let t0 = Instant::now();
    let done = engine.run_to_completion()?;
    let c = done.first().context("the engine returned no completion")?;
    println!("{}", tok.decode(&c.output.tokens, true)?);
    let mean_lp =
        c.output.logprobs.iter().map(|&x| x as f64).sum::<f64>() / c.output.len().max(1) as f64;
    eprintln!(
        "[{} prompt tokens, {} generated, finish {:?}, mean log-prob {:.3}, {:.1} tok/s]",
        prompt.len(),
        c.output.len(),
        c.finish_reason,
        mean_lp,
        c.output.len() as f64 / t0.elapsed().as_secs_f64()
    );
    Ok(())
}
