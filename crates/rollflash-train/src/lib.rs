//! `rollflash-train`: the math of an RL post-training step — advantage estimators and
//! policy-gradient losses — as a library.
//!
//! - [`advantage`]: GRPO, RLOO, REINFORCE++ (and -baseline) and GiGPO on plain `f64` data,
//!   with sequence → token broadcast and batch whitening.
//! - [`gigpo`]: GiGPO's step-level advantages for multi-turn trajectories (verl-agent's
//!   anchor-state groups), and the cutting of a trajectory into its turns.
//! - [`shaping`]: ROLL's reward normalisation (group / batch / running mean and std), reward
//!   and advantage clipping, advantage whitening for every estimator, DAPO's soft overlong
//!   punishment — around any estimator.
//! - [`loss`]: [`policy_loss`] on packed candle tensors: vanilla PG, PPO (asymmetric and dual
//!   clip), TIS, TOPR, CISPO, Kimi 1.5, GSPO and AReaL's decoupled PPO (its behaviour-weight cap or rejection sampling), with ROLL's
//!   train–inference correction ([`correction`]), a KL-to-reference term ([`kl`]) and an
//!   entropy bonus, aggregated by any of ROLL / verl's modes ([`agg`]).
//!
//! Every definition follows a published implementation (alibaba/ROLL first, AReaL for
//! decoupled PPO); each item's documentation gives its formula and where it comes from, and
//! the integration tests check values and gradients against an independent float64 NumPy
//! reference (`scripts/reference_losses.py`).

pub mod advantage;
pub mod agg;
pub mod correction;
pub mod error;
pub mod gigpo;
pub mod kl;
pub mod layout;
pub mod loss;
pub mod shaping;

pub use advantage::{compute_advantages, AdvantageBatch, AdvantageEstimator};
pub use agg::LossAgg;
pub use correction::{CorrectionConfig, CorrectionFilter, CorrectionLevel, IsWeightConfig};
pub use error::{Result, TrainError};
pub use gigpo::{GigpoMode, GigpoStats, Turn};
pub use kl::KlEstimator;
pub use layout::SeqLayout;
pub use loss::{
    policy_loss, LossConfig, LossMetrics, LossOutput, OldPolicy, PgVariant, PolicyLossInputs,
    RejectionAction, RejectionAgg, RejectionLevel, RejectionMetric, RejectionSampling,
};
pub use shaping::{
    compute_shaped_advantages, compute_shaped_advantages_with, NormScope, OverlongConfig,
    RunningMoments, ShapingConfig,
};
