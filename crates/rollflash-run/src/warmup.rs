//! The supervised warm-up stage: next-token training on a task's worked solutions before
//! RL, and the key under which its result is cached.

use std::time::Instant;

use rollflash_env::math_task::MathTask;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::{AdamW, OptimizerConfig, TrainableModel};

use crate::plan::WarmupSettings;

/// Why a warm-up stopped.
#[derive(Debug, thiserror::Error)]
pub enum WarmupError {
    #[error("warm-up: the tokenizer has no end-of-sequence token")]
    NoEos,
    #[error("warm-up")]
    Model(#[from] rollflash_model::ModelError),
    #[error("warm-up")]
    Step(#[from] rollflash_trainer::LearnerError),
    #[error("warm-up: thread pool")]
    ThreadPool(#[from] rayon::ThreadPoolBuildError),
    #[error("warm-up: environment")]
    Env(#[from] rollflash_env::EnvError),
    #[error("warm-up: math task")]
    Task(#[from] rollflash_env::math_task::MathTaskError),
    /// A stop was asked for between two steps.
    #[error("interrupted during the warm-up")]
    Interrupted,
}

/// Supervised warm-up on the task's worked solutions: next-token loss on the completion
/// (and its end-of-sequence token), in the exact format the environment manager renders.
pub async fn run(
    model: &TrainableModel,
    tok: &Tokenizer,
    task: &MathTask,
    settings: &WarmupSettings,
    stop: &rollflash_trainer::StopFlag,
) -> Result<(), WarmupError> {
    let w = &settings.section;
    let seed = settings.seed;
    let eos = tok.eos_token_id().ok_or_else(|| WarmupError::NoEos)?;
    let what = format!("{} worked solutions", w.batch_size);
    let make = |step: usize| -> Result<(Vec<Vec<u32>>, Vec<f32>), WarmupError> {
        let mut examples = task.warmup_examples(w.batch_size, seed.wrapping_add(step as u64));
        for (i, (_, c)) in examples.iter_mut().enumerate() {
            if unit_hash(seed, step as u64, i as u64) < w.unmarked_fraction {
                *c = unmarked(c).to_string();
            }
        }
        let mut seqs = Vec::with_capacity(examples.len());
        let mut mask = Vec::new();
        for (p, c) in &examples {
            let mut ids: Vec<u32> = tok.bos_token_id().into_iter().collect();
            ids.extend(tok.encode(p, false)?);
            let prompt_len = ids.len();
            ids.extend(tok.encode(c, false)?);
            ids.push(eos);
            mask.extend((0..ids.len()).map(|i| if i >= prompt_len { 1f32 } else { 0.0 }));
            seqs.push(ids);
        }
        Ok((seqs, mask))
    };
    sft_loop(model, settings, &what, stop, |step| {
        std::future::ready(make(step))
    })
    .await
}

/// The one supervised loop of both warm-ups: `section.steps` AdamW steps (learning rate
/// `section.lr`, linear warm-up over the first 5%) of next-token loss on the batches
/// `batch(step)` makes — token sequences and a loss mask over their concatenation — on all
/// the run's threads, with a progress bar and a line every 50 steps. Stops between steps
/// when `stop` is set.
pub(crate) async fn sft_loop<F, Fut>(
    model: &TrainableModel,
    settings: &WarmupSettings,
    what: &str,
    stop: &rollflash_trainer::StopFlag,
    mut batch: F,
) -> Result<(), WarmupError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<Vec<u32>>, Vec<f32>), WarmupError>>,
{
    let w = &settings.section;
    let device = model.model().device().clone();
    let mut opt = AdamW::new(OptimizerConfig {
        lr: w.lr,
        warmup_steps: w.steps / 20,
        total_steps: w.steps,
        ..Default::default()
    });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(settings.threads.max(1))
        .build()?;
    let started = Instant::now();
    crate::progress::println(format!("warm-up: {} supervised steps of {what}", w.steps));
    let bar = crate::progress::PhaseBar::new("warm-up", w.steps as u64, "steps");
    for step in 0..w.steps {
        if stop.is_stopped() {
            return Err(WarmupError::Interrupted);
        }
        let (seqs, mask) = batch(step).await?;
        let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let loss = tokio::task::block_in_place(|| {
            pool.install(|| {
                rollflash_trainer::supervised_step(model, &mut opt, &refs, &mask, &device)
            })
        })?;
        bar.inc();
        if step % 50 == 0 || step + 1 == w.steps {
            crate::progress::println(format!(
                "warm-up step {step:>4}  loss {loss:.4}  {:.0}s",
                started.elapsed().as_secs_f64()
            ));
        }
    }
    Ok(())
}

/// Identifies a warm-up result: same seed, warm-up settings, task, model source and
/// rollflash version. (Where the result is kept is not part of it; nor is the arithmetic of
/// this build, which [`numerics_fingerprint`] checks when the result is reused.)
pub fn cache_key(
    settings: &WarmupSettings,
    env: Option<&rollflash_env::envs::EnvConfig>,
    model_path: Option<&std::path::PathBuf>,
) -> u64 {
    let mut w = settings.section.clone();
    w.cache_dir = None;
    let text = format!(
        "{}|{}|{:?}|{}|{:?}",
        env!("CARGO_PKG_VERSION"),
        settings.seed,
        w,
        serde_json::to_string(&env).unwrap_or_default(),
        model_path
    );
    let mut h = Fnv::new();
    h.bytes(text.as_bytes());
    h.0
}

/// A fingerprint of this build's arithmetic on this machine: the bits of the loss and of
/// every weight after one supervised AdamW step from `model`'s weights (copied; `model` is
/// not changed) on a fixed sequence. A cached warm-up is reused only under the same
/// fingerprint: a build whose kernels, initialisation or optimizer round differently (another
/// version of the code, AVX2 instead of AVX-512) would not have produced it.
pub fn numerics_fingerprint(
    model: &TrainableModel,
    model_cfg: &rollflash_model::config::ModelConfig,
) -> Result<u64, WarmupError> {
    let device = model.model().device().clone();
    let dtype = model.model().dtype();
    let copy = TrainableModel::new(model_cfg, &model.weights(), dtype, &device)?;
    let vocab = model_cfg.vocab_size.max(1) as u32;
    let seq: Vec<u32> = (0..24u32).map(|i| (i * 7 + 3) % vocab).collect();
    let mask: Vec<f32> = (0..seq.len())
        .map(|i| if i > 0 { 1.0 } else { 0.0 })
        .collect();
    let mut opt = AdamW::new(OptimizerConfig {
        lr: 1e-3,
        ..Default::default()
    });
    let loss = rollflash_trainer::supervised_step(&copy, &mut opt, &[&seq], &mask, &device)?;
    let mut h = Fnv::new();
    h.word(u64::from(loss.to_bits()));
    let weights = copy.weights();
    let mut names = weights.names();
    names.sort_unstable();
    for name in names {
        h.bytes(name.as_bytes());
        if let Some(t) = weights.tensors().get(name) {
            let values = t
                .flatten_all()
                .and_then(|t| t.to_dtype(candle_core::DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(rollflash_model::ModelError::from)?;
            for v in values {
                h.word(u64::from(v.to_bits()));
            }
        }
    }
    Ok(h.0)
}

/// FNV-1a: stable across runs and Rust versions, unlike `DefaultHasher`.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn word(&mut self, w: u64) {
        self.bytes(&w.to_le_bytes());
    }
}

/// A worked solution without its final `#### answer` part (`12+7=19 19+30=49`).
pub fn unmarked(solution: &str) -> &str {
    solution
        .rfind("####")
        .map_or(solution, |i| solution[..i].trim_end())
}

/// A uniform number in `[0, 1)` from `(seed, step, i)` (SplitMix64's finaliser), so which
/// examples lose their marker is fixed by the seed and independent of the problem stream.
pub(crate) fn unit_hash(seed: u64, step: u64, i: u64) -> f64 {
    let mut z = seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(step.wrapping_mul(0xbf58_476d_1ce4_e5b9))
        .wrapping_add(i.wrapping_mul(0x94d0_49bb_1331_11eb))
        .wrapping_add(0x632b_e59b_d9b4_e019);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}
