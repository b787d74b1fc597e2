//! Policy-gradient losses on candle tensors, differentiable w.r.t. the current log-probs.
//!
//! Inputs are packed 1-D `[tokens]` tensors (see [`PolicyLossInputs`]) with three log-prob
//! vectors per token: `logp` (the policy being trained, π_θ — the only one that carries
//! gradient), `old_logp` (π_old: the trainer's recomputation at the start of the step, the
//! *proximal* policy in AReaL's terms) and `behav_logp` (π_behav: what the inference engine
//! recorded when it sampled the token). `r = exp(logπ_θ − logπ_old)` throughout and
//! `sg(·)` is stop-gradient. [`LossConfig::old_policy`] can make π_old the behaviour policy
//! instead ([`OldPolicy::Behaviour`]).
//!
//! The total loss is `agg(w_corr·ℓ_pg) + kl_coef·agg(kl(π_θ, π_ref)) − entropy_coef·agg(H)`,
//! as in ROLL's `ActorWorker.loss_func` / `ActorPGWorker.loss_func`
//! (`roll/pipeline/rlvr/actor_worker.py`, `actor_pg_worker.py`), where `agg` is
//! [`LossAgg`], `w_corr` the train–inference correction weight ([`crate::correction`]) and
//! `ℓ_pg` the per-token loss of the [`PgVariant`].
//!
//! How the non-smooth points are differentiated: which branch of a `min`/`max`/`clamp` a
//! token takes is decided on the host from its current values and applied as a constant
//! selector, so the gradient is exactly torch's away from ties, and at a tie (a ratio exactly
//! on a clip boundary) the unclipped branch's full gradient is used (torch would split it).
//! Masked tokens are replaced by zeros *before* any arithmetic, so they get exactly zero
//! gradient even when their inputs are garbage (−inf, NaN).

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::agg::{host_tensor, weighted_sum, LossAgg};
use crate::correction::{train_infer_correction, CorrectionConfig};
use crate::error::{Result, TrainError};
use crate::kl::{to_f64_vec, KlEstimator};
use crate::layout::SeqLayout;

/// The policy-gradient variant (ROLL's `pg_variant`, plus GSPO and AReaL's decoupled PPO).
/// Serialised snake_case. `A` is the token's advantage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PgVariant {
    /// `ℓ = −A·logπ_θ` (REINFORCE; on-policy only — no ratio at all).
    Vanilla,
    /// `ℓ = −min(r·A, clip(r, 1−clip_low, 1+clip_high)·A)`; with `dual_clip = c`, for
    /// `A < 0`: `ℓ = min(ℓ, −c·A)` (ROLL: `−max(−ℓ, c·A)`, c = 1 + 2·pg_clip; verl / AReaL:
    /// `clip_ratio_c` / `c_clip`, default 3).
    #[default]
    Ppo,
    /// Truncated IS: `ℓ = −sg(clip(r, tis_low, tis_high))·A·logπ_θ` (ROLL defaults [0, 1]).
    Tis,
    /// TOPR: positive samples `ℓ = −w₊·A·logπ_θ`; others `ℓ = −w₋·sg(clip(r, 0, 1))·A·logπ_θ`.
    /// A sample is positive if its score is `> 0` (ROLL uses the sequence's `scores`; pass
    /// them as `seq_scores`) or, without scores, if the token's advantage is `> 0`.
    Topr,
    /// CISPO (MiniMax-M1): `ℓ = −sg(clip(r, 1−cispo_clip_low, 1+cispo_clip_high))·A·logπ_θ`;
    /// with `cispo_unified_mask`, tokens with `A>0, r>1+ε_high` or `A<0, r<1−ε_low` get 0.
    Cispo,
    /// Kimi k1.5: `ℓ = −A·logπ_θ + τ/2·(logπ_θ − logπ_old)²`.
    Kimi15,
    /// GSPO: PPO's clipped loss (and dual clip) on the sequence ratio
    /// `s_i = exp(mean_{t∈i, valid}(logπ_θ − logπ_old))`, broadcast to the sequence's tokens,
    /// with `gspo_clip_low` / `gspo_clip_high`. Gradient flows through the mean, as in ROLL
    /// (`importance_sampling: seq`) and AReaL; with `gspo_token_grad` the ratio is GSPO-token's
    /// `sg(s_i)·π_θ(y_t)/sg(π_θ(y_t))` (verl): same value, per-token gradient `s_i·∇logπ_θ(y_t)`.
    /// The two agree whenever the advantage is constant over the sequence. (AReaL also
    /// replaces each token's advantage by its sequence mean; with sequence-constant
    /// advantages, as GRPO produces, that changes nothing.)
    Gspo,
    /// AReaL's decoupled PPO: PPO's clipped loss on `r = π_θ/π_old` (π_old = proximal
    /// policy), times the detached behaviour weight `w = π_old/π_behav`; tokens with
    /// `w > behav_imp_weight_cap` get weight 0 but stay in the denominator of the mean
    /// (AReaL's `behav_mask`, before its `rejection_sampling` rewrite). With
    /// [`LossConfig::rejection_sampling`] set, AReaL's newer form replaces the cap (see
    /// [`RejectionSampling`]).
    DecoupledPpo,
}

/// Which policy PPO's ratio `r = π_θ/π_old` is measured against: what `old_logp` means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OldPolicy {
    /// The trainer's policy at the start of the step (ROLL recomputes `old_log_probs`;
    /// AReaL's proximal policy): the ratio measures only this step's own update, and the
    /// distance to the sampler is left to the decoupled weight or the correction.
    #[default]
    Proximal,
    /// The policy that sampled the tokens (the inference engine's recorded log-probs, given
    /// as `behav_logp`): the ratio carries staleness and the train–inference mismatch, and
    /// the clip bounds them. This is slime's `--use-rollout-logprobs`, verl's
    /// rollout-correction bypass mode, and the definition of Tinker's built-in `ppo` and
    /// `cispo` losses (their ratio is `exp(target − sampling log-probs)`).
    #[serde(alias = "behavior")]
    Behaviour,
}

/// Granularity of [`RejectionSampling`] (AReaL `RejectionSamplingConfig.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionLevel {
    /// Each token judged on its own.
    #[default]
    Token,
    /// All tokens of a sequence share one verdict; with the `ratio` metric the behaviour
    /// weight itself becomes the sequence's geometric mean `exp(mean_t log(π_old/π_behav))`.
    Sequence,
}

/// What happens outside the bounds (AReaL `RejectionSamplingConfig.action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionAction {
    /// Rejection: the token (or the whole sequence) gets weight 0; it stays in the
    /// aggregation's denominator (AReaL keeps the original `loss_mask` count).
    #[default]
    Mask,
    /// Truncation: the behaviour weight is clamped to `[lower (or 0), upper]` — every token
    /// at token level, the tokens of out-of-bounds sequences at sequence level.
    Clamp,
}

/// The divergence a [`RejectionSampling`] bound applies to, with `d = logπ_old − logπ_behav`
/// (AReaL `metric`; its KL estimators are not clamped here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionMetric {
    /// `exp(d)`, the behaviour importance weight.
    #[default]
    Ratio,
    /// `d`.
    KlK1,
    /// `d²/2`.
    KlK2,
    /// `exp(−d) − 1 + d`.
    KlK3,
}

/// How a sequence-level metric is aggregated (AReaL `agg`); for `ratio` in log space
/// (`sum` = `exp(Σd)`, `mean` = `exp(mean d)`, `max` = the largest token ratio), for the KL
/// metrics arithmetically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionAgg {
    /// Sum over the sequence's valid tokens.
    Sum,
    /// Mean over them.
    #[default]
    Mean,
    /// Largest value (an all-masked sequence counts as in bounds).
    Max,
}

/// AReaL's rejection-sampling form of decoupled PPO's behaviour weight
/// (`areal/utils/functional/functional.py`: `apply_rejection_sampling`, used by
/// `ppo_actor_loss_fn`; `areal/api/cli_args.py`: `RejectionSamplingConfig`, whose defaults
/// these are): a token (or sequence) is in bounds when `lower ≤ metric ≤ upper` (no lower
/// test without `lower`); out of bounds it is masked or its weight clamped.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RejectionSampling {
    /// Token or sequence.
    pub level: RejectionLevel,
    /// Mask or clamp.
    pub action: RejectionAction,
    /// Which divergence is bounded.
    pub metric: RejectionMetric,
    /// Sequence-level aggregation.
    pub agg: RejectionAgg,
    /// Upper bound (AReaL default 5.0).
    pub upper: f64,
    /// Optional lower bound.
    pub lower: Option<f64>,
}

impl Default for RejectionSampling {
    fn default() -> Self {
        RejectionSampling {
            level: RejectionLevel::Token,
            action: RejectionAction::Mask,
            metric: RejectionMetric::Ratio,
            agg: RejectionAgg::Mean,
            upper: 5.0,
            lower: None,
        }
    }
}

impl RejectionSampling {
    /// The metric of one token with `d = logπ_old − logπ_behav`.
    fn token_metric(&self, d: f64) -> f64 {
        match self.metric {
            RejectionMetric::Ratio => d.exp(),
            RejectionMetric::KlK1 => d,
            RejectionMetric::KlK2 => 0.5 * d * d,
            RejectionMetric::KlK3 => (-d).exp() - 1.0 + d,
        }
    }

    fn in_bounds(&self, m: f64) -> bool {
        m <= self.upper && self.lower.is_none_or(|lo| m >= lo)
    }

    /// Per token: the behaviour weight (0 where rejected or masked) and whether the token
    /// was rejected or clamped. `old`, `behav` and `mask` are per token, masked entries 0.
    pub fn weights(
        &self,
        old: &[f64],
        behav: &[f64],
        mask: &[f64],
        layout: &SeqLayout,
    ) -> (Vec<f64>, Vec<bool>) {
        let n = old.len();
        // AReaL sanitises non-finite log-ratios to 0.
        let d: Vec<f64> = (0..n)
            .map(|t| {
                let x = old[t] - behav[t];
                if x.is_finite() && mask[t] > 0.0 {
                    x
                } else {
                    0.0
                }
            })
            .collect();
        let mut w: Vec<f64> = d.iter().map(|x| x.exp()).collect();
        let mut keep = vec![true; n];
        let mut clamp = vec![false; n];
        let (lo, hi) = (self.lower.unwrap_or(0.0), self.upper);
        match self.level {
            RejectionLevel::Token => {
                for t in 0..n {
                    match self.action {
                        RejectionAction::Mask => keep[t] = self.in_bounds(self.token_metric(d[t])),
                        RejectionAction::Clamp => clamp[t] = true,
                    }
                }
            }
            RejectionLevel::Sequence => {
                let log_agg = self.metric == RejectionMetric::Ratio;
                for range in layout.ranges() {
                    let valid: Vec<usize> = range.clone().filter(|&t| mask[t] > 0.0).collect();
                    let vals: Vec<f64> = valid
                        .iter()
                        .map(|&t| {
                            if log_agg {
                                d[t]
                            } else {
                                self.token_metric(d[t])
                            }
                        })
                        .collect();
                    let count = vals.len().max(1) as f64;
                    if log_agg {
                        let g = (vals.iter().sum::<f64>() / count).exp();
                        for t in range.clone() {
                            w[t] = g;
                        }
                    }
                    let agg = match self.agg {
                        RejectionAgg::Sum => vals.iter().sum::<f64>(),
                        RejectionAgg::Mean => vals.iter().sum::<f64>() / count,
                        RejectionAgg::Max if vals.is_empty() => 0.0,
                        RejectionAgg::Max => vals.iter().copied().fold(f64::MIN, f64::max),
                    };
                    let metric = if log_agg { agg.exp() } else { agg };
                    if !self.in_bounds(metric) {
                        for t in range {
                            match self.action {
                                RejectionAction::Mask => keep[t] = false,
                                RejectionAction::Clamp => clamp[t] = true,
                            }
                        }
                    }
                }
            }
        }
        let base = w.clone();
        for t in 0..n {
            if clamp[t] {
                w[t] = w[t].clamp(lo, hi);
            }
        }
        let mut flagged = vec![false; n];
        for t in 0..n {
            let valid = mask[t] > 0.0;
            flagged[t] = valid
                && match self.action {
                    RejectionAction::Mask => !keep[t],
                    RejectionAction::Clamp => w[t] != base[t],
                };
            if !(valid && keep[t]) {
                w[t] = 0.0;
            }
        }
        (w, flagged)
    }
}

/// Everything the policy loss needs besides the data, with defaults in one place
/// ([`LossConfig::default`]) and validation in one place ([`LossConfig::validate`]).
/// Unknown fields are rejected so a typo does not silently fall back to a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LossConfig {
    /// Which policy-gradient loss.
    pub pg_variant: PgVariant,
    /// What the ratio's π_old is: the proximal policy (default) or the behaviour policy.
    pub old_policy: OldPolicy,
    /// How per-token losses (all three terms) are reduced to a scalar.
    pub loss_agg: LossAgg,
    /// The constant `L` of `seq_mean_token_sum_norm` (e.g. the maximum response length);
    /// `None` = the longest sequence of the batch.
    pub agg_norm_len: Option<usize>,
    /// PPO / decoupled PPO lower clip ε_low: ratios below `1 − ε_low` are clipped (ROLL 0.2).
    pub clip_low: f64,
    /// PPO / decoupled PPO upper clip ε_high: ratios above `1 + ε_high` are clipped (ROLL
    /// 0.2; DAPO's clip-higher uses 0.28).
    pub clip_high: f64,
    /// Dual-clip constant `c > 1` bounding the loss of negative-advantage tokens at `−c·A`
    /// (PPO, GSPO, decoupled PPO); `None` = off (ROLL's `dual_clip_loss: false`).
    pub dual_clip: Option<f64>,
    /// GSPO's lower clip on the sequence ratio (GSPO paper: 3e-4).
    pub gspo_clip_low: f64,
    /// GSPO's upper clip on the sequence ratio (GSPO paper: 4e-4).
    pub gspo_clip_high: f64,
    /// Use GSPO-token's per-token gradient form instead of differentiating the mean.
    pub gspo_token_grad: bool,
    /// TIS truncation lower bound (ROLL `tis_lower_bound`, 0).
    pub tis_low: f64,
    /// TIS truncation upper bound (ROLL `tis_upper_bound`, 1).
    pub tis_high: f64,
    /// TOPR weight of positive samples (ROLL `topr_positive_weight`, 1).
    pub topr_positive_weight: f64,
    /// TOPR weight of negative samples (ROLL `topr_negative_weight`, 1).
    pub topr_negative_weight: f64,
    /// CISPO lower clip of the IS weight (ROLL `cispo_epsilon_low`, 0.1).
    pub cispo_clip_low: f64,
    /// CISPO upper clip of the IS weight (ROLL `cispo_epsilon_high`, 0.1).
    pub cispo_clip_high: f64,
    /// CISPO's unified token mask (paper eq. 7; ROLL `cispo_use_unified_mask`, false).
    pub cispo_unified_mask: bool,
    /// Kimi 1.5's τ (ROLL `kimi15_tau`, 0.1).
    pub kimi15_tau: f64,
    /// Decoupled PPO: behaviour weights above this get weight 0 (AReaL's old default 5.0);
    /// `None` (or `inf`, as a TOML file says it) keeps every token.
    pub behav_imp_weight_cap: Option<f64>,
    /// Decoupled PPO: AReaL's rejection sampling of the behaviour weight (mask or clamp, by
    /// token or sequence); when set it **replaces** `behav_imp_weight_cap`, as in AReaL.
    /// `None` (the default) keeps the cap.
    pub rejection_sampling: Option<RejectionSampling>,
    /// Train–inference correction (weight and filters), applicable to every variant except
    /// `decoupled_ppo`, which already weights by the same ratio.
    pub correction: CorrectionConfig,
    /// Coefficient of the KL-to-reference loss term; 0 = off (ROLL `use_kl_loss` +
    /// `kl_loss_coef`). Needs `ref_logp`.
    pub kl_coef: f64,
    /// Estimator of the KL loss term (ROLL uses k3).
    pub kl_estimator: KlEstimator,
    /// Coefficient of the entropy bonus, subtracted from the loss; 0 = off. Needs `entropy`.
    pub entropy_coef: f64,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            pg_variant: PgVariant::Ppo,
            old_policy: OldPolicy::Proximal,
            loss_agg: LossAgg::SeqMeanTokenMean,
            agg_norm_len: None,
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: None,
            gspo_clip_low: 3e-4,
            gspo_clip_high: 4e-4,
            gspo_token_grad: false,
            tis_low: 0.0,
            tis_high: 1.0,
            topr_positive_weight: 1.0,
            topr_negative_weight: 1.0,
            cispo_clip_low: 0.1,
            cispo_clip_high: 0.1,
            cispo_unified_mask: false,
            kimi15_tau: 0.1,
            behav_imp_weight_cap: Some(5.0),
            rejection_sampling: None,
            correction: CorrectionConfig::default(),
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            entropy_coef: 0.0,
        }
    }
}

/// `Err` naming `field` unless `ok`.
fn check(ok: bool, field: &str, value: f64, must: &str) -> Result<()> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(TrainError::config(field, format!("{value} {must}")))
    }
}

impl LossConfig {
    /// Parses a JSON config (missing fields take their defaults) and validates it.
    pub fn from_json(text: &str) -> Result<Self> {
        let cfg: LossConfig = serde_json::from_str(text).map_err(TrainError::Json)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every field; the error names the first bad one.
    // Long by design: a flat list of one check per field in the order the fields are
    // declared, so the first bad field is the one named.
    pub fn validate(&self) -> Result<()> {
        let c = self;
        check(
            (0.0..1.0).contains(&c.clip_low),
            "clip_low",
            c.clip_low,
            "must be in [0, 1)",
        )?;
        check(c.clip_high >= 0.0, "clip_high", c.clip_high, "must be >= 0")?;
        if let Some(d) = c.dual_clip {
            check(d > 1.0, "dual_clip", d, "must be > 1")?;
        }
        check(
            (0.0..1.0).contains(&c.gspo_clip_low),
            "gspo_clip_low",
            c.gspo_clip_low,
            "must be in [0, 1)",
        )?;
        check(
            c.gspo_clip_high >= 0.0,
            "gspo_clip_high",
            c.gspo_clip_high,
            "must be >= 0",
        )?;
        check(c.tis_low >= 0.0, "tis_low", c.tis_low, "must be >= 0")?;
        check(
            c.tis_high >= c.tis_low,
            "tis_high",
            c.tis_high,
            "must be >= tis_low",
        )?;
        check(
            c.topr_positive_weight >= 0.0,
            "topr_positive_weight",
            c.topr_positive_weight,
            "must be >= 0",
        )?;
        check(
            c.topr_negative_weight >= 0.0,
            "topr_negative_weight",
            c.topr_negative_weight,
            "must be >= 0",
        )?;
        check(
            c.cispo_clip_low >= 0.0,
            "cispo_clip_low",
            c.cispo_clip_low,
            "must be >= 0",
        )?;
        check(
            c.cispo_clip_high >= 0.0,
            "cispo_clip_high",
            c.cispo_clip_high,
            "must be >= 0",
        )?;
        check(
            c.kimi15_tau >= 0.0,
            "kimi15_tau",
            c.kimi15_tau,
            "must be >= 0",
        )?;
        if let Some(cap) = c.behav_imp_weight_cap {
            // `inf` is allowed: a cap that never binds (TOML has no null for "none").
            if !(cap > 0.0) {
                return Err(TrainError::config(
                    "behav_imp_weight_cap",
                    format!("{cap} must be > 0 (inf: no cap)"),
                ));
            }
        }
        if let Some(rs) = &c.rejection_sampling {
            if c.pg_variant != PgVariant::DecoupledPpo {
                return Err(TrainError::config(
                    "rejection_sampling",
                    "applies to the behaviour weight of pg_variant = \"decoupled_ppo\" only",
                ));
            }
            check(
                rs.upper > 0.0,
                "rejection_sampling.upper",
                rs.upper,
                "must be > 0",
            )?;
            if let Some(lo) = rs.lower {
                let ok = lo < rs.upper && (rs.metric != RejectionMetric::Ratio || lo >= 0.0);
                check(
                    ok,
                    "rejection_sampling.lower",
                    lo,
                    "must be below upper (and >= 0 for the ratio metric)",
                )?;
            }
        }
        if c.agg_norm_len == Some(0) {
            return Err(TrainError::config("agg_norm_len", "0 must be >= 1"));
        }
        check(c.kl_coef >= 0.0, "kl_coef", c.kl_coef, "must be >= 0")?;
        check(
            c.entropy_coef >= 0.0,
            "entropy_coef",
            c.entropy_coef,
            "must be >= 0",
        )?;
        c.correction.validate("correction")?;
        if c.pg_variant == PgVariant::DecoupledPpo && c.correction.is_weight.is_some() {
            return Err(TrainError::config(
                "correction.is_weight",
                "decoupled_ppo already weights each token by π_old/π_behav; \
                 a correction weight would apply that ratio twice",
            ));
        }
        if c.old_policy == OldPolicy::Behaviour {
            // Both would weigh by π_old/π_behav = 1: settings that silently do nothing.
            if c.pg_variant == PgVariant::DecoupledPpo {
                return Err(TrainError::config(
                    "old_policy",
                    "\"behaviour\" makes decoupled_ppo's weight π_old/π_behav 1; \
                     use pg_variant = \"ppo\" for PPO against the behaviour policy",
                ));
            }
            if c.correction.is_active() {
                return Err(TrainError::config(
                    "correction",
                    "the correction weighs and filters by π_old/π_behav, which is 1 when \
                     old_policy = \"behaviour\"",
                ));
            }
        }
        Ok(())
    }
}

/// One packed batch for [`policy_loss`]. Per-token inputs are 1-D tensors of the same length
/// (any float dtype; they are converted to `logp`'s dtype and must be on its device).
#[derive(Debug, Clone, Copy)]
pub struct PolicyLossInputs<'a> {
    /// log π_θ of each token under the policy being trained: the tensor gradients flow into.
    pub logp: &'a Tensor,
    /// log π_old: the trainer's recomputation at the start of the step (PPO's old policy,
    /// AReaL's proximal policy). Treated as a constant.
    pub old_logp: &'a Tensor,
    /// log π_behav recorded by the inference engine at generation; pass `old_logp` again when
    /// there is no separate record. Treated as a constant.
    pub behav_logp: &'a Tensor,
    /// Advantage of each token (see [`crate::advantage`]). Treated as a constant.
    pub adv: &'a Tensor,
    /// 1 for tokens that take part in the loss, 0 for the rest (any non-zero counts as 1).
    pub mask: &'a Tensor,
    /// Start index of each sequence (see [`SeqLayout`]).
    pub seq_offsets: &'a [usize],
    /// log π_ref for the KL term; required when `kl_coef > 0`.
    pub ref_logp: Option<&'a Tensor>,
    /// Per-token entropy of π_θ for the entropy bonus (may carry its own gradient); required
    /// when `entropy_coef > 0`.
    pub entropy: Option<&'a Tensor>,
    /// Per-sequence scores (raw rewards) that TOPR uses to split positive and negative
    /// samples, as ROLL does; without them TOPR uses the sign of each token's advantage.
    pub seq_scores: Option<&'a [f64]>,
}

impl<'a> PolicyLossInputs<'a> {
    /// The required inputs; the optional ones start as `None`.
    pub fn new(
        logp: &'a Tensor,
        old_logp: &'a Tensor,
        behav_logp: &'a Tensor,
        adv: &'a Tensor,
        mask: &'a Tensor,
        seq_offsets: &'a [usize],
    ) -> Self {
        PolicyLossInputs {
            logp,
            old_logp,
            behav_logp,
            adv,
            mask,
            seq_offsets,
            ref_logp: None,
            entropy: None,
            seq_scores: None,
        }
    }
}

/// Detached statistics of one loss evaluation, for logging. Fractions and means are over the
/// valid tokens (after correction filters); with no valid token, fractions are 0 and ratio
/// statistics 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossMetrics {
    /// The aggregated policy-gradient term.
    pub pg_loss: f64,
    /// The aggregated KL estimate (before `kl_coef`), when the KL term is on.
    pub kl_loss: Option<f64>,
    /// The aggregated entropy (before `entropy_coef`), when the entropy bonus is on.
    pub entropy: Option<f64>,
    /// The value of the returned loss.
    pub total_loss: f64,
    /// Fraction of tokens whose loss was clipped or truncated by the variant: the clipped
    /// branch of PPO / GSPO / decoupled PPO, the IS weight of TIS / CISPO / TOPR (negatives)
    /// moved by its clamp; 0 for vanilla and Kimi 1.5.
    pub clip_frac: f64,
    /// Fraction of tokens held at the dual-clip bound `−c·A`.
    pub dual_clip_frac: f64,
    /// Mean k3 estimate of KL(π_θ‖π_old): `exp(old − logπ_θ) − (old − logπ_θ) − 1`.
    pub approx_kl: f64,
    /// Mean over the valid **tokens** of the importance ratio the variant uses (`r`, or
    /// GSPO's `s_i` per token): long sequences weigh more.
    pub ratio_mean_token: f64,
    /// Mean over the valid **sequences** of each sequence's mean ratio (ROLL's
    /// `actor/ratio_mean`, a `seq-mean-token-mean`): every sequence weighs the same.
    pub ratio_mean_seq: f64,
    /// Largest such ratio.
    pub ratio_max: f64,
    /// Smallest such ratio.
    pub ratio_min: f64,
    /// Decoupled PPO: fraction of tokens whose behaviour weight exceeded the cap, or that
    /// rejection sampling masked or clamped.
    pub decoupled_cap_frac: f64,
    /// Mean train–inference correction weight (1 when no weight is configured).
    pub correction_weight_mean: f64,
    /// Fraction of the input's valid tokens removed by the correction filters.
    pub correction_filtered_frac: f64,
    /// Valid tokens after the filters.
    pub n_valid_tokens: usize,
    /// Sequences with at least one valid token after the filters.
    pub n_valid_seqs: usize,
}

/// The loss to call `backward()` on, and what to log.
#[derive(Debug, Clone)]
pub struct LossOutput {
    /// Scalar (rank-0) loss in `logp`'s dtype, differentiable w.r.t. `logp` (and `entropy`).
    pub loss: Tensor,
    /// Detached statistics.
    pub metrics: LossMetrics,
}

/// The per-token policy-gradient term of one variant, and the statistics that come with it.
struct PgTerm {
    /// `ℓ_t`, differentiable w.r.t. the (masked) log-probs.
    loss_tok: Tensor,
    /// The importance ratio the variant uses, per token.
    ratio: Vec<f64>,
    /// Whether the variant clipped / truncated the token.
    clipped: Vec<bool>,
    /// Whether the dual clip held the token.
    dual_clipped: Vec<bool>,
    /// Whether the decoupled cap dropped the token.
    capped: Vec<bool>,
}

impl PgTerm {
    /// A term linear in the log-probs (`coef` per token, detached), with no dual clip and no
    /// cap: TOPR's and CISPO's.
    fn linear(
        batch: &Batch<'_>,
        coef: &[f64],
        ratio: Vec<f64>,
        clipped: Vec<bool>,
    ) -> Result<PgTerm> {
        let none = vec![false; coef.len()];
        Ok(PgTerm {
            loss_tok: batch.linear(coef)?,
            ratio,
            clipped,
            dual_clipped: none.clone(),
            capped: none,
        })
    }
}

/// The batch as the variants see it: masked tokens already zeroed everywhere.
struct Batch<'a> {
    /// logπ_θ with masked tokens replaced by 0 (the differentiable input).
    lp: Tensor,
    /// Values of `lp`.
    lp_val: Vec<f64>,
    /// log π_old, 0 on masked tokens.
    old: Vec<f64>,
    /// log π_behav, 0 on masked tokens.
    behav: Vec<f64>,
    /// Advantages, 0 on masked tokens.
    adv: Vec<f64>,
    /// Effective mask (after filters), 0/1.
    mask: Vec<f64>,
    layout: &'a SeqLayout,
    device: Device,
    dtype: DType,
}

impl Batch<'_> {
    fn tensor(&self, values: &[f64]) -> Result<Tensor> {
        host_tensor(values, &self.device, self.dtype)
    }

    /// `r_t = exp(logπ_θ − logπ_old)` as a tensor, and its values.
    fn token_ratio(&self) -> Result<(Tensor, Vec<f64>)> {
        let old = self.tensor(&self.old)?;
        let ratio = self.lp.sub(&old)?.exp()?;
        let values = self
            .lp_val
            .iter()
            .zip(&self.old)
            .map(|(l, o)| (l - o).exp())
            .collect();
        Ok((ratio, values))
    }

    /// `ℓ_t = coef_t · logπ_θ` with constant coefficients: the form of every variant whose
    /// importance weight is detached.
    fn linear(&self, coef: &[f64]) -> Result<Tensor> {
        Ok(self.lp.mul(&self.tensor(coef)?)?)
    }
}

/// PPO's clipped surrogate on `ratio` (token or sequence level):
/// `ℓ = −min(r·A, clip(r, 1−lo, 1+hi)·A)`, then `min(ℓ, −c·A)` for `A < 0` with a dual clip.
///
/// A token is *clipped* when the clipped branch is strictly smaller —
/// `(A > 0 ∧ r > 1+hi) ∨ (A < 0 ∧ r < 1−lo)` — and then holds the constant `−clip(r)·A`; a
/// negative-advantage token is *dual-clipped* when `ℓ > −c·A` and then holds `−c·A`. Every
/// other token is `−A·r`, live.
fn clipped_surrogate(
    batch: &Batch<'_>,
    ratio: &Tensor,
    ratio_val: &[f64],
    lo: f64,
    hi: f64,
    dual_clip: Option<f64>,
) -> Result<(Tensor, Vec<bool>, Vec<bool>)> {
    let n = ratio_val.len();
    let mut live_coef = vec![0.0; n];
    let mut held = vec![0.0; n];
    let mut clipped = vec![false; n];
    let mut dual = vec![false; n];
    for t in 0..n {
        let (r, a) = (ratio_val[t], batch.adv[t]);
        let is_clipped = (a > 0.0 && r > 1.0 + hi) || (a < 0.0 && r < 1.0 - lo);
        let mut value = if is_clipped {
            -a * r.clamp(1.0 - lo, 1.0 + hi)
        } else {
            -a * r
        };
        let mut live = !is_clipped;
        if let Some(c) = dual_clip {
            if a < 0.0 && value > -c * a {
                value = -c * a;
                live = false;
                dual[t] = batch.mask[t] > 0.0;
            }
        }
        clipped[t] = is_clipped && batch.mask[t] > 0.0;
        if live {
            live_coef[t] = -a;
        } else {
            held[t] = value;
        }
    }
    let loss = ratio
        .mul(&batch.tensor(&live_coef)?)?
        .add(&batch.tensor(&held)?)?;
    Ok((loss, clipped, dual))
}

/// GSPO's sequence ratio `s_i = exp(mean_{t∈i}(logπ_θ − logπ_old))` over valid tokens,
/// broadcast to the tokens of sequence `i` (1 for a sequence with no valid token), with the
/// gradient of the mean — or GSPO-token's `sg(s_i)·exp(logπ_θ − sg(logπ_θ))` if `token_grad`.
fn sequence_ratio(batch: &Batch<'_>, token_grad: bool) -> Result<(Tensor, Vec<f64>)> {
    let layout = batch.layout;
    let mut counts = Vec::with_capacity(layout.n_seqs());
    let mut seq_val = Vec::with_capacity(layout.n_seqs());
    for range in layout.ranges() {
        let count: f64 = batch.mask[range.clone()].iter().sum();
        let sum: f64 = range
            .map(|t| batch.mask[t] * (batch.lp_val[t] - batch.old[t]))
            .sum();
        counts.push(count.max(1.0));
        seq_val.push((sum / count.max(1.0)).exp());
    }
    let ratio_val: Vec<f64> = layout
        .seq_ids()
        .iter()
        .map(|&i| seq_val[i as usize])
        .collect();

    let ids = Tensor::from_vec(layout.seq_ids(), layout.n_tokens(), &batch.device)?;
    let log_ratio = batch
        .lp
        .sub(&batch.tensor(&batch.old)?)?
        .mul(&batch.tensor(&batch.mask)?)?;
    let sums = Tensor::zeros(layout.n_seqs(), batch.dtype, &batch.device)?
        .index_add(&ids, &log_ratio, 0)?;
    let seq_ratio = sums.div(&batch.tensor(&counts)?)?.exp()?;
    let ratio = seq_ratio.index_select(&ids, 0)?;
    let ratio = if token_grad {
        let unit = batch.lp.sub(&batch.lp.detach())?.exp()?; // value 1, gradient ∇logπ_θ
        ratio.detach().mul(&unit)?
    } else {
        ratio
    };
    Ok((ratio, ratio_val))
}

/// The per-token loss of `cfg.pg_variant`.
fn pg_term(batch: &Batch<'_>, cfg: &LossConfig, seq_scores: Option<&[f64]>) -> Result<PgTerm> {
    let n = batch.lp_val.len();
    let none = vec![false; n];
    let valid = |t: usize| batch.mask[t] > 0.0;
    match cfg.pg_variant {
        PgVariant::Vanilla => {
            let coef: Vec<f64> = batch.adv.iter().map(|a| -a).collect();
            let (_, ratio) = batch.token_ratio()?;
            Ok(PgTerm {
                loss_tok: batch.linear(&coef)?,
                ratio,
                clipped: none.clone(),
                dual_clipped: none.clone(),
                capped: none,
            })
        }
        PgVariant::Ppo => {
            let (ratio, ratio_val) = batch.token_ratio()?;
            let (loss_tok, clipped, dual_clipped) = clipped_surrogate(
                batch,
                &ratio,
                &ratio_val,
                cfg.clip_low,
                cfg.clip_high,
                cfg.dual_clip,
            )?;
            Ok(PgTerm {
                loss_tok,
                ratio: ratio_val,
                clipped,
                dual_clipped,
                capped: none,
            })
        }
        PgVariant::Tis => {
            let (_, ratio) = batch.token_ratio()?;
            let coef: Vec<f64> = (0..n)
                .map(|t| -ratio[t].clamp(cfg.tis_low, cfg.tis_high) * batch.adv[t])
                .collect();
            let clipped = (0..n)
                .map(|t| valid(t) && (ratio[t] < cfg.tis_low || ratio[t] > cfg.tis_high))
                .collect();
            Ok(PgTerm {
                loss_tok: batch.linear(&coef)?,
                ratio,
                clipped,
                dual_clipped: none.clone(),
                capped: none,
            })
        }
        PgVariant::Topr => topr_term(batch, cfg, seq_scores),
        PgVariant::Cispo => cispo_term(batch, cfg),
        PgVariant::Kimi15 => {
            let (_, ratio) = batch.token_ratio()?;
            let coef: Vec<f64> = batch.adv.iter().map(|a| -a).collect();
            let diff = batch.lp.sub(&batch.tensor(&batch.old)?)?;
            let reg = (diff.sqr()? * (0.5 * cfg.kimi15_tau))?;
            Ok(PgTerm {
                loss_tok: batch.linear(&coef)?.add(&reg)?,
                ratio,
                clipped: none.clone(),
                dual_clipped: none.clone(),
                capped: none,
            })
        }
        PgVariant::Gspo => {
            let (ratio, ratio_val) = sequence_ratio(batch, cfg.gspo_token_grad)?;
            let (loss_tok, clipped, dual_clipped) = clipped_surrogate(
                batch,
                &ratio,
                &ratio_val,
                cfg.gspo_clip_low,
                cfg.gspo_clip_high,
                cfg.dual_clip,
            )?;
            Ok(PgTerm {
                loss_tok,
                ratio: ratio_val,
                clipped,
                dual_clipped,
                capped: none,
            })
        }
        PgVariant::DecoupledPpo => decoupled_ppo_term(batch, cfg),
    }
}

/// [`PgVariant::Topr`]'s term: positive samples (by `seq_scores`, else by each token's
/// advantage) with `w₊`, the others with `w₋` and their ratio truncated to `[0, 1]`.
fn topr_term(batch: &Batch<'_>, cfg: &LossConfig, seq_scores: Option<&[f64]>) -> Result<PgTerm> {
    let n = batch.lp_val.len();
    let valid = |t: usize| batch.mask[t] > 0.0;
    let (_, ratio) = batch.token_ratio()?;
    let positive: Vec<bool> = match seq_scores {
        Some(scores) => {
            batch.layout.check_seqs("seq_scores", scores.len())?;
            batch
                .layout
                .seq_ids()
                .iter()
                .map(|&i| scores[i as usize] > 0.0)
                .collect()
        }
        None => batch.adv.iter().map(|&a| a > 0.0).collect(),
    };
    let coef: Vec<f64> = (0..n)
        .map(|t| {
            if positive[t] {
                -cfg.topr_positive_weight * batch.adv[t]
            } else {
                -cfg.topr_negative_weight * ratio[t].clamp(0.0, 1.0) * batch.adv[t]
            }
        })
        .collect();
    let clipped = (0..n)
        .map(|t| valid(t) && !positive[t] && ratio[t] > 1.0)
        .collect();
    PgTerm::linear(batch, &coef, ratio, clipped)
}

/// [`PgVariant::Cispo`]'s term: the clipped importance weight, detached, on every token
/// (0 where the unified mask drops it).
fn cispo_term(batch: &Batch<'_>, cfg: &LossConfig) -> Result<PgTerm> {
    let n = batch.lp_val.len();
    let valid = |t: usize| batch.mask[t] > 0.0;
    let (_, ratio) = batch.token_ratio()?;
    let (lo, hi) = (1.0 - cfg.cispo_clip_low, 1.0 + cfg.cispo_clip_high);
    let coef: Vec<f64> = (0..n)
        .map(|t| {
            let (r, a) = (ratio[t], batch.adv[t]);
            let dropped = cfg.cispo_unified_mask && ((a > 0.0 && r > hi) || (a < 0.0 && r < lo));
            if dropped {
                0.0
            } else {
                -r.clamp(lo, hi) * a
            }
        })
        .collect();
    let clipped = (0..n)
        .map(|t| valid(t) && (ratio[t] < lo || ratio[t] > hi))
        .collect();
    PgTerm::linear(batch, &coef, ratio, clipped)
}

/// [`PgVariant::DecoupledPpo`]'s term: PPO's clipped surrogate times the detached behaviour
/// weight `π_old/π_behav` (capped, or from rejection sampling).
fn decoupled_ppo_term(batch: &Batch<'_>, cfg: &LossConfig) -> Result<PgTerm> {
    let n = batch.lp_val.len();
    let valid = |t: usize| batch.mask[t] > 0.0;
    let (ratio, ratio_val) = batch.token_ratio()?;
    let (loss_tok, clipped, dual_clipped) = clipped_surrogate(
        batch,
        &ratio,
        &ratio_val,
        cfg.clip_low,
        cfg.clip_high,
        cfg.dual_clip,
    )?;
    let (weight, capped) = match &cfg.rejection_sampling {
        Some(rs) => rs.weights(&batch.old, &batch.behav, &batch.mask, batch.layout),
        None => {
            let mut capped = vec![false; n];
            let weight = (0..n)
                .map(|t| {
                    let w = (batch.old[t] - batch.behav[t]).exp();
                    match cfg.behav_imp_weight_cap {
                        Some(cap) if w > cap => {
                            capped[t] = valid(t);
                            0.0
                        }
                        _ => w * batch.mask[t],
                    }
                })
                .collect();
            (weight, capped)
        }
    };
    Ok(PgTerm {
        loss_tok: loss_tok.mul(&batch.tensor(&weight)?)?,
        ratio: ratio_val,
        clipped,
        dual_clipped,
        capped,
    })
}

/// Checks that `t` is 1-D with `n` elements.
fn check_vec(name: &'static str, t: &Tensor, n: usize) -> Result<()> {
    if t.rank() != 1 {
        return Err(TrainError::Rank {
            name,
            shape: t.dims().to_vec(),
        });
    }
    if t.dim(0)? != n {
        return Err(TrainError::Length {
            name,
            expected: n,
            got: t.dim(0)?,
        });
    }
    Ok(())
}

/// Host values of `t` with masked entries replaced by 0.
fn masked_values(t: &Tensor, mask: &[f64]) -> Result<Vec<f64>> {
    let mut v = to_f64_vec(t)?;
    for (v, &m) in v.iter_mut().zip(mask) {
        if m == 0.0 {
            *v = 0.0;
        }
    }
    Ok(v)
}

fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

/// Mean of `values` over valid tokens (`default` when there are none).
fn masked_mean(values: &[f64], mask: &[f64], default: f64) -> f64 {
    let n: f64 = mask.iter().sum();
    if n > 0.0 {
        values.iter().zip(mask).map(|(v, m)| v * m).sum::<f64>() / n
    } else {
        default
    }
}

/// `Σ_t w_t·x_t` on the host.
fn weighted_mean(values: &[f64], weights: &[f64]) -> f64 {
    values.iter().zip(weights).map(|(v, w)| v * w).sum()
}

fn frac(flags: &[bool], n_valid: f64) -> f64 {
    if n_valid > 0.0 {
        flags.iter().filter(|&&f| f).count() as f64 / n_valid
    } else {
        0.0
    }
}

/// An optional input `name` of [`policy_loss`]: checked to have `n` tokens and returned
/// when `needed` (missing, an error saying `because`), ignored otherwise.
fn needed_input<'a>(
    input: Option<&'a Tensor>,
    needed: bool,
    name: &'static str,
    because: &'static str,
    n: usize,
) -> Result<Option<&'a Tensor>> {
    match (input, needed) {
        (Some(t), true) => {
            check_vec(name, t, n)?;
            Ok(Some(t))
        }
        (None, true) => Err(TrainError::MissingInput { name, because }),
        (_, false) => Ok(None),
    }
}

/// The batch the variants see: `inputs`' log-probs (with `old_logp` as π_old) and
/// advantages zeroed outside `mask`; and `keep`, the mask as a condition tensor.
fn masked_batch<'a>(
    inputs: &PolicyLossInputs<'_>,
    old_logp: &Tensor,
    mask: Vec<f64>,
    layout: &'a SeqLayout,
    n: usize,
) -> Result<(Batch<'a>, Tensor)> {
    let logp = inputs.logp;
    let device = logp.device().clone();
    let dtype = logp.dtype();
    let keep = Tensor::from_vec(
        mask.iter().map(|&m| u8::from(m > 0.0)).collect::<Vec<u8>>(),
        n,
        &device,
    )?;
    let lp = keep.where_cond(logp, &logp.zeros_like()?)?;
    let batch = Batch {
        lp_val: to_f64_vec(&lp)?,
        lp,
        old: masked_values(old_logp, &mask)?,
        behav: masked_values(inputs.behav_logp, &mask)?,
        adv: masked_values(inputs.adv, &mask)?,
        mask,
        layout,
        device,
        dtype,
    };
    Ok((batch, keep))
}

/// The largest and smallest of `ratio` over the tokens `mask` keeps; 1 and 1 when
/// `n_valid` is 0.
fn ratio_range(ratio: &[f64], mask: &[f64], n_valid: f64) -> (f64, f64) {
    let valid_ratios = ratio
        .iter()
        .zip(mask)
        .filter(|(_, &m)| m > 0.0)
        .map(|(&r, _)| r);
    if n_valid > 0.0 {
        valid_ratios.fold((f64::MIN, f64::MAX), |(hi, lo), r| (hi.max(r), lo.min(r)))
    } else {
        (1.0, 1.0)
    }
}

/// The policy loss of `cfg` on one packed batch: the scalar to differentiate and detached
/// metrics. See the module documentation for the formula and [`PgVariant`] for each variant.
pub fn policy_loss(inputs: &PolicyLossInputs<'_>, cfg: &LossConfig) -> Result<LossOutput> {
    cfg.validate()?;
    let logp = inputs.logp;
    if logp.rank() != 1 {
        return Err(TrainError::Rank {
            name: "logp",
            shape: logp.dims().to_vec(),
        });
    }
    let n = logp.dim(0)?;
    if n == 0 {
        return Err(TrainError::EmptyBatch);
    }
    let layout = SeqLayout::new(inputs.seq_offsets, n)?;
    check_vec("old_logp", inputs.old_logp, n)?;
    check_vec("behav_logp", inputs.behav_logp, n)?;
    check_vec("adv", inputs.adv, n)?;
    check_vec("mask", inputs.mask, n)?;
    let ref_logp = needed_input(
        inputs.ref_logp,
        cfg.kl_coef > 0.0,
        "ref_logp",
        "kl_coef is > 0",
        n,
    )?;
    let entropy = needed_input(
        inputs.entropy,
        cfg.entropy_coef > 0.0,
        "entropy",
        "entropy_coef is > 0",
        n,
    )?;

    let base_mask: Vec<f64> = to_f64_vec(inputs.mask)?
        .into_iter()
        .map(|m| if m != 0.0 { 1.0 } else { 0.0 })
        .collect();
    let old_logp = match cfg.old_policy {
        OldPolicy::Proximal => inputs.old_logp,
        OldPolicy::Behaviour => inputs.behav_logp,
    };
    let old = masked_values(old_logp, &base_mask)?;
    let behav = masked_values(inputs.behav_logp, &base_mask)?;
    let correction = train_infer_correction(&cfg.correction, &old, &behav, &base_mask, &layout)?;
    let (batch, keep) = masked_batch(inputs, old_logp, correction.mask, &layout, n)?;

    let term = pg_term(&batch, cfg, inputs.seq_scores)?;
    let pg_tok = if cfg.correction.is_weight.is_some() {
        term.loss_tok.mul(&batch.tensor(&correction.weight)?)?
    } else {
        term.loss_tok
    };
    let agg_w = cfg.loss_agg.weights(&batch.mask, &layout, cfg.agg_norm_len);
    let pg_loss = weighted_sum(&pg_tok, &agg_w)?;
    let mut total = pg_loss.clone();

    let kl_loss = match ref_logp {
        Some(r) => {
            let r = batch.tensor(&masked_values(r, &batch.mask)?)?;
            let kl = weighted_sum(&cfg.kl_estimator.tensor(&batch.lp, &r)?, &agg_w)?;
            total = total.add(&(&kl * cfg.kl_coef)?)?;
            Some(kl)
        }
        None => None,
    };
    let entropy_agg = match entropy {
        Some(e) => {
            let e = e.to_dtype(batch.dtype)?;
            let e = keep.where_cond(&e, &e.zeros_like()?)?;
            let h = weighted_sum(&e, &agg_w)?;
            total = total.sub(&(&h * cfg.entropy_coef)?)?;
            Some(h)
        }
        None => None,
    };

    let n_valid: f64 = batch.mask.iter().sum();
    let (ratio_max, ratio_min) = ratio_range(&term.ratio, &batch.mask, n_valid);
    let approx_kl: Vec<f64> = (0..n)
        .map(|t| {
            let x = batch.old[t] - batch.lp_val[t];
            x.exp() - x - 1.0
        })
        .collect();
    let n_valid_seqs = layout
        .ranges()
        .filter(|r| batch.mask[r.clone()].iter().any(|&m| m > 0.0))
        .count();
    let metrics = LossMetrics {
        pg_loss: scalar(&pg_loss)?,
        kl_loss: kl_loss.as_ref().map(scalar).transpose()?,
        entropy: entropy_agg.as_ref().map(scalar).transpose()?,
        total_loss: scalar(&total)?,
        clip_frac: frac(&term.clipped, n_valid),
        dual_clip_frac: frac(&term.dual_clipped, n_valid),
        approx_kl: masked_mean(&approx_kl, &batch.mask, 0.0),
        ratio_mean_token: masked_mean(&term.ratio, &batch.mask, 1.0),
        ratio_mean_seq: if n_valid > 0.0 {
            weighted_mean(
                &term.ratio,
                &LossAgg::SeqMeanTokenMean.weights(&batch.mask, &layout, None),
            )
        } else {
            1.0
        },
        ratio_max,
        ratio_min,
        decoupled_cap_frac: frac(&term.capped, n_valid),
        correction_weight_mean: masked_mean(&correction.weight, &batch.mask, 1.0),
        correction_filtered_frac: correction.filtered_frac,
        n_valid_tokens: n_valid as usize,
        n_valid_seqs,
    };
    Ok(LossOutput {
        loss: total,
        metrics,
    })
}
