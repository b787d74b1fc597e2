//! `rollflash bench-engine`: decode and prefill throughput at several batch sizes and training
//! throughput, for the built-in default model or a Hugging Face directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use rollflash_core::{PolicyVersion, RequestId};
use rollflash_model::config::ModelConfig;
use rollflash_model::engine::{Engine, EngineConfig, EngineRequest};
use rollflash_model::sampling::SamplingParams;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::{
    token_stats, AdamW, GradAccumulator, OptimizerConfig, TrainableModel,
};
use rollflash_model::weights::Weights;

/// Timing of the repeated prefill: at least this many runs, then more until this much time
/// was spent in them, at most the maximum (the same rule as `scripts/bench_torch.py`'s).
const PREFILL_MIN_RUNS: usize = 3;
const PREFILL_SECS: f64 = 0.5;
const PREFILL_MAX_RUNS: usize = 2000;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A Hugging Face directory; the built-in default model (random weights) when absent.
    #[arg(long)]
    model: Option<PathBuf>,
    /// With `--model`: read only the directory's `config.json` and measure seeded random
    /// weights of its shapes (N(0, 0.02²), seed 0, as `Weights::random`): a real model's speed
    /// needs its shapes, not its weights, which a lent GPU machine cannot be sent.
    #[arg(long, requires = "model")]
    random_weights: bool,
    /// Decode batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    batch: Vec<usize>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 32)]
    prompt_len: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Training batch: sequences × length.
    #[arg(long, default_value_t = 16)]
    train_seqs: usize,
    #[arg(long, default_value_t = 128)]
    train_len: usize,
    /// Timed training steps (after one untimed warm-up step).
    #[arg(long, default_value_t = 3)]
    train_steps: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Train LoRA adapters of this rank (alpha = 2 × rank, all seven projections) on the
    /// frozen weights instead of every weight; 0 = full fine-tuning.
    #[arg(long, default_value_t = 0)]
    lora_rank: usize,
    /// Skip the decode measurements (training only).
    #[arg(long)]
    no_decode: bool,
    /// Before training, write the training forward's per-token log-probs of the training
    /// sequences (a JSON array) to this file: `scripts/device_check.sh` compares a GPU's
    /// with the CPU's.
    #[arg(long)]
    logprobs_out: Option<std::path::PathBuf>,
    /// With `--logprobs-out`: write them and stop (no training steps).
    #[arg(long, requires = "logprobs_out")]
    logprobs_only: bool,
    #[command(flatten)]
    placement: super::PlacementArgs,
}

pub fn run(a: BenchArgs) -> Result<()> {
    let placement = a.placement.open()?;
    let (device, dtype) = (placement.device, placement.dtype);
    let (cfg, weights, name) = match &a.model {
        Some(dir) if a.random_weights => {
            let cfg = rollflash_model::hf::load_config(dir)?;
            let w = Weights::random(&cfg, 0, dtype, &device)?;
            (
                cfg,
                w,
                format!("{} (its shapes, random weights)", dir.display()),
            )
        }
        Some(dir) => {
            let cfg = rollflash_model::hf::load_config(dir)?;
            let w = rollflash_model::hf::load_weights(dir, &device)?;
            (cfg, w, dir.display().to_string())
        }
        None => {
            let tok = Tokenizer::builtin();
            let cfg = ModelConfig::builtin_default(tok.vocab_size(), 1);
            let w = Weights::random(&cfg, 0, dtype, &device)?;
            (cfg, w, "built-in default".to_string())
        }
    };
    println!(
        "model: {name} ({:?}, {:.1} M params), threads: {}, cpu kernels: {}",
        cfg.arch,
        cfg.num_parameters() as f64 / 1e6,
        a.threads,
        rollflash_model::cpu_kernels()
    );
    let model = Arc::new(rollflash_model::model::Transformer::from_weights(
        &cfg, &weights, dtype, &device,
    )?);
    let vocab = cfg.vocab_size as u32;
    bench_decode(&a, &model, vocab)?;

    drop(model);
    let trainable = trainable_model(a.lora_rank, &cfg, &weights, dtype, &device)?;
    // The caller's copy is not needed once the trainable model holds its own.
    drop(weights);
    bench_train(&a, trainable, vocab)
}

/// Decode and prefill throughput at each `--batch` size (none with `--no-decode`), on
/// engines serving `model`.
fn bench_decode(
    a: &BenchArgs,
    model: &Arc<rollflash_model::model::Transformer>,
    vocab: u32,
) -> Result<()> {
    let new_engine = |b: usize| -> Result<Engine> {
        Ok(Engine::new(
            Arc::clone(model),
            PolicyVersion(0),
            EngineConfig {
                max_running_requests: b,
                max_prefill_tokens: usize::MAX,
                threads: a.threads,
            },
        )?)
    };
    // Submits `b` requests of `new_tokens` each.
    let submit = |e: &mut Engine, b: usize, new_tokens: usize| -> Result<()> {
        for i in 0..b {
            e.submit(EngineRequest {
                id: RequestId(i as u64),
                prompt: (0..a.prompt_len)
                    .map(|j| ((i * 31 + j * 7) as u32 % (vocab - 1)) + 1)
                    .collect(),
                params: SamplingParams {
                    max_new_tokens: new_tokens,
                    seed: Some(i as u64),
                    ..Default::default()
                },
                resume: None,
            })?;
        }
        Ok(())
    };
    let mut base = None;
    let batches: &[usize] = if a.no_decode { &[] } else { &a.batch };
    for &b in batches {
        let mut e = new_engine(b)?;
        submit(&mut e, b, a.new_tokens)?;
        // The first step prefills every prompt; time decode steps separately.
        let t0 = Instant::now();
        let first = e.step()?;
        let prefill = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut decoded = 0usize;
        while !e.is_idle() {
            decoded += e.step()?.new_tokens.len();
        }
        let dt = t1.elapsed().as_secs_f64();
        let tps = decoded as f64 / dt;
        let ratio = match base {
            None => {
                base = Some(tps);
                1.0
            }
            Some(b1) => tps / b1,
        };
        println!(
            "decode batch {b:>3}: {tps:>9.1} tok/s ({ratio:.1}x batch {}), prefill {} tok in {prefill:.3} s",
            a.batch[0], first.forward_tokens
        );
        // Prefill alone (requests of one token: prefill and the first sample), repeated on the
        // same engine until it has run for PREFILL_SECS: one prefill of a tiny model takes
        // about a millisecond, too short to time once.
        let (mut runs, mut spent, mut tokens) = (0usize, 0f64, 0usize);
        while runs < PREFILL_MIN_RUNS || (spent < PREFILL_SECS && runs < PREFILL_MAX_RUNS) {
            submit(&mut e, b, 1)?;
            let t = Instant::now();
            tokens += e.step()?.forward_tokens;
            spent += t.elapsed().as_secs_f64();
            runs += 1;
            if !e.is_idle() {
                anyhow::bail!("a one-token request outlived its prefill step");
            }
        }
        println!(
            "prefill batch {b:>3}: {:>9.1} tok/s over {runs} runs of {} tokens",
            tokens as f64 / spent,
            tokens / runs
        );
    }
    Ok(())
}

/// The model `--lora-rank` trains: every weight (0), or LoRA adapters on frozen `weights`.
fn trainable_model(
    lora_rank: usize,
    cfg: &ModelConfig,
    weights: &Weights,
    dtype: candle_core::DType,
    device: &candle_core::Device,
) -> Result<TrainableModel> {
    Ok(match lora_rank {
        0 => TrainableModel::new(cfg, weights, dtype, device)?,
        r => {
            let lora = rollflash_model::lora::LoraConfig {
                rank: r,
                alpha: 2.0 * r as f64,
                ..Default::default()
            };
            TrainableModel::with_lora(cfg, weights, &lora, None, 0, dtype, device)?
        }
    })
}

/// Training throughput and memory: `--train-steps` timed steps (forward, backward, AdamW)
/// of `trainable` after an untimed one; first the log-probs to `--logprobs-out`, if asked.
fn bench_train(a: &BenchArgs, trainable: TrainableModel, vocab: u32) -> Result<()> {
    let trained: usize = trainable
        .vars()
        .iter()
        .map(|(_, v)| v.as_tensor().elem_count())
        .sum();
    let mut opt = AdamW::new(OptimizerConfig::default());
    let seqs: Vec<Vec<u32>> = (0..a.train_seqs)
        .map(|i| {
            (0..a.train_len)
                .map(|j| ((i * 13 + j * 5) as u32 % (vocab - 1)) + 1)
                .collect()
        })
        .collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let pool = crate::thread_pool(a.threads)?;
    if let Some(path) = &a.logprobs_out {
        let lp = pool.install(|| token_stats(trainable.model(), &refs, 1.0, false))?;
        let values: Vec<f32> = lp
            .logprobs
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1()?;
        std::fs::write(path, serde_json::to_string(&values)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!(
            "log-probs of {} tokens written to {}",
            values.len(),
            path.display()
        );
        if a.logprobs_only {
            return Ok(());
        }
    }
    let mut step = || -> Result<()> {
        pool.install(|| -> Result<()> {
            let s = token_stats(trainable.model(), &refs, 1.0, false)?;
            let loss = s.logprobs.sum_all()?.neg()?;
            let mut acc = GradAccumulator::default();
            acc.add(&trainable, &loss.backward()?)?;
            opt.step(&trainable, &acc)?;
            Ok(())
        })
    };
    // Memory of training itself: the resident set before the first step, and the peak over
    // the steps (the high-water mark reset first, where Linux allows it).
    let before = rss("VmRSS:");
    reset_peak_rss();
    step()?;
    let t0 = Instant::now();
    for _ in 0..a.train_steps {
        step()?;
    }
    let dt = t0.elapsed().as_secs_f64() / a.train_steps.max(1) as f64;
    let toks = a.train_seqs * a.train_len;
    println!(
        "train step ({} x {} tokens, forward+backward+AdamW, {}: {:.2} M trained params): \
         {:.3} s, {:.0} tok/s; resident {} before the first step, peak {} over the steps",
        a.train_seqs,
        a.train_len,
        match a.lora_rank {
            0 => "full fine-tuning".to_string(),
            r => format!("LoRA rank {r}"),
        },
        trained as f64 / 1e6,
        dt,
        toks as f64 / dt,
        mib(before),
        mib(rss("VmHWM:")),
    );
    Ok(())
}

/// A field of `/proc/self/status` in KiB (`VmRSS:` now, `VmHWM:` the peak), on Linux.
fn rss(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resets the peak resident set to the current one (Linux `clear_refs` value 5); best effort.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn mib(kb: Option<u64>) -> String {
    kb.map_or("unknown".into(), |kb| {
        format!("{:.0} MiB", kb as f64 / 1024.0)
    })
}
