//! The real learner moves the policy the right way: a one-token bandit through the whole
//! stack (engine backend, proxy, env manager, controller, decoupled PPO with GRPO
//! advantages, AdamW, in-process weight sync) raises the reward of a random tiny model.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use candle_core::{DType, Device};
use rollflash_core::buffer::BufferConfig;
use rollflash_core::proxy::LeastLoaded;
use rollflash_core::{PauseMode, PolicyVersion, SamplingParams};
use rollflash_env::{Env, EnvError, Reset, Step};
use rollflash_model::config::{Arch, ModelConfig};
use rollflash_model::engine::EngineConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::{OptimizerConfig, TrainableModel};
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    Backend, BackendEntry, EngineBackend, EngineBackendConfig, EnvFactory, EnvManager,
    EnvManagerConfig, LlmProxy, ProxyConfig, Renderer,
};
use rollflash_train::advantage::AdvantageEstimator;
use rollflash_train::loss::{LossConfig, PgVariant};
use rollflash_trainer::{AsyncController, ControllerConfig, CoreConfig};
use rollflash_trainer::{LearnerConfig, PolicyLearner};
use tokio::sync::watch;

/// Reward 1 when the one-character answer is a digit (10 of the ~95 printable characters).
struct DigitBandit;

#[async_trait]
impl Env for DigitBandit {
    async fn reset(&mut self, _seed: u64) -> Result<Reset, EnvError> {
        Ok(Reset {
            observation: "say a digit: ".into(),
            info: Default::default(),
        })
    }
    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let ok = action.chars().next().is_some_and(|c| c.is_ascii_digit());
        Ok(Step {
            reward: if ok { 1.0 } else { 0.0 },
            terminated: true,
            ..Default::default()
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rl_raises_the_reward_of_a_one_token_bandit() {
    let tok = Tokenizer::builtin();
    let mut cfg = ModelConfig::tiny(Arch::Qwen3, tok.vocab_size());
    cfg.max_position_embeddings = 64;
    let w = Weights::random(&cfg, 7, DType::F32, &Device::Cpu).unwrap();
    let model = TrainableModel::new(&cfg, &w, DType::F32, &Device::Cpu).unwrap();
    let engine = EngineBackend::start(
        Arc::new(model.snapshot().unwrap()),
        PolicyVersion(0),
        EngineBackendConfig {
            name: "e0".into(),
            engine: EngineConfig {
                max_running_requests: 64,
                threads: 1,
                ..Default::default()
            },
        },
    )
    .unwrap();
    let proxy = LlmProxy::start(
        vec![BackendEntry {
            backend: Arc::new(engine) as Arc<dyn Backend>,
            route: rollflash_rollout::WeightRoute::Direct,
            max_running_requests: 64,
            update_timeout: None,
        }],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let (vtx, vrx) = watch::channel(PolicyVersion(0));
    let envs = EnvManager::new(
        proxy.handle(),
        Arc::new(tok),
        Renderer::Plain {
            separator: "\n".into(),
        },
        EnvManagerConfig {
            max_turns: 1,
            max_total_tokens: 32,
            sampling: SamplingParams {
                max_new_tokens: 1,
                seed: Some(3),
                ..Default::default()
            },
            step_timeout: Duration::from_secs(10),
        },
        vrx,
    );
    let make: EnvFactory = Arc::new(|| Ok(Box::new(DigitBandit) as Box<dyn Env>));
    let learner = PolicyLearner::new(model, decoupled_grpo(0)).unwrap();
    let ctl = AsyncController::new(
        ControllerConfig {
            core: CoreConfig {
                buffer: BufferConfig {
                    groups_per_batch: 4,
                    group_size: 8,
                    alpha: 1.0,
                    ..Default::default()
                },
                redundancy: 0,
                steps: 30,
                seed: 11,
                ..ControllerConfig::default().core
            },
            pause_mode: PauseMode::Abort,
            ..Default::default()
        },
        proxy.handle(),
        envs,
        make,
        vtx,
        learner,
    )
    .unwrap();
    let report = ctl.run().await.unwrap();
    proxy.shutdown().await.unwrap();
    let rewards: Vec<f64> = report.steps.iter().map(|s| s.mean_reward).collect();
    let first: f64 = rewards[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = rewards[rewards.len() - 5..].iter().sum::<f64>() / 5.0;
    eprintln!("bandit reward per step: {rewards:?}");
    assert!(
        last > first + 0.3,
        "reward should rise: first five steps {first:.3}, last five {last:.3} ({rewards:?})"
    );
    assert!(report.accounting.balanced());
}

/// A batch of 2 groups × 3 random trajectories (3-token prompts, 2–5-token responses).
fn random_batch(vocab: u32) -> rollflash_core::buffer::Batch<rollflash_core::Trajectory> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut groups = Vec::new();
    for g in 0..2u64 {
        let mut samples = Vec::new();
        for i in 0..3usize {
            let resp = rng.random_range(2..6usize);
            let n = 3 + resp;
            let tokens: Vec<u32> = (0..n).map(|_| rng.random_range(4..vocab)).collect();
            let loss_mask: Vec<u8> = (0..n).map(|k| u8::from(k >= 3)).collect();
            let logprobs: Vec<f32> = (0..n)
                .map(|k| {
                    if k >= 3 {
                        rng.random_range(-6.0..-3.0)
                    } else {
                        0.0
                    }
                })
                .collect();
            let t = rollflash_core::Trajectory {
                versions: vec![PolicyVersion(0); n],
                tokens,
                loss_mask,
                logprobs,
                prompt_len: 3,
                index: i,
                ..Default::default()
            };
            samples.push((t, f64::from(rng.random_range(0..2u8))));
        }
        groups.push(rollflash_core::buffer::BatchGroup {
            key: rollflash_core::buffer::GroupKey(g),
            start: PolicyVersion(0),
            samples,
        });
    }
    rollflash_core::buffer::Batch {
        version: PolicyVersion(0),
        groups,
    }
}

/// One training step of a fresh learner with `lc` from weights `w` on `batch`: the new
/// weights and the step's stats.
fn train_once(
    cfg: &ModelConfig,
    w: &Weights,
    batch: &rollflash_core::buffer::Batch<rollflash_core::Trajectory>,
    lc: LearnerConfig,
) -> (Weights, rollflash_trainer::StepStats) {
    use rollflash_trainer::Learner;
    let model = TrainableModel::new(cfg, w, DType::F32, &Device::Cpu).unwrap();
    let mut learner = PolicyLearner::new(model, lc).unwrap();
    let (update, stats) = learner.train(batch).unwrap();
    let rollflash_rollout::WeightUpdate::InProcess { model, .. } = update else {
        panic!("expected in-process weights");
    };
    (model.weights(), stats)
}

/// The embedded learner passes the `Learner` suite (the one a remote trainer must pass):
/// versions follow the batch, stats are finite, a malformed batch is refused and changes
/// nothing — with and without the KL reference and in micro-batches.
#[test]
fn policy_learner_passes_the_learner_suite() {
    let tok = Tokenizer::builtin();
    let cfg = ModelConfig::tiny(Arch::Qwen3, tok.vocab_size());
    let w = Weights::random(&cfg, 5, DType::F32, &Device::Cpu).unwrap();
    let mut batch = random_batch(cfg.vocab_size as u32);
    // Two backends generated the first group, so the per-backend mismatch has names to check.
    for (i, (t, _)) in batch.groups[0].samples.iter_mut().enumerate() {
        let n = t.response_tokens();
        t.served_by = vec![rollflash_core::gen::ServedRun {
            backend: format!("e{}", i % 2),
            tokens: n,
        }];
    }
    batch.version = PolicyVersion(4);
    for (kl, micro) in [(0.0, 0), (0.1, 2)] {
        let mut lc = decoupled_grpo(micro);
        lc.loss.kl_coef = kl;
        let model = TrainableModel::new(&cfg, &w, DType::F32, &Device::Cpu).unwrap();
        let mut learner = PolicyLearner::new(model, lc).unwrap();
        let report = rollflash_trainer::conformance::check_learner(&mut learner, &batch)
            .unwrap_or_else(|e| panic!("kl {kl}, micro-batch {micro}: {e}"));
        assert_eq!(report.steps.len(), 3);
    }
}

/// The suite fails a learner that publishes the wrong version, or panics on a bad batch.
#[test]
fn the_learner_suite_fails_a_broken_learner() {
    use rollflash_trainer::conformance::{check_learner, ConformanceError};
    use rollflash_trainer::{Learner, LearnerError, StepStats};
    struct Broken {
        skip: u64,
        panic_on_bad: bool,
    }
    impl Learner for Broken {
        fn train(
            &mut self,
            batch: &rollflash_core::buffer::Batch<rollflash_core::Trajectory>,
        ) -> Result<(rollflash_rollout::WeightUpdate, StepStats), LearnerError> {
            let ok = batch
                .groups
                .iter()
                .flat_map(|g| &g.samples)
                .all(|(t, _)| t.is_consistent());
            if !ok {
                assert!(!self.panic_on_bad, "bad batch");
                return Err(LearnerError::other("bad batch"));
            }
            Ok((
                rollflash_rollout::WeightUpdate::Disk {
                    path: "x".into(),
                    version: PolicyVersion(batch.version.0 + self.skip),
                },
                StepStats::default(),
            ))
        }
    }
    let batch = random_batch(64);
    let e = check_learner(
        &mut Broken {
            skip: 2,
            panic_on_bad: false,
        },
        &batch,
    )
    .unwrap_err();
    assert!(matches!(e, ConformanceError::Version { .. }), "{e}");
    let e = check_learner(
        &mut Broken {
            skip: 1,
            panic_on_bad: true,
        },
        &batch,
    )
    .unwrap_err();
    assert!(matches!(e, ConformanceError::Panicked { .. }), "{e}");
    check_learner(
        &mut Broken {
            skip: 1,
            panic_on_bad: false,
        },
        &batch,
    )
    .unwrap();
}

/// Micro-batching is an implementation detail: one sequence per pass, or three, gives the
/// same update as the whole batch at once, for sequence- and token-weighted aggregation and
/// with the KL term against the frozen reference on.
#[test]
fn micro_batches_give_the_whole_batch_update() {
    use rollflash_train::LossAgg;
    let tok = Tokenizer::builtin();
    let cfg = ModelConfig::tiny(Arch::Qwen3, tok.vocab_size());
    let w = Weights::random(&cfg, 3, DType::F32, &Device::Cpu).unwrap();
    let batch = random_batch(tok.vocab_size() as u32);
    for (agg, kl_coef) in [(LossAgg::SeqMeanTokenMean, 0.0), (LossAgg::TokenMean, 0.1)] {
        let run = |micro: usize| {
            train_once(
                &cfg,
                &w,
                &batch,
                LearnerConfig {
                    optimizer: OptimizerConfig {
                        lr: 1e-2,
                        // Large ε keeps Adam's first step smooth in the gradient, so float
                        // noise between the two summation orders stays float noise.
                        eps: 1e-3,
                        max_grad_norm: None,
                        ..Default::default()
                    },
                    loss: LossConfig {
                        pg_variant: PgVariant::DecoupledPpo,
                        loss_agg: agg,
                        kl_coef,
                        ..Default::default()
                    },
                    advantage: AdvantageEstimator::Grpo {
                        norm_by_std: true,
                        eps: 1e-6,
                    },
                    shaping: Default::default(),
                    temperature: 1.0,
                    threads: 1,
                    micro_batch_size: micro,
                    device: Device::Cpu,
                },
            )
        };
        let (full, full_stats) = run(0);
        for micro in [1, 4] {
            let (part, stats) = run(micro);
            assert!(
                (stats.loss - full_stats.loss).abs() < 1e-5,
                "{agg:?} micro {micro}: loss {} vs {}",
                stats.loss,
                full_stats.loss
            );
            let d = full.max_abs_diff(&part).unwrap();
            assert!(d < 1e-6, "{agg:?} micro {micro}: weights differ by {d}");
        }
        if kl_coef > 0.0 {
            assert!(full_stats.metrics.iter().any(|(k, _)| k == "kl_ref"));
        }
    }
}

/// REINFORCE++'s KL reward penalty: the learner keeps the frozen reference for it, reports
/// the mean k1 it penalised (`kl_reward`), which equals `behav − ref` averaged over the
/// response tokens computed here independently, and the penalty changes the update.
#[test]
fn reinforce_pp_kl_reward_penalty_uses_the_reference_and_moves_the_update() {
    use rollflash_model::train::token_stats;
    let tok = Tokenizer::builtin();
    let cfg = ModelConfig::tiny(Arch::Qwen3, tok.vocab_size());
    let w = Weights::random(&cfg, 5, DType::F32, &Device::Cpu).unwrap();
    let batch = random_batch(tok.vocab_size() as u32);
    let run = |beta: f64| {
        train_once(
            &cfg,
            &w,
            &batch,
            LearnerConfig {
                optimizer: OptimizerConfig {
                    lr: 1e-2,
                    max_grad_norm: None,
                    ..Default::default()
                },
                loss: LossConfig {
                    pg_variant: PgVariant::Ppo,
                    ..Default::default()
                },
                advantage: AdvantageEstimator::ReinforcePlusPlus {
                    gamma: 1.0,
                    kl_coef: beta,
                    baseline: false,
                    whiten: true,
                    eps: 1e-8,
                },
                shaping: Default::default(),
                temperature: 1.0,
                threads: 1,
                micro_batch_size: 2,
                device: Device::Cpu,
            },
        )
    };
    // Independent: the initial model's log-probs of every sampled token.
    let model = TrainableModel::new(&cfg, &w, DType::F32, &Device::Cpu).unwrap();
    let (mut sum, mut n) = (0.0f64, 0usize);
    for (t, _) in batch.groups.iter().flat_map(|g| g.samples.iter()) {
        let r = token_stats(model.model(), &[t.tokens.as_slice()], 1.0, false)
            .unwrap()
            .logprobs
            .to_vec1::<f32>()
            .unwrap();
        for ((m, b), r) in t.loss_mask.iter().zip(&t.logprobs).zip(&r) {
            if *m == 1 {
                sum += f64::from(*b) - f64::from(*r);
                n += 1;
            }
        }
    }
    let want = sum / n as f64;
    let (plain, plain_stats) = run(0.0);
    let (penalised, stats) = run(0.5);
    assert!(!plain_stats.metrics.iter().any(|(k, _)| k == "kl_reward"));
    let got = stats
        .metrics
        .iter()
        .find(|(k, _)| k == "kl_reward")
        .map(|(_, v)| *v)
        .expect("kl_reward metric");
    assert!((got - want).abs() < 1e-5, "kl_reward {got} vs {want}");
    let moved = plain.max_abs_diff(&penalised).unwrap();
    assert!(moved > 1e-6, "the penalty changed nothing");
}

/// `behav_kl_by_backend`: each backend's tokens' mean `behav − proximal`, told apart by the
/// trajectories' `served_by` runs (a request that moved mid-generation counts each part for
/// the backend that generated it); tokens whose backend is unknown count only in `behav_kl`.
/// Reference: the initial model's log-probs, computed here, with known offsets added.
#[test]
fn behav_kl_is_told_apart_per_backend() {
    use rollflash_core::ServedRun;
    use rollflash_model::train::token_stats;
    let tok = Tokenizer::builtin();
    let cfg = ModelConfig::tiny(Arch::Qwen3, tok.vocab_size());
    let w = Weights::random(&cfg, 7, DType::F32, &Device::Cpu).unwrap();
    let model = TrainableModel::new(&cfg, &w, DType::F32, &Device::Cpu).unwrap();
    let mut batch = random_batch(tok.vocab_size() as u32);
    let run = |backend: &str, tokens| ServedRun {
        backend: backend.into(),
        tokens,
    };
    for (g, group) in batch.groups.iter_mut().enumerate() {
        for (i, (t, _)) in group.samples.iter_mut().enumerate() {
            let exact = token_stats(model.model(), &[t.tokens.as_slice()], 1.0, false)
                .unwrap()
                .logprobs
                .to_vec1::<f32>()
                .unwrap();
            let n = t.response_tokens();
            // Group 0: all on "a", exact. Group 1, sample 0: its first token on "a"
            // (exact), the rest on "b" (+0.25). Group 1, samples 1-2: unknown (-1.0).
            let (runs, offsets): (Vec<ServedRun>, Vec<f32>) = match (g, i) {
                (0, _) => (vec![run("a", n)], vec![0.0; n]),
                (1, 0) => (
                    vec![run("a", 1), run("b", n - 1)],
                    std::iter::once(0.0)
                        .chain(std::iter::repeat_n(0.25, n - 1))
                        .collect(),
                ),
                _ => (Vec::new(), vec![-1.0; n]),
            };
            t.served_by = runs;
            let mut k = 0;
            for (j, m) in t.loss_mask.iter().enumerate() {
                if *m == 1 {
                    t.logprobs[j] = exact[j] + offsets[k];
                    k += 1;
                }
            }
        }
    }
    let (_, stats) = train_once(&cfg, &w, &batch, decoupled_grpo(2));
    let by: std::collections::HashMap<_, _> = stats.behav_kl_by_backend.iter().cloned().collect();
    assert_eq!(by.len(), 2, "{by:?}");
    assert!(by["a"].abs() < 1e-5, "{by:?}");
    assert!((by["b"] - 0.25).abs() < 1e-5, "{by:?}");
    let all = stats
        .metrics
        .iter()
        .find(|(k, _)| k == "behav_kl")
        .unwrap()
        .1;
    assert!(
        all < 0.0,
        "the unknown tokens' -1 counts in the overall mean: {all}"
    );
}

/// Decoupled PPO with GRPO advantages, lr 1e-2 (gradients clipped at 1), one thread, on the
/// CPU, in micro-batches of `micro` sequences (0 = the whole batch).
fn decoupled_grpo(micro: usize) -> LearnerConfig {
    LearnerConfig {
        optimizer: OptimizerConfig {
            lr: 1e-2,
            max_grad_norm: Some(1.0),
            ..Default::default()
        },
        loss: LossConfig {
            pg_variant: PgVariant::DecoupledPpo,
            ..Default::default()
        },
        advantage: AdvantageEstimator::Grpo {
            norm_by_std: true,
            eps: 1e-6,
        },
        shaping: Default::default(),
        temperature: 1.0,
        threads: 1,
        micro_batch_size: micro,
        device: Device::Cpu,
    }
}
