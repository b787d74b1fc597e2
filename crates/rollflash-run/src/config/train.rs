//! `[train]` (the optimiser, loss, advantages and shaping) and `[controller]` (the loop
//! that drives generation and training).

use rollflash_core::PauseMode;
use rollflash_train::advantage::AdvantageEstimator;
use rollflash_train::loss::{LossConfig, PgVariant};
use rollflash_train::shaping::ShapingConfig;
use serde::{Deserialize, Serialize};

use crate::preset::Preset;

/// The optimiser side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSection {
    /// Training steps (policy versions published).
    pub steps: usize,
    pub lr: f64,
    /// CPU threads of the trainer: a number, or `"auto"` (default: every core; `crate::cores`
    /// says why).
    pub threads: super::Threads,
    /// Sequences per forward/backward pass within a step (0 = the whole batch); gradients
    /// are accumulated and one optimiser step is taken per batch.
    pub micro_batch_size: usize,
    pub max_grad_norm: f64,
    pub weight_decay: f64,
    /// AdamW's β₁, β₂ and ε (the Hugging Face `adam_beta1`, `adam_beta2`, `adam_epsilon`).
    pub adam_beta1: f64,
    pub adam_beta2: f64,
    pub adam_eps: f64,
    /// Linear learning-rate warm-up steps.
    pub lr_warmup_steps: usize,
    /// A named algorithm (`grpo`, `dapo`, `dr_grpo`, `reinforce_pp`, `gspo`, `lite_ppo`):
    /// expands to `advantage`, `loss`, `shaping` (and, for DAPO, `buffer.filter`) settings
    /// under what is written explicitly (`crate::preset`).
    pub preset: Option<Preset>,
    /// Advantage estimator (`grpo`, `rloo`, `reinforce_plus_plus`, or `gigpo` — GiGPO's
    /// step-level advantages for multi-turn environments: `gamma` 0.95, `step_advantage_w` 1,
    /// `mode` `mean_norm` | `mean_std_norm`, `eps` 1e-6).
    pub advantage: AdvantageEstimator,
    /// The policy loss, its aggregation, KL and entropy terms.
    pub loss: LossConfig,
    /// Reward and advantage shaping around the estimator: ROLL's `norm_mean_type` /
    /// `norm_std_type` (`none`, `group`, `batch`, `running` — running statistics are kept in
    /// checkpoints), `reward_clip`, `whiten_advantages`, `advantage_clip`, and DAPO's
    /// soft overlong punishment (`[train.shaping.overlong]`).
    pub shaping: ShapingConfig,
    /// Greedy evaluation problems before and after training (0 = none).
    pub eval_problems: usize,
    /// Samples per held-out task for pass@1 at the rollout temperature (0 = greedy only).
    pub eval_samples: usize,
    /// Every this many steps, the greedy held-out evaluation of the policy just published
    /// (the same `eval_problems` tasks as before and after RL, on an engine of its own, so
    /// the number is that version's), written to the step's `metrics.jsonl` line as
    /// `eval_greedy` (success rate), `eval_mean_reward` and, for math, `eval_format_free`;
    /// 0 = never. Not with a Tinker learner (its
    /// weights live on the server).
    pub eval_every: usize,
    /// `[train.lora]`: train LoRA adapters (PEFT's definition) on a frozen base instead of
    /// every weight. Absent = full fine-tuning. Fields: `rank` (8), `alpha` (8), `dropout`
    /// (0), `target_modules` (the attention and MLP projections: `q_proj`, `k_proj`,
    /// `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<rollflash_model::lora::LoraConfig>,
}

impl Default for TrainSection {
    fn default() -> Self {
        TrainSection {
            steps: 50,
            // Small, with a warm-up: AdamW moves every parameter by about the learning rate
            // each step whatever the gradient, and a 64-sample batch's gradient is mostly
            // noise per parameter. 1e-3 wrecked the warmed-up policy; at 1e-4 RL learned the
            // format by step 10, then held-out greedy accuracy fell every ten steps (0.88 →
            // 0.79 on seed 0) while the training reward rose; at 2e-5 it ends at or above the
            // warm-up's format-free accuracy on seeds 0-2 (BENCHMARKS, issue 30). After the
            // 1000-step warm-up, 1e-5 still teaches the format in 50 steps (0.04 -> 1.0 strict
            // on seed 0) and keeps every seed at or above its warm-up; 2e-5 lost one problem
            // of 200 on seed 1.
            lr: 1e-5,
            threads: super::Threads::Auto,
            micro_batch_size: 0,
            max_grad_norm: 1.0,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_eps: 1e-8,
            lr_warmup_steps: 10,
            advantage: AdvantageEstimator::Grpo {
                norm_by_std: true,
                eps: 1e-6,
            },
            // Decoupled PPO: the behaviour log-probs recorded at generation weight each
            // token against the proximal policy, which is what makes α > 0 safe.
            loss: LossConfig {
                pg_variant: PgVariant::DecoupledPpo,
                ..LossConfig::default()
            },
            preset: None,
            shaping: ShapingConfig::default(),
            eval_problems: 200,
            eval_samples: 4,
            eval_every: 10,
            lora: None,
        }
    }
}

impl TrainSection {
    /// `shaping` with the overlong punishment's `max_len` defaulted to `max_new_tokens`.
    pub fn shaping_resolved(&self, max_new_tokens: usize) -> ShapingConfig {
        let mut s = self.shaping;
        if let Some(o) = &mut s.overlong {
            o.max_len.get_or_insert(max_new_tokens);
        }
        s
    }
}

/// The controller loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerSection {
    /// What a weight sync does to in-flight requests: `abort` or `keep`.
    pub pause_mode: PauseMode,
    /// Run the synchronous baseline instead: α = 0 and no generation while training.
    pub sync: bool,
    /// After a weight sync that no backend could load, how long the run goes on waiting for
    /// one to be caught up before it stops (with a checkpoint) as stalled.
    pub serve_timeout_secs: f64,
    /// Between steps, how long the run goes on with no group adding a sample to the buffer
    /// (an environment or every server failing each trajectory, or a filter nothing passes)
    /// before it stops with a checkpoint, saying what it waited on.
    pub progress_timeout_secs: f64,
    /// With no step published for this long, log what the run waits on (the trainer, the
    /// buffer, the proxy's queue and each backend) and again every such interval; 0 = never.
    pub stall_report_secs: f64,
}

impl Default for ControllerSection {
    fn default() -> Self {
        ControllerSection {
            pause_mode: PauseMode::Abort,
            sync: false,
            serve_timeout_secs: rollflash_trainer::DEFAULT_SERVE_TIMEOUT.as_secs_f64(),
            progress_timeout_secs: rollflash_trainer::DEFAULT_PROGRESS_TIMEOUT.as_secs_f64(),
            stall_report_secs: rollflash_trainer::DEFAULT_STALL_REPORT.as_secs_f64(),
        }
    }
}
