//! `rollflash train` for now: supervised warm-up of the built-in policy on the built-in
//! arithmetic task, evaluated by greedy generation through the engine.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollflash_core::{PolicyVersion, RequestId};
use rollflash_model::config::ModelConfig;
use rollflash_model::engine::{Engine, EngineConfig, EngineRequest};
use rollflash_model::sampling::SamplingParams;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::{
    token_stats, AdamW, GradAccumulator, OptimizerConfig, TrainableModel,
};
use rollflash_model::weights::Weights;

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Optimizer steps of the warm-up.
    #[arg(long, default_value_t = 800)]
    steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Peak learning rate (warm-up then cosine).
    #[arg(long, default_value_t = 5e-3)]
    lr: f64,
    /// CPU threads for training and for the engine.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Seed of the model init and the data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Evaluation problems (greedy).
    #[arg(long, default_value_t = 256)]
    eval_problems: usize,
    /// Write the trained model here as a Hugging Face directory.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// One addition problem: the prompt text and the expected answer.
fn problem(rng: &mut ChaCha8Rng) -> (String, String) {
    let a: u32 = rng.random_range(0..100);
    let b: u32 = rng.random_range(0..100);
    (format!("{a}+{b}="), format!("{}", a + b))
}

fn accuracy(
    engine: &mut Engine,
    tok: &Tokenizer,
    problems: &[(String, String)],
    eos: u32,
) -> Result<f64> {
    for (i, (p, _)) in problems.iter().enumerate() {
        engine.submit(EngineRequest {
            id: RequestId(i as u64),
            prompt: tok.encode(p, false)?,
            params: SamplingParams {
                stop_token_ids: vec![eos],
                ..SamplingParams::greedy(6)
            },
            resume: None,
        })?;
    }
    let mut correct = 0;
    for c in engine.run_to_completion()? {
        let text = tok.decode(&c.output.tokens, true)?;
        if text.trim() == problems[c.id.0 as usize].1 {
            correct += 1;
        }
    }
    Ok(correct as f64 / problems.len().max(1) as f64)
}

pub fn run(a: TrainArgs) -> Result<()> {
    let tok = Tokenizer::builtin();
    let eos = tok
        .eos_token_id()
        .context("built-in tokenizer has an eos token")?;
    let cfg = ModelConfig::builtin_default(tok.vocab_size(), eos);
    println!(
        "rollflash train: built-in {:?} model, {:.2} M parameters, {} threads",
        cfg.arch,
        cfg.num_parameters() as f64 / 1e6,
        a.threads
    );
    println!("stage: supervised warm-up on the arithmetic task (the RL trainer builds on it)");
    let device = Device::Cpu;
    let init = Weights::random(&cfg, a.seed, DType::F32, &device)?;
    let model = TrainableModel::new(&cfg, &init, DType::F32, &device)?;
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed.wrapping_add(1));
    let mut eval_rng = ChaCha8Rng::seed_from_u64(a.seed.wrapping_add(2));
    let eval: Vec<(String, String)> = (0..a.eval_problems)
        .map(|_| problem(&mut eval_rng))
        .collect();
    let engine_cfg = EngineConfig {
        max_running_requests: 64,
        threads: a.threads,
        ..Default::default()
    };
    let mut engine = Engine::new(Arc::new(model.snapshot()?), PolicyVersion(0), engine_cfg)?;
    let before = accuracy(&mut engine, &tok, &eval, eos)?;
    println!("greedy accuracy before: {:.1}%", 100.0 * before);

    let mut opt = AdamW::new(OptimizerConfig {
        lr: a.lr,
        warmup_steps: a.steps / 20,
        total_steps: a.steps,
        ..Default::default()
    });
    let pool = crate::thread_pool(a.threads)?;
    let started = Instant::now();
    let mut tokens_trained = 0usize;
    for step in 0..a.steps {
        let mut seqs = Vec::with_capacity(a.batch_size);
        let mut mask = Vec::new();
        for _ in 0..a.batch_size {
            let (p, ans) = problem(&mut rng);
            let mut ids = tok.encode(&p, false)?;
            let prompt_len = ids.len();
            ids.extend(tok.encode(&ans, false)?);
            ids.push(eos);
            mask.extend((0..ids.len()).map(|i| if i >= prompt_len { 1f32 } else { 0.0 }));
            seqs.push(ids);
        }
        let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let n_loss: f32 = mask.iter().sum();
        tokens_trained += mask.len();
        let stats = pool.install(|| -> Result<_> {
            let s = token_stats(model.model(), &refs, 1.0, false)?;
            let m = Tensor::from_vec(mask.clone(), s.logprobs.dims1()?, &device)?;
            let loss = ((s.logprobs * m)?.sum_all()?.neg()? / n_loss as f64)?;
            let grads = loss.backward()?;
            let mut acc = GradAccumulator::default();
            acc.add(&model, &grads)?;
            let st = opt.step(&model, &acc)?;
            Ok((loss.to_scalar::<f32>()?, st))
        })?;
        if step % 25 == 0 || step + 1 == a.steps {
            let elapsed = started.elapsed().as_secs_f64();
            println!(
                "step {:>4}  loss {:.4}  lr {:.2e}  grad-norm {:.3}  {:.0} tok/s",
                step,
                stats.0,
                stats.1.lr,
                stats.1.grad_norm,
                tokens_trained as f64 / elapsed
            );
        }
    }
    engine.set_weights(Arc::new(model.snapshot()?), PolicyVersion(a.steps as u64));
    let after = accuracy(&mut engine, &tok, &eval, eos)?;
    println!(
        "greedy accuracy after {} steps: {:.1}% (was {:.1}%), {:.1} s",
        a.steps,
        100.0 * after,
        100.0 * before,
        started.elapsed().as_secs_f64()
    );
    if let Some(dir) = &a.out {
        rollflash_model::hf::save_dir(dir, &cfg, &model.weights(), Some(&tok))?;
        println!("saved {}", dir.display());
    }
    Ok(())
}
