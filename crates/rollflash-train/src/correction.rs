//! Train–inference correction: reweighting and filtering tokens by how far the policy that
//! *generated* them (the inference engine, `behav_logp`) is from the policy the trainer
//! recomputes at the start of the step (`old_logp`).
//!
//! The two differ because the engine runs other kernels / precision, and in asynchronous
//! training because the sample may come from older weights. ROLL's
//! `roll/utils/train_infer_corrections.py` (`compute_train_infer_correction`) defines it on
//! `log_ratio = old_logp − infer_logp` at several granularities:
//! - `token`: `exp(log_ratio_t)`;
//! - `geometric`: `exp(mean over the sequence's valid tokens of log_ratio)`;
//! - `sequence`: `exp(sum over the sequence's valid tokens of log_ratio)`;
//! - `segment`: `exp(mean of log_ratio over the segment)`, where a *segment* is a maximal run
//!   of consecutive valid tokens — in a multi-turn trajectory, one model turn, the turns being
//!   separated by the environment's (masked) observation tokens. ROLL's
//!   `compute_segment_masked_mean` (`roll/pipeline/agentic/utils.py`), the per-turn
//!   correction; on a single-turn sequence it equals `geometric`.
//!
//! The **IS weight** is that ratio clamped to `[0, upper_bound]`, detached, multiplying the
//! per-token policy loss. **Filters** drop tokens (from the mask) whose ratio — and/or whose
//! probability difference `exp(old) − exp(behav)` aggregated the same way (mean for
//! `geometric`, sum for `sequence`) — falls outside a closed interval. All of this is plain data:
//! neither input carries gradient.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::layout::SeqLayout;

/// At which granularity a correction ratio is computed. Serialised snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionLevel {
    /// Each token on its own.
    #[default]
    Token,
    /// One value per sequence from the *mean* log-ratio (geometric mean of token ratios).
    Geometric,
    /// One value per sequence from the *sum* of log-ratios (the full sequence likelihood
    /// ratio; explodes with length, hence usually clamped hard).
    Sequence,
    /// One value per segment (maximal run of valid tokens: a model turn of a multi-turn
    /// trajectory) from the *mean* log-ratio over the segment.
    Segment,
}

/// The detached importance weight (ROLL `train_infer_correction.is_weight`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IsWeightConfig {
    /// Granularity of the ratio.
    pub level: CorrectionLevel,
    /// Clamp the weight to `[0, upper_bound]` (ROLL default 1.2); `None` leaves it unclamped.
    pub upper_bound: Option<f64>,
}

impl Default for IsWeightConfig {
    fn default() -> Self {
        IsWeightConfig {
            level: CorrectionLevel::Token,
            upper_bound: Some(1.2),
        }
    }
}

/// One filter rule (ROLL `train_infer_correction.filters[i]`): a token is kept only if its
/// statistic lies within every given closed interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CorrectionFilter {
    /// Granularity of the statistic.
    pub level: CorrectionLevel,
    /// Keep where `ratio ∈ [lo, hi]` (ROLL default `[0.8, 1.2]`); `None` disables this test.
    pub ratio_range: Option<[f64; 2]>,
    /// Keep where `exp(old) − exp(behav)` (aggregated at `level`) `∈ [lo, hi]` (ROLL's default
    /// when enabled is `[−0.2, 0.2]`); `None` disables this test.
    pub diff_range: Option<[f64; 2]>,
}

impl Default for CorrectionFilter {
    fn default() -> Self {
        CorrectionFilter {
            level: CorrectionLevel::Token,
            ratio_range: Some([0.8, 1.2]),
            diff_range: None,
        }
    }
}

/// The whole correction: an optional weight and any number of filters. The default does
/// nothing.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CorrectionConfig {
    /// The IS weight multiplying every token's policy loss; `None` = weight 1.
    pub is_weight: Option<IsWeightConfig>,
    /// Filters applied one after the other to the mask.
    pub filters: Vec<CorrectionFilter>,
}

impl CorrectionConfig {
    /// Whether the correction changes anything.
    pub fn is_active(&self) -> bool {
        self.is_weight.is_some() || !self.filters.is_empty()
    }

    /// Checks bounds; errors name the field under `prefix` (e.g. `correction`).
    pub fn validate(&self, prefix: &str) -> Result<()> {
        if let Some(w) = &self.is_weight {
            if let Some(ub) = w.upper_bound {
                if !(ub > 0.0) || !ub.is_finite() {
                    return Err(TrainError::config(
                        format!("{prefix}.is_weight.upper_bound"),
                        format!("{ub} must be > 0"),
                    ));
                }
            }
        }
        for (i, f) in self.filters.iter().enumerate() {
            for (name, range) in [("ratio_range", f.ratio_range), ("diff_range", f.diff_range)] {
                if let Some([lo, hi]) = range {
                    if !(lo <= hi) || !lo.is_finite() || !hi.is_finite() {
                        return Err(TrainError::config(
                            format!("{prefix}.filters[{i}].{name}"),
                            format!("[{lo}, {hi}] is not a finite interval with lo <= hi"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// What a correction does to a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Correction {
    /// Per-token weight (1 where no weight is configured, 0 on masked tokens).
    pub weight: Vec<f64>,
    /// The mask after the filters (0/1).
    pub mask: Vec<f64>,
    /// Fraction of the input's valid tokens that the filters removed.
    pub filtered_frac: f64,
}

/// Statistics per token at one level: `(ratio, diff)`.
fn level_stats(
    level: CorrectionLevel,
    old_logp: &[f64],
    behav_logp: &[f64],
    mask: &[f64],
    layout: &SeqLayout,
) -> (Vec<f64>, Vec<f64>) {
    let n = old_logp.len();
    let log_ratio: Vec<f64> = (0..n).map(|t| old_logp[t] - behav_logp[t]).collect();
    let diff: Vec<f64> = (0..n)
        .map(|t| old_logp[t].exp() - behav_logp[t].exp())
        .collect();
    match level {
        CorrectionLevel::Token => (log_ratio.iter().map(|x| x.exp()).collect(), diff),
        CorrectionLevel::Geometric | CorrectionLevel::Sequence => {
            let mut ratio = vec![1.0; n];
            let mut d = vec![0.0; n];
            for range in layout.ranges() {
                let count: f64 = mask[range.clone()].iter().sum();
                let lr: f64 = range.clone().map(|t| mask[t] * log_ratio[t]).sum();
                let df: f64 = range.clone().map(|t| mask[t] * diff[t]).sum();
                // ROLL's masked_mean / masked_sum return 0 for a sequence with no valid token.
                let (lr, df) = match (level, count > 0.0) {
                    (_, false) => (0.0, 0.0),
                    (CorrectionLevel::Geometric, true) => (lr / count, df / count),
                    _ => (lr, df),
                };
                for t in range {
                    ratio[t] = lr.exp();
                    d[t] = df;
                }
            }
            (ratio, d)
        }
        CorrectionLevel::Segment => {
            let mut ratio = vec![1.0; n];
            let mut d = vec![0.0; n];
            for seg in segments(mask, layout) {
                let count = seg.len() as f64;
                let lr = log_ratio[seg.clone()].iter().sum::<f64>() / count;
                let df = diff[seg.clone()].iter().sum::<f64>() / count;
                for t in seg {
                    ratio[t] = lr.exp();
                    d[t] = df;
                }
            }
            (ratio, d)
        }
    }
}

/// The segments (maximal runs of valid tokens) of every sequence, as token ranges in batch
/// order: the model turns of multi-turn trajectories.
pub fn segments(mask: &[f64], layout: &SeqLayout) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    for range in layout.ranges() {
        let mut t = range.start;
        while t < range.end {
            if mask[t] > 0.0 {
                let start = t;
                while t < range.end && mask[t] > 0.0 {
                    t += 1;
                }
                out.push(start..t);
            } else {
                t += 1;
            }
        }
    }
    out
}

/// Applies `cfg` to a batch: `old_logp` and `behav_logp` per token, `mask` 0/1 per token.
/// Statistics are computed over the *input* mask (as ROLL does, all filters seeing the same
/// statistics), and filters compose by multiplication.
pub fn train_infer_correction(
    cfg: &CorrectionConfig,
    old_logp: &[f64],
    behav_logp: &[f64],
    mask: &[f64],
    layout: &SeqLayout,
) -> Result<Correction> {
    layout.check_tokens("old_logp", old_logp.len())?;
    layout.check_tokens("behav_logp", behav_logp.len())?;
    layout.check_tokens("mask", mask.len())?;
    let weight = match &cfg.is_weight {
        None => mask.to_vec(),
        Some(w) => {
            let (ratio, _) = level_stats(w.level, old_logp, behav_logp, mask, layout);
            ratio
                .iter()
                .zip(mask)
                .map(|(&r, &m)| {
                    let r = match w.upper_bound {
                        Some(ub) => r.clamp(0.0, ub),
                        None => r,
                    };
                    if m > 0.0 {
                        r
                    } else {
                        0.0
                    }
                })
                .collect()
        }
    };
    let mut keep = mask.to_vec();
    for f in &cfg.filters {
        let (ratio, diff) = level_stats(f.level, old_logp, behav_logp, mask, layout);
        for t in 0..keep.len() {
            let in_range =
                |x: f64, r: Option<[f64; 2]>| r.is_none_or(|[lo, hi]| lo <= x && x <= hi);
            if !(in_range(ratio[t], f.ratio_range) && in_range(diff[t], f.diff_range)) {
                keep[t] = 0.0;
            }
        }
    }
    let before: f64 = mask.iter().sum();
    let after: f64 = keep.iter().sum();
    let filtered_frac = if before > 0.0 {
        (before - after) / before
    } else {
        0.0
    };
    Ok(Correction {
        weight,
        mask: keep,
        filtered_frac,
    })
}
