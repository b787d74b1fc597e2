//! `train.preset`: named algorithm settings (GRPO, DAPO, Dr. GRPO, REINFORCE++, GSPO, LitePPO)
//! that expand to fields of the config, under what the user wrote.
//!
//! A preset is a TOML fragment laid over the built-in defaults *before* the user's file and
//! `--set`s, so anything written explicitly wins and `--dry-run` prints the expanded
//! settings. Each fragment says where its values come from. Two choices are ours, stated
//! once: the PPO-family presets keep the default `pg_variant = "decoupled_ppo"` — PPO's
//! clipped loss times the behaviour weight π_old/π_behav, which equals PPO at α = 0 and keeps
//! α > 0 corrected (GSPO sets its own variant) — and lengths that the papers give in tokens
//! of their models (Dr. GRPO's normaliser, DAPO's L_max) are the run's
//! `rollout.max_new_tokens`.

use serde::{Deserialize, Serialize};

/// A named algorithm. Serialised snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// ROLL's documented GRPO (`docs_roll/.../Algorithms/GRPO.md`): group-normalised
    /// advantages, k3 KL loss 0.001, seq-mean-token-mean, whitened advantages clipped at 2,
    /// rewards clipped at 10, dual clip (ROLL's c = 1 + 2·pg_clip = 1.4).
    Grpo,
    /// DAPO (arXiv 2503.14476; verl's `recipe/dapo`): clip-higher ε_low 0.2 / ε_high 0.28,
    /// token-level loss (token-mean), no KL, soft overlong punishment (L_max = the generation
    /// limit, L_cache = L_max/5, factor 1), dynamic sampling (`buffer.filter =
    /// "zero_variance"`).
    Dapo,
    /// Dr. GRPO (arXiv 2503.20783; verl: `norm_adv_by_std_in_grpo = False`,
    /// `loss_agg_mode = "seq-mean-token-sum-norm"`): advantages `r − mean_g(r)` without the
    /// std, losses summed and divided by a constant (the generation limit), no KL.
    DrGrpo,
    /// ROLL's documented REINFORCE++ (`Reinforce_Plus_Plus.md`): token returns from rewards
    /// normalised by the batch mean and std, no advantage whitening, rewards clipped at 10,
    /// advantages at 2, k3 KL loss 0.001, seq-mean-token-mean, dual clip 1.4.
    ReinforcePp,
    /// GSPO (arXiv 2507.18071; ROLL `GSPO.md`): the sequence-level ratio, clipped to
    /// [1 − 3e-4, 1 + 4e-4], group-normalised advantages, seq-mean-token-mean.
    Gspo,
    /// LitePPO (arXiv 2508.08221; ROLL `LitePPO.md`): group-mean / batch-std reward
    /// normalisation and a token-level loss (token-mean), the PPO clip 0.2, nothing else.
    LitePpo,
}

impl Preset {
    /// The fragment of the config this preset sets, as TOML text. `max_new_tokens` is the
    /// run's generation limit.
    pub fn fragment(self, max_new_tokens: usize) -> String {
        match self {
            Preset::Grpo => r#"
[train.advantage]
name = "grpo"
norm_by_std = true
[train.loss]
loss_agg = "seq_mean_token_mean"
clip_low = 0.2
clip_high = 0.2
dual_clip = 1.4
kl_coef = 0.001
kl_estimator = "k3"
[train.shaping]
whiten_advantages = true
advantage_clip = 2.0
reward_clip = 10.0
"#
            .to_string(),
            Preset::Dapo => r#"
[buffer]
filter = "zero_variance"
[train.advantage]
name = "grpo"
norm_by_std = true
[train.loss]
loss_agg = "token_mean"
clip_low = 0.2
clip_high = 0.28
kl_coef = 0.0
[train.shaping.overlong]
penalty_factor = 1.0
"#
            .to_string(),
            Preset::DrGrpo => format!(
                r#"
[train.advantage]
name = "grpo"
norm_by_std = false
[train.loss]
loss_agg = "seq_mean_token_sum_norm"
agg_norm_len = {max_new_tokens}
clip_low = 0.2
clip_high = 0.2
kl_coef = 0.0
"#
            ),
            Preset::ReinforcePp => r#"
[train.advantage]
name = "reinforce_plus_plus"
gamma = 1.0
whiten = false
[train.loss]
loss_agg = "seq_mean_token_mean"
clip_low = 0.2
clip_high = 0.2
dual_clip = 1.4
kl_coef = 0.001
kl_estimator = "k3"
[train.shaping]
norm_mean_type = "batch"
norm_std_type = "batch"
reward_clip = 10.0
advantage_clip = 2.0
whiten_advantages = false
"#
            .to_string(),
            Preset::Gspo => r#"
[train.advantage]
name = "grpo"
norm_by_std = true
[train.loss]
pg_variant = "gspo"
loss_agg = "seq_mean_token_mean"
gspo_clip_low = 3e-4
gspo_clip_high = 4e-4
"#
            .to_string(),
            Preset::LitePpo => r#"
[train.advantage]
name = "reinforce_plus_plus"
gamma = 1.0
whiten = false
[train.loss]
loss_agg = "token_mean"
clip_low = 0.2
clip_high = 0.2
[train.shaping]
norm_mean_type = "group"
norm_std_type = "batch"
"#
            .to_string(),
        }
    }

    /// The fragment as a TOML table (the fragments are constants; a parse failure is a bug
    /// reported as the string it failed on).
    pub fn table(self, max_new_tokens: usize) -> Result<toml::Table, String> {
        self.fragment(max_new_tokens)
            .parse::<toml::Table>()
            .map_err(|e| format!("preset {self:?} does not parse: {e}"))
    }

    /// Every preset, for tests and docs.
    pub const ALL: [Preset; 6] = [
        Preset::Grpo,
        Preset::Dapo,
        Preset::DrGrpo,
        Preset::ReinforcePp,
        Preset::Gspo,
        Preset::LitePpo,
    ];
}

/// One line describing the resolved algorithm (what `--dry-run` prints as a comment).
pub fn describe(learner: &rollflash_trainer::learner::LearnerConfig) -> String {
    let l = &learner.loss;
    let s = &learner.shaping;
    let mut out = format!(
        "algorithm: advantage {:?}; loss {:?} (clip {}/{}{}), agg {:?}{}",
        learner.advantage,
        l.pg_variant,
        l.clip_low,
        l.clip_high,
        l.dual_clip
            .map(|c| format!(", dual clip {c}"))
            .unwrap_or_default(),
        l.loss_agg,
        l.agg_norm_len
            .map(|n| format!(" (L = {n})"))
            .unwrap_or_default(),
    );
    if l.kl_coef > 0.0 {
        out.push_str(&format!("; KL loss {} × {:?}", l.kl_coef, l.kl_estimator));
    }
    if let Some(rs) = &l.rejection_sampling {
        out.push_str(&format!("; rejection sampling {rs:?}"));
    } else if l.pg_variant == rollflash_train::PgVariant::DecoupledPpo {
        out.push_str(&format!("; behaviour cap {:?}", l.behav_imp_weight_cap));
    }
    if l.correction.is_active() {
        out.push_str(&format!("; correction {:?}", l.correction));
    }
    if s.is_active() {
        out.push_str(&format!("; shaping {s:?}"));
    }
    out
}
