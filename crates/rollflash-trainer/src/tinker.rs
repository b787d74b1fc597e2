//! `TinkerLearner`: the `Learner` over a Tinker server (SkyRL's FSDP/Megatron/JAX
//! backends, hosted Tinker, VeRL-Tinker): the server holds the weights (a LoRA adapter on its
//! base model) and the optimiser; rollflash keeps what Tinker leaves to the client —
//! scheduling, staleness, advantages, the loss's definition.
//!
//! A step: the batch is packed and its advantages computed exactly as the embedded learner
//! does ([`crate::learner::PackedBatch`], [`crate::learner::batch_advantages`]); each
//! trajectory becomes one datum (inputs `tokens[..n-1]`, targets `tokens[1..]`, weight 1 on
//! the model's tokens). Then one of two loss paths ([`TinkerLossPath`]):
//! - **built-in `importance_sampling`**, where our loss equals it: decoupled PPO without a
//!   cap, rejection sampling, correction, KL or entropy term, aggregated `seq-mean-token-mean`.
//!   With one optimiser step per batch the proximal policy is the current one, so decoupled
//!   PPO's per-token loss is `−(π_θ/π_behav)·A` in value and gradient — the server's
//!   `−r·A` with `r = exp(logπ_θ − logπ_behav)` — and SkyRL reduces it per sequence over its
//!   weights, then over sequences: `seq-mean-token-mean`. One `forward_backward`.
//! - **built-in `ppo` / `cispo`**, for PPO (no dual clip) and CISPO (no unified mask)
//!   measured against the behaviour policy (`loss.old_policy = "behaviour"`), which is how
//!   the server defines them; the clip bounds travel as `loss_fn_config`
//!   (`clip_low_threshold = 1 − ε_low`, `clip_high_threshold = 1 + ε_high`).
//! - **custom** for every other loss: a forward pass for the current log-probs `ℓ`, our
//!   `policy_loss` and its gradient `g = ∂L/∂ℓ` computed here (`rollflash-train`, the same
//!   function the embedded learner calls), then a `forward_backward` of the linear surrogate
//!   `importance_sampling` with `logprobs = ℓ` (so the ratio is 1 at the point) and
//!   advantages `−g·S·n_i` (undoing the server's division by the sequence's `n_i` weighted
//!   tokens and the `S` sequences), whose gradient is `Σ_t g_t ∇ℓ_t` = ours. It costs one
//!   extra forward pass per step.
//!
//! Then `optim_step` with the plan's Adam settings (the learning rate of the step's place in
//! the schedule, computed here), and `save_weights_for_sampler`, whose `tinker://` path is
//! the new version's [`WeightUpdate::Remote`]. The controller decides the version; the path's
//! name carries it so a sampler and a log agree. Log-probs on the server are at temperature
//! 1, so the rollout temperature must be 1 (the plan checks). The KL and entropy terms need
//! the reference's and the policy's full distributions, which the protocol does not return:
//! those losses are refused when the learner is built.

use std::time::Duration;

use candle_core::{DType, Device, Tensor, Var};
use rollflash_core::buffer::Batch;
use rollflash_core::{PolicyVersion, Trajectory};
use rollflash_model::train::OptimizerConfig;
use rollflash_rollout::WeightUpdate;
use rollflash_tinker::{
    AdamParams, ClientConfig, Datum, Heartbeat, LoraConfig, TinkerClient, TinkerError,
};
use rollflash_train::advantage::AdvantageEstimator;
use rollflash_train::loss::{policy_loss, LossConfig, OldPolicy, PgVariant, PolicyLossInputs};
use rollflash_train::shaping::{RunningMoments, ShapingConfig};
use rollflash_train::LossAgg;

use crate::controller::{Learner, LearnerError, StepStats};
use crate::learner::{batch_advantages, PackedBatch};

/// How our loss reaches the server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TinkerLossPath {
    /// The server's `importance_sampling` equals our loss (see the module doc).
    BuiltinImportanceSampling,
    /// The server's `ppo` equals our PPO measured against the behaviour policy
    /// (`old_policy = "behaviour"`), with the ratio clipped to
    /// `[clip_low_threshold, clip_high_threshold]` = `[1 − clip_low, 1 + clip_high]`.
    BuiltinPpo {
        clip_low_threshold: f64,
        clip_high_threshold: f64,
    },
    /// The server's `cispo` equals our CISPO against the behaviour policy, its weight
    /// clipped to `[1 − cispo_clip_low, 1 + cispo_clip_high]`.
    BuiltinCispo {
        clip_low_threshold: f64,
        clip_high_threshold: f64,
    },
    /// Our loss's gradient through a linear surrogate (one extra forward pass per step).
    Custom,
}

impl TinkerLossPath {
    /// The path `loss` takes, or why it cannot be trained on a Tinker server.
    ///
    /// A built-in is taken only where it equals our loss in value and gradient: SkyRL and
    /// Tinker define `ppo` and `cispo` on `ρ = exp(target − sampling log-probs)`, the
    /// behaviour policy's ratio, and reduce each datum's token losses by their mean, then
    /// average the datums (`seq-mean-token-mean`); their `ppo` has no dual clip, their
    /// `cispo` no unified mask, and none of them a correction weight or rejection.
    pub fn of(loss: &LossConfig) -> Result<TinkerLossPath, String> {
        if loss.kl_coef > 0.0 {
            return Err(
                "loss.kl_coef > 0 needs the reference policy's log-probs, which a \
                        Tinker server does not return for a frozen copy; use 0"
                    .into(),
            );
        }
        if loss.entropy_coef > 0.0 {
            return Err(
                "loss.entropy_coef > 0 needs the policy's full distribution, which \
                        the Tinker protocol does not return; use 0"
                    .into(),
            );
        }
        // What every built-in shares: its reduction, and nothing weighing or dropping tokens.
        let plain = loss.rejection_sampling.is_none()
            && loss.correction == Default::default()
            && loss.loss_agg == LossAgg::SeqMeanTokenMean;
        let behaviour = loss.old_policy == OldPolicy::Behaviour;
        Ok(match loss.pg_variant {
            PgVariant::DecoupledPpo
                if plain
                    // No cap, or one that never binds (`inf`: TOML has no null).
                    && loss.behav_imp_weight_cap.is_none_or(f64::is_infinite) =>
            {
                TinkerLossPath::BuiltinImportanceSampling
            }
            PgVariant::Ppo if plain && behaviour && loss.dual_clip.is_none() => {
                TinkerLossPath::BuiltinPpo {
                    clip_low_threshold: 1.0 - loss.clip_low,
                    clip_high_threshold: 1.0 + loss.clip_high,
                }
            }
            PgVariant::Cispo if plain && behaviour && !loss.cispo_unified_mask => {
                TinkerLossPath::BuiltinCispo {
                    clip_low_threshold: 1.0 - loss.cispo_clip_low,
                    clip_high_threshold: 1.0 + loss.cispo_clip_high,
                }
            }
            _ => TinkerLossPath::Custom,
        })
    }

    /// The server's loss function this path sends, with its `loss_fn_config`.
    fn loss_fn(self) -> (&'static str, Vec<(String, f64)>) {
        let clip = |lo: f64, hi: f64| {
            vec![
                ("clip_low_threshold".to_string(), lo),
                ("clip_high_threshold".to_string(), hi),
            ]
        };
        match self {
            // The custom path's surrogate is an importance_sampling pass too.
            TinkerLossPath::BuiltinImportanceSampling | TinkerLossPath::Custom => {
                ("importance_sampling", Vec::new())
            }
            TinkerLossPath::BuiltinPpo {
                clip_low_threshold,
                clip_high_threshold,
            } => ("ppo", clip(clip_low_threshold, clip_high_threshold)),
            TinkerLossPath::BuiltinCispo {
                clip_low_threshold,
                clip_high_threshold,
            } => ("cispo", clip(clip_low_threshold, clip_high_threshold)),
        }
    }

    /// For people (`--dry-run`).
    pub fn describe(self) -> String {
        match self {
            TinkerLossPath::BuiltinImportanceSampling => {
                "the server's importance_sampling loss (equal to this decoupled PPO: one pass)"
                    .into()
            }
            TinkerLossPath::BuiltinPpo {
                clip_low_threshold,
                clip_high_threshold,
            } => format!(
                "the server's ppo loss, ratio clipped to [{clip_low_threshold}, \
                 {clip_high_threshold}] (equal to this PPO against the behaviour policy: one pass)"
            ),
            TinkerLossPath::BuiltinCispo {
                clip_low_threshold,
                clip_high_threshold,
            } => format!(
                "the server's cispo loss, weight clipped to [{clip_low_threshold}, \
                 {clip_high_threshold}] (equal to this CISPO against the behaviour policy: one pass)"
            ),
            TinkerLossPath::Custom => {
                "rollflash's loss through a linear surrogate (a forward pass, then \
                 importance_sampling with our gradient as advantages: two passes)"
                    .into()
            }
        }
    }
}

/// Settings of a [`TinkerLearner`].
#[derive(Debug, Clone)]
pub struct TinkerLearnerConfig {
    /// The server, its key and deadlines.
    pub client: ClientConfig,
    /// The model to train (`None`: the server's first supported model).
    pub base_model: Option<String>,
    /// The LoRA adapter's rank, and its initialisation seed.
    pub lora_rank: u32,
    pub seed: u64,
    /// Adam's settings and the learning-rate schedule (warm-up, cosine), computed here and
    /// sent with each step. The server applies no gradient clipping of ours.
    pub optimizer: OptimizerConfig,
    pub loss: LossConfig,
    pub advantage: AdvantageEstimator,
    pub shaping: ShapingConfig,
    /// How often the session is kept alive (SkyRL drops sessions silent for 300 s).
    pub heartbeat: Duration,
    /// Force the custom path even where the built-in one is equal (to check one against the
    /// other); `false` lets the loss decide ([`TinkerLossPath::of`]).
    pub force_custom: bool,
    /// How long to wait for a server that lost the model (died, restarted) to come back
    /// before rejoining it: a fresh model loads the state saved after the last step (saved
    /// every step when this is set) and the failed step runs again. `None`: the step's
    /// error stops the run.
    pub rejoin: Option<Duration>,
}

/// The learner of a run whose trainer is a Tinker server.
pub struct TinkerLearner {
    cfg: TinkerLearnerConfig,
    path: TinkerLossPath,
    rt: tokio::runtime::Handle,
    client: TinkerClient,
    session: String,
    /// The model trained (the server's name for it).
    base_model: String,
    model_id: String,
    /// Counts the model's requests from 1: the server's idempotency key, so a resent
    /// forward_backward or optim_step is not applied twice.
    seq: i32,
    steps: usize,
    running: RunningMoments,
    heartbeat: Option<Heartbeat>,
    /// With `rejoin`: the state saved after the last step (or at the start), which a fresh
    /// model loads when the server has lost ours.
    rejoin_state: Option<String>,
    /// Times the learner rejoined a server that had lost its model.
    rejoins: usize,
    /// The version whose sampler weights it saved last (`None`: none yet; samplers are on
    /// the base model, which a restarted server still has).
    published: Option<PolicyVersion>,
    /// With `rejoin`: the server failed to answer an idle check or a heartbeat since the
    /// model was (re)built, so it may have restarted and lost the model.
    unreachable: bool,
    /// The heartbeat's failures already seen by an idle check.
    beats_failed: u64,
}

impl std::fmt::Debug for TinkerLearner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerLearner")
            .field("url", &self.cfg.client.base_url)
            .field("model_id", &self.model_id)
            .field("path", &self.path)
            .finish()
    }
}

fn remote(e: TinkerError) -> LearnerError {
    LearnerError::Other(Box::new(e))
}

impl TinkerLearner {
    /// Opens a session and a LoRA training model on the server. Must be called inside a
    /// tokio runtime (the learner's steps run on blocking threads and call back into it).
    pub async fn connect(cfg: TinkerLearnerConfig) -> Result<TinkerLearner, LearnerError> {
        Self::open(cfg, None).await
    }

    /// Continues a run from a training state saved on the server ([`Self::save_state`]):
    /// opens a session and a fresh LoRA model, loads the state (adapter and Adam moments)
    /// into it — the model's first request, as `load_state` must be — and saves its weights
    /// for sampling as `version`. Returns the learner, `steps` optimiser steps in (the
    /// learning-rate schedule's position), with `running` reward statistics, and the update
    /// that gives the samplers the resumed weights.
    pub async fn resume(
        cfg: TinkerLearnerConfig,
        state_path: &str,
        steps: usize,
        running: Option<RunningMoments>,
        version: PolicyVersion,
    ) -> Result<(TinkerLearner, WeightUpdate), LearnerError> {
        let mut l = Self::open(cfg, Some(state_path)).await?;
        l.steps = steps;
        l.published = Some(version);
        if let Some(r) = running {
            r.validate()
                .map_err(|e| LearnerError::other(e.to_string()))?;
            l.running = r;
        }
        let uri = l
            .client
            .save_weights_for_sampler(&l.model_id, &sampler_name(version))
            .await
            .map_err(remote)?;
        Ok((l, WeightUpdate::Remote { uri, version }))
    }

    async fn open(
        cfg: TinkerLearnerConfig,
        state: Option<&str>,
    ) -> Result<TinkerLearner, LearnerError> {
        let path = match TinkerLossPath::of(&cfg.loss).map_err(LearnerError::other)? {
            _ if cfg.force_custom => TinkerLossPath::Custom,
            p => p,
        };
        cfg.loss.validate()?;
        cfg.shaping.validate()?;
        let client = TinkerClient::new(cfg.client.clone()).map_err(remote)?;
        let base_model = match &cfg.base_model {
            Some(m) => m.clone(),
            None => client
                .capabilities()
                .await
                .map_err(remote)?
                .supported_models
                .into_iter()
                .find_map(|m| m.model_name)
                .ok_or_else(|| {
                    LearnerError::other(format!(
                        "Tinker server {} lists no supported model",
                        cfg.client.base_url
                    ))
                })?,
        };
        let session = client
            .create_session(vec!["rollflash".into()])
            .await
            .map_err(remote)?;
        let model = client
            .create_model(
                &session,
                0,
                &base_model,
                LoraConfig::new(cfg.lora_rank, Some(cfg.seed as i64)),
            )
            .await
            .map_err(remote)?;
        if let Some(path) = state {
            client
                .load_state(&model.model_id, path, true)
                .await
                .map_err(remote)?;
        }
        let heartbeat = Heartbeat::spawn(client.counted_apart(), session.clone(), cfg.heartbeat);
        let mut l = TinkerLearner {
            path,
            rt: tokio::runtime::Handle::current(),
            client,
            session,
            base_model,
            model_id: model.model_id,
            seq: 0,
            steps: 0,
            running: RunningMoments::default(),
            heartbeat: Some(heartbeat),
            rejoin_state: state.map(str::to_string),
            rejoins: 0,
            published: None,
            unreachable: false,
            beats_failed: 0,
            cfg,
        };
        if l.cfg.rejoin.is_some() && l.rejoin_state.is_none() {
            l.rejoin_state = Some(l.save_rejoin_state("start").await?);
        }
        Ok(l)
    }

    /// Times the learner rejoined a server that had lost its model.
    pub fn rejoins(&self) -> usize {
        self.rejoins
    }

    async fn save_rejoin_state(&self, name: &str) -> Result<String, LearnerError> {
        self.client
            .save_state(&self.model_id, name)
            .await
            .map_err(remote)
    }

    /// After a step that failed on the server's side (not a request of ours it refused as
    /// malformed): waits (up to `cfg.rejoin`) for the server to answer, frees the old
    /// model's slot where it still has it, and opens a new session and a fresh model that
    /// loads the state saved after the last step. A restarted SkyRL still lists the old
    /// model (its database) but has lost it (its engine's memory), so the learner cannot ask
    /// whether it was lost; it always starts again from the saved state, which is the same
    /// adapter and moments either way. A server not back in time ends with `cause`.
    async fn rejoin(&mut self, cause: LearnerError) -> Result<(), LearnerError> {
        let (Some(limit), Some(state)) = (self.cfg.rejoin, self.rejoin_state.clone()) else {
            return Err(cause);
        };
        if let LearnerError::Other(e) = &cause {
            if let Some(TinkerError::InvalidInput { .. }) = e.downcast_ref::<TinkerError>() {
                return Err(cause);
            }
        }
        let url = self.cfg.client.base_url.clone();
        let deadline = tokio::time::Instant::now() + limit;
        tracing::warn!(server = %url, error = %rollflash_core::error_chain(&cause), "the Tinker server may have lost the model; waiting for it to rejoin it");
        while self.client.healthz().await.is_err() {
            if tokio::time::Instant::now() >= deadline {
                return Err(LearnerError::other(format!(
                    "the Tinker server {url} did not come back within {:.0} s \
                     (learner.rejoin_secs): {cause}",
                    limit.as_secs_f64()
                )));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // Best effort: a server that kept the model would otherwise hold two of its slots.
        // Bounded apart from the call's own deadline: freeing the slot must not hold up the
        // rejoin.
        match tokio::time::timeout(UNLOAD_WAIT, self.client.unload_model(&self.model_id)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(model = %self.model_id, error = %rollflash_core::error_chain(&e), "old model not unloaded")
            }
            Err(_) => tracing::debug!(model = %self.model_id, "old model's unload unanswered"),
        }
        if let Some(h) = self.heartbeat.take() {
            h.stop().await;
        }
        let session = self
            .client
            .create_session(vec!["rollflash".into()])
            .await
            .map_err(remote)?;
        let model = self
            .client
            .create_model(
                &session,
                0,
                &self.base_model,
                LoraConfig::new(self.cfg.lora_rank, Some(self.cfg.seed as i64)),
            )
            .await
            .map_err(remote)?;
        self.client
            .load_state(&model.model_id, &state, true)
            .await
            .map_err(remote)?;
        tracing::warn!(
            server = %url,
            old = %self.model_id,
            new = %model.model_id,
            state = %state,
            "rejoined the Tinker server: a fresh model loaded the last step's state"
        );
        self.heartbeat = Some(Heartbeat::spawn(
            self.client.counted_apart(),
            session.clone(),
            self.cfg.heartbeat,
        ));
        self.session = session;
        self.model_id = model.model_id;
        self.seq = 0;
        self.rejoins += 1;
        self.unreachable = false;
        self.beats_failed = 0;
        Ok(())
    }

    /// While the controller waits for a batch: a server that could not be reached (by this
    /// check or a heartbeat) since the model was built may have restarted and lost the
    /// model, which its samplers then cannot load either, so nothing would ever train
    /// again. Once it answers, the learner rejoins it ([`Self::rejoin`]) and saves the
    /// last published version's sampler weights again, for the fleet to catch up to. A
    /// server that was only briefly out of reach costs one `load_state` of the same state.
    async fn look_after(&mut self) -> Result<Option<WeightUpdate>, LearnerError> {
        if self.cfg.rejoin.is_none() {
            return Ok(None);
        }
        let beats = self.heartbeat.as_ref().map_or(0, Heartbeat::failures);
        if beats > self.beats_failed {
            self.beats_failed = beats;
            self.unreachable = true;
        }
        let up = matches!(
            tokio::time::timeout(IDLE_CHECK_DEADLINE, self.client.healthz()).await,
            Ok(Ok(_))
        );
        if !up {
            if !self.unreachable {
                tracing::warn!(server = %self.cfg.client.base_url, "the Tinker server does not answer while the learner waits for a batch");
            }
            self.unreachable = true;
            return Ok(None);
        }
        if !self.unreachable {
            return Ok(None);
        }
        let cause = LearnerError::other(format!(
            "the Tinker server {} was out of reach while the learner waited for a batch",
            self.cfg.client.base_url
        ));
        self.rejoin(cause).await?;
        let Some(version) = self.published else {
            return Ok(None);
        };
        let uri = self
            .client
            .save_weights_for_sampler(&self.model_id, &sampler_name(version))
            .await
            .map_err(remote)?;
        Ok(Some(WeightUpdate::Remote { uri, version }))
    }

    /// The loss path the steps take.
    pub fn loss_path(&self) -> TinkerLossPath {
        self.path
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.cfg.client.base_url
    }

    /// The session the learner keeps alive.
    pub fn session_id(&self) -> &str {
        &self.session
    }

    /// The server's id of the model being trained.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Optimiser steps taken.
    pub fn steps_taken(&self) -> usize {
        self.steps
    }

    /// ROLL's running reward statistics after the last step, when `running` normalisation
    /// is on (`None` otherwise: there is nothing to carry), as the embedded learner's.
    pub fn running_moments(&self) -> Option<RunningMoments> {
        self.cfg.shaping.uses_running().then_some(self.running)
    }

    /// Saves the training state (adapter and Adam moments) on the server under `name`;
    /// returns the path `load_state` takes.
    /// Blocks: call it from a blocking thread (or inside `block_in_place`).
    pub fn save_state(&self, name: &str) -> Result<String, LearnerError> {
        self.rt
            .block_on(self.client.save_state(&self.model_id, name))
            .map_err(remote)
    }

    /// Frees the model's slot on the server and stops the heartbeat.
    pub async fn close(mut self) -> Result<(), LearnerError> {
        if let Some(h) = self.heartbeat.take() {
            let beats = h.stop().await;
            if beats.failed > 0 {
                tracing::warn!(
                    server = %self.cfg.client.base_url,
                    failed = beats.failed,
                    sent = beats.sent,
                    last = beats.last_error.as_deref().unwrap_or(""),
                    "session heartbeats failed during the run"
                );
            }
        }
        self.client
            .unload_model(&self.model_id)
            .await
            .map_err(remote)
    }

    fn next_seq(&mut self) -> i32 {
        self.seq += 1;
        self.seq
    }

    /// One pass of the path's server loss over `data`: `forward_backward` accumulating its
    /// gradient, or a forward-only pass (for the current log-probs).
    async fn pass(
        &mut self,
        data: &[Datum],
        backward: bool,
    ) -> Result<rollflash_tinker::ForwardOutput, LearnerError> {
        let seq = self.next_seq();
        let (loss_fn, config) = self.path.loss_fn();
        let call = if backward {
            self.client
                .forward_backward(&self.model_id, seq, data, loss_fn, &config)
                .await
        } else {
            self.client
                .forward(&self.model_id, seq, data, loss_fn)
                .await
        };
        call.map_err(remote)
    }

    // Long on purpose: one remote step in the order the server sees it (forward/backward by
    // loss path, optimizer step, sampler save, rejoin state), sharing the packed batch, the
    // `datum_of` closure over it and the metrics list; the two loss paths are one match.
    async fn step(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError> {
        let started = std::time::Instant::now();
        let traffic = self.client.traffic();
        let packed = PackedBatch::new(batch)?;
        let advs = batch_advantages(
            &self.cfg.advantage,
            &self.cfg.shaping,
            &packed,
            None,
            self.running,
        )?;
        // One datum per sequence with model tokens; the loss's layout keeps only those.
        let kept: Vec<usize> = (0..packed.n_seq())
            .filter(|&i| {
                packed.mask[packed.offsets[i]..packed.offsets[i + 1]]
                    .iter()
                    .any(|&m| m)
            })
            .collect();
        let datum_of = |i: usize, logprobs: &[f32], adv: &[f32]| {
            let (s, e) = (packed.offsets[i], packed.offsets[i + 1]);
            let toks = packed.seqs[i];
            Datum::policy_gradient(
                toks[..toks.len() - 1].iter().map(|&t| t as i32).collect(),
                toks[1..].iter().map(|&t| i64::from(t)).collect(),
                logprobs[s + 1..e].to_vec(),
                adv[s + 1..e].to_vec(),
                Some(
                    packed.mask[s + 1..e]
                        .iter()
                        .map(|&m| if m { 1.0 } else { 0.0 })
                        .collect(),
                ),
            )
        };
        let mut metrics = Vec::new();
        let (loss, behav_kl) = match self.path {
            TinkerLossPath::BuiltinImportanceSampling
            | TinkerLossPath::BuiltinPpo { .. }
            | TinkerLossPath::BuiltinCispo { .. } => {
                let adv: Vec<f32> = advs.advantages.iter().map(|&a| a as f32).collect();
                let data: Vec<Datum> = kept
                    .iter()
                    .map(|&i| datum_of(i, &packed.behav, &adv))
                    .collect();
                let out = self.pass(&data, true).await?;
                let current = current_logprobs(&packed, &kept, &out.outputs)?;
                // The server's own value of the loss (its per-token losses, reduced as it
                // reduces them): ours must agree, which the tests check.
                metrics.push((
                    "server_loss".to_string(),
                    server_loss(&packed, &kept, &out.outputs),
                ));
                let ours = loss_at(
                    &packed,
                    &kept,
                    &current,
                    &advs.advantages,
                    &self.cfg.loss,
                    false,
                )?;
                metrics.extend(ours.metrics);
                (ours.value, mismatch(&packed, &current))
            }
            TinkerLossPath::Custom => {
                // The current log-probs: a forward pass (weights 0 everywhere: no loss).
                let zeros = vec![0f32; packed.total()];
                let probe: Vec<Datum> = kept
                    .iter()
                    .map(|&i| datum_of(i, &packed.behav, &zeros))
                    .collect();
                let fwd = self.pass(&probe, false).await?;
                let current = current_logprobs(&packed, &kept, &fwd.outputs)?;
                let ours = loss_at(
                    &packed,
                    &kept,
                    &current,
                    &advs.advantages,
                    &self.cfg.loss,
                    true,
                )?;
                metrics.extend(ours.metrics);
                let loss = ours.value;
                // The surrogate's advantages, at ratio 1 (its log-probs are the current ones).
                let adv = surrogate_advantages(&packed, &kept, &ours.grad.unwrap_or_default());
                let data: Vec<Datum> = kept.iter().map(|&i| datum_of(i, &current, &adv)).collect();
                self.pass(&data, true).await?;
                (loss, mismatch(&packed, &current))
            }
        };
        let o = &self.cfg.optimizer;
        let lr = o.lr_at(self.steps);
        let adam = AdamParams {
            learning_rate: lr,
            beta1: o.beta1,
            beta2: o.beta2,
            eps: o.eps,
            weight_decay: o.weight_decay,
            grad_clip_norm: o.max_grad_norm.unwrap_or(0.0),
        };
        let seq = self.next_seq();
        let opt = self
            .client
            .optim_step(&self.model_id, seq, adam)
            .await
            .map_err(remote)?;
        let version = batch.version.next();
        let uri = self
            .client
            .save_weights_for_sampler(&self.model_id, &sampler_name(version))
            .await
            .map_err(remote)?;
        if self.cfg.rejoin.is_some() {
            // Two names in turn: the previous state stays whole while the next is written.
            let name = format!("rejoin-{}", version.0 % 2);
            self.rejoin_state = Some(self.save_rejoin_state(&name).await?);
        }
        self.steps += 1;
        self.published = Some(version);
        self.running = advs.running;
        metrics.push(("behav_kl".to_string(), behav_kl));
        if let Some(g) = opt
            .iter()
            .find(|(k, _)| k.ends_with("grad_norm"))
            .map(|(_, v)| *v)
        {
            metrics.push(("grad_norm".to_string(), g));
        }
        metrics.push(("lr".to_string(), lr));
        metrics.extend(advs.metrics(&self.cfg.shaping));
        metrics.extend(protocol_metrics(
            started.elapsed(),
            &self.client.traffic().since(&traffic),
        ));
        Ok((
            WeightUpdate::Remote { uri, version },
            StepStats {
                loss,
                metrics,
                behav_kl_by_backend: Vec::new(),
            },
        ))
    }
}

/// Where a step's time went: `tinker_wait_s` waiting for the server's answers (its queue
/// and compute, and the round trips), `tinker_codec_s` encoding and decoding on this side,
/// `tinker_backoff_s` sleeping between retries, `tinker_local_s` the rest of the step here
/// (advantages, our loss and its gradient); with the requests and megabytes each way.
fn protocol_metrics(step: Duration, t: &rollflash_tinker::Traffic) -> Vec<(String, f64)> {
    let local = step.saturating_sub(t.waiting + t.codec + t.backoff);
    vec![
        ("tinker_step_s".into(), step.as_secs_f64()),
        ("tinker_wait_s".into(), t.waiting.as_secs_f64()),
        ("tinker_codec_s".into(), t.codec.as_secs_f64()),
        ("tinker_backoff_s".into(), t.backoff.as_secs_f64()),
        ("tinker_local_s".into(), local.as_secs_f64()),
        ("tinker_requests".into(), t.requests as f64),
        ("tinker_mb_out".into(), t.bytes_out as f64 / 1e6),
        ("tinker_mb_in".into(), t.bytes_in as f64 / 1e6),
    ]
}

/// How long a rejoin waits for the old model's unload.
const UNLOAD_WAIT: Duration = Duration::from_secs(30);
/// How often a learner set to rejoin checks its server while it waits for a batch.
const IDLE_CHECK_EVERY: Duration = Duration::from_secs(2);
/// How long one idle check waits for the server's `healthz`.
const IDLE_CHECK_DEADLINE: Duration = Duration::from_secs(10);

/// The name a version's sampler weights are saved under.
fn sampler_name(version: PolicyVersion) -> String {
    format!("v{:06}", version.0)
}

impl Learner for TinkerLearner {
    fn train(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError> {
        let rt = self.rt.clone();
        rt.block_on(async {
            match self.step(batch).await {
                Err(e) if self.cfg.rejoin.is_some() => {
                    self.rejoin(e).await?;
                    self.step(batch).await
                }
                out => out,
            }
        })
    }

    fn idle_every(&self) -> Option<Duration> {
        self.cfg.rejoin.map(|_| IDLE_CHECK_EVERY)
    }

    fn idle(&mut self) -> Result<Option<WeightUpdate>, LearnerError> {
        let rt = self.rt.clone();
        rt.block_on(self.look_after())
    }
}

/// The server's log-probs of each kept sequence's targets, laid over the packed batch
/// (entry `t` is token `t`'s log-prob; each sequence's first token has none: 0).
fn current_logprobs(
    p: &PackedBatch<'_>,
    kept: &[usize],
    outputs: &[rollflash_tinker::DatumOutput],
) -> Result<Vec<f32>, LearnerError> {
    if outputs.len() != kept.len() {
        return Err(LearnerError::other(format!(
            "the Tinker server returned {} outputs for {} datums",
            outputs.len(),
            kept.len()
        )));
    }
    let mut all = vec![0f32; p.total()];
    for (&i, o) in kept.iter().zip(outputs) {
        let (a, b) = (p.offsets[i], p.offsets[i + 1]);
        let lp = o
            .logprobs()
            .ok_or_else(|| LearnerError::other("the Tinker server's output has no logprobs"))?;
        if lp.len() != b - a - 1 {
            return Err(LearnerError::other(format!(
                "the Tinker server returned {} log-probs for a sequence of {} targets",
                lp.len(),
                b - a - 1
            )));
        }
        all[a + 1..b].copy_from_slice(&lp);
    }
    Ok(all)
}

/// The server's loss as it reduces it: each datum's per-token losses summed and divided by
/// its weighted tokens, then the mean over datums.
fn server_loss(
    p: &PackedBatch<'_>,
    kept: &[usize],
    outputs: &[rollflash_tinker::DatumOutput],
) -> f64 {
    let mut total = 0.0;
    for (&i, o) in kept.iter().zip(outputs) {
        let (a, b) = (p.offsets[i], p.offsets[i + 1]);
        let n_i = p.mask[a + 1..b].iter().filter(|&&m| m).count().max(1) as f64;
        let sum: f64 = o
            .elementwise_loss()
            .unwrap_or_default()
            .iter()
            .map(|&x| f64::from(x))
            .sum();
        total += sum / n_i;
    }
    total / kept.len().max(1) as f64
}

/// Mean of `behav − current` over the model's tokens: the train–inference mismatch.
fn mismatch(p: &PackedBatch<'_>, current: &[f32]) -> f64 {
    let (mut gap, mut n) = (0.0, 0usize);
    for ((&m, &b), &c) in p.mask.iter().zip(&p.behav).zip(current) {
        if m {
            gap += f64::from(b) - f64::from(c);
            n += 1;
        }
    }
    gap / n.max(1) as f64
}

/// The advantages of the linear surrogate whose gradient under the server's
/// `importance_sampling` equals `grad` (our loss's gradient with respect to each token's
/// log-prob, over the packed batch). At ratio 1 that loss's gradient is
/// `(1/S)·Σ_i (1/n_i)·Σ_t w_t·(−A_t)·∇ℓ_t` (SkyRL: each sequence's sum over its `n_i` weighted
/// tokens, then the mean over the `S` datums), so `A_t = −g_t·S·n_i`.
pub fn surrogate_advantages(p: &PackedBatch<'_>, kept: &[usize], grad: &[f64]) -> Vec<f32> {
    let s = kept.len() as f64;
    let mut adv = vec![0f32; p.total()];
    for &i in kept {
        let (a, b) = (p.offsets[i], p.offsets[i + 1]);
        // The targets start at the sequence's second token.
        let n_i = p.mask[a + 1..b].iter().filter(|&&m| m).count().max(1) as f64;
        for (t, x) in adv.iter_mut().enumerate().take(b).skip(a + 1) {
            *x = (-grad.get(t).copied().unwrap_or(0.0) * s * n_i) as f32;
        }
    }
    adv
}

/// Our loss at the current log-probs.
struct OurLoss {
    value: f64,
    metrics: Vec<(String, f64)>,
    /// With respect to each token's log-prob, over the packed batch.
    grad: Option<Vec<f64>>,
}

/// Our loss over the kept sequences at the current log-probs: its value and metrics and,
/// with `grad`, its gradient with respect to each token's log-prob (over the packed batch).
fn loss_at(
    p: &PackedBatch<'_>,
    kept: &[usize],
    current: &[f32],
    adv: &[f64],
    cfg: &LossConfig,
    grad: bool,
) -> Result<OurLoss, LearnerError> {
    let dev = Device::Cpu;
    // The kept sequences back to back, as `policy_loss` takes them.
    let (mut lp, mut behav, mut a, mut mask, mut offsets, mut index) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for &i in kept {
        offsets.push(lp.len());
        for t in p.offsets[i]..p.offsets[i + 1] {
            lp.push(current[t]);
            behav.push(p.behav[t]);
            a.push(adv[t] as f32);
            mask.push(if p.mask[t] { 1f32 } else { 0.0 });
            index.push(t);
        }
    }
    let n = lp.len();
    let t = |v: Vec<f32>| Tensor::from_vec(v, n, &dev).map_err(LearnerError::from);
    let logp = Var::from_tensor(&t(lp)?)?;
    let old = logp.as_tensor().detach();
    let (behav, a, mask) = (t(behav)?, t(a)?, t(mask)?);
    let inputs = PolicyLossInputs::new(logp.as_tensor(), &old, &behav, &a, &mask, &offsets);
    let out = policy_loss(&inputs, cfg)?;
    let m = &out.metrics;
    let metrics = vec![
        ("pg_loss".to_string(), m.pg_loss),
        ("approx_kl".to_string(), m.approx_kl),
        ("clip_frac".to_string(), m.clip_frac),
        ("ratio_mean_token".to_string(), m.ratio_mean_token),
        ("ratio_mean_seq".to_string(), m.ratio_mean_seq),
        ("behav_cap_frac".to_string(), m.decoupled_cap_frac),
    ];
    let g = if grad {
        let grads = out.loss.backward()?;
        let g = match grads.get(logp.as_tensor()) {
            Some(g) => g.to_dtype(DType::F64)?.to_vec1::<f64>()?,
            None => vec![0.0; n],
        };
        let mut all = vec![0f64; p.total()];
        for (k, &t) in index.iter().enumerate() {
            all[t] = g[k];
        }
        Some(all)
    } else {
        None
    };
    Ok(OurLoss {
        value: m.total_loss,
        metrics,
        grad: g,
    })
}
