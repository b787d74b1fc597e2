//! `EnvManager`: runs trajectories — one episode of an environment, turn by turn through the
//! proxy — and groups of them with redundancy.
//!
//! Environment-level asynchrony comes from the shape, not from a scheduler: every trajectory
//! is its own task, and a trajectory waiting on its environment holds no generation slot
//! (the proxy only sees it again when it asks for its next turn), so others generate
//! meanwhile.
//!
//! Redundancy: a group runs `group_size + redundancy` trajectories and keeps the first
//! `group_size` that finish usable; the rest are aborted (their requests too) and counted.
//! A crashed, hung or garbage-returning environment fails its trajectory only.

use std::sync::Arc;
use std::time::Duration;

use rollflash_core::proxy::{Affinity, GroupId};
use rollflash_core::redundancy::{GroupDecision, GroupProgress, MemberEnd};
use rollflash_core::trajectory::ENV_TEXT_MAX_CHARS;
use rollflash_core::{
    FinishReason, GenRequest, PolicyVersion, SamplingParams, Trajectory, TrajectoryEnd, TurnTiming,
};
use rollflash_env::{Env, EnvError, Reset};
use rollflash_model::chat::{ChatMessage, ChatTemplate};
use rollflash_model::tokenizer::Tokenizer;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::proxy::{ProxyError, ProxyHandle, Replication};
// A trajectory's failure reason is a string; `ModelError` leaves its cause (a template's line
// and reason) to `source()`, so reasons carry the whole chain.
use crate::backend::error_chain;

/// How the conversation becomes tokens.
#[derive(Clone)]
pub enum Renderer {
    /// Plain text, for the built-in model: the first observation is the prompt; each later
    /// observation is appended after the model's turn between `separator`s.
    Plain { separator: String },
    /// A real model's chat template: observations are user messages, the model's turns are
    /// assistant messages.
    Chat {
        template: Arc<ChatTemplate>,
        system: Option<String>,
    },
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Renderer::Plain { separator } => f
                .debug_struct("Plain")
                .field("separator", separator)
                .finish(),
            Renderer::Chat { system, .. } => {
                f.debug_struct("Chat").field("system", system).finish()
            }
        }
    }
}

/// Limits and sampling of one trajectory.
#[derive(Debug, Clone)]
pub struct EnvManagerConfig {
    /// Model turns per episode.
    pub max_turns: usize,
    /// Budget for the whole token sequence (prompt, turns, observations).
    pub max_total_tokens: usize,
    /// Sampling of each turn; `max_new_tokens` bounds one turn.
    pub sampling: SamplingParams,
    /// Bound on one `reset`, `step` or `close` of the environment.
    pub step_timeout: Duration,
}

impl Default for EnvManagerConfig {
    fn default() -> Self {
        EnvManagerConfig {
            max_turns: 1,
            max_total_tokens: 512,
            sampling: SamplingParams::default(),
            step_timeout: Duration::from_secs(30),
        }
    }
}

/// Builds environments; one per trajectory.
pub type EnvFactory = Arc<dyn Fn() -> Result<Box<dyn Env>, EnvError> + Send + Sync>;

/// Runs trajectories of environments through the proxy.
#[derive(Clone)]
pub struct EnvManager {
    proxy: ProxyHandle,
    tokenizer: Arc<Tokenizer>,
    renderer: Renderer,
    cfg: EnvManagerConfig,
    /// The current policy version: a trajectory records the one in force when it starts.
    version: watch::Receiver<PolicyVersion>,
    /// How a group's trajectories reach the backends: `Expand` (each its own request,
    /// anywhere) or `PerRequest` (the whole group pinned to one backend, as one
    /// `n`-per-request call would be). `rollflash bench` measures the difference.
    replication: Replication,
    /// Shared by the manager's clones: every group's outcome feeds it.
    backoff: Arc<FailureBackoff>,
}

/// Paces groups while every trajectory fails (an environment server that is down, a model
/// server refusing every request): without it a group's freed slot starts the next group at
/// once, which fails at once, and an outage of three seconds became 20 000 failed
/// trajectories in the chaos run (`scripts/chaos.sh`, RELIABILITY.md). A group none of whose
/// trajectories is usable, and at least one failed, waits before it returns (holding its
/// slot): [`FailureBackoff::FIRST`], doubling with each such group in a row up to
/// [`FailureBackoff::MAX`]; a group with a usable trajectory resets it. Failures stay
/// counted; only their rate is bounded.
#[derive(Debug, Default)]
pub struct FailureBackoff {
    streak: std::sync::atomic::AtomicU32,
}

impl FailureBackoff {
    /// The wait after the first all-failed group.
    pub const FIRST: Duration = Duration::from_millis(50);
    /// The longest wait.
    pub const MAX: Duration = Duration::from_secs(5);

    /// Records one group's outcome; the wait before it returns (`None`: none).
    pub fn record(&self, usable: usize, failed: usize) -> Option<Duration> {
        use std::sync::atomic::Ordering;
        if usable > 0 || failed == 0 {
            self.streak.store(0, Ordering::Relaxed);
            return None;
        }
        let before = self.streak.fetch_add(1, Ordering::Relaxed).min(16);
        Some((Self::FIRST * 2u32.pow(before)).min(Self::MAX))
    }
}

impl std::fmt::Debug for EnvManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvManager")
            .field("renderer", &self.renderer)
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// The outcome of one group.
#[derive(Debug, Clone, Default)]
pub struct GroupResult {
    /// The first `group_size` usable trajectories, in finishing order (each keeps its index).
    pub kept: Vec<Trajectory>,
    /// Trajectories aborted because the group was already complete (or by shutdown).
    pub aborted: usize,
    /// Trajectories that failed, with their reasons.
    pub failed: Vec<String>,
    /// Whether `kept` has `group_size` trajectories (else redundancy did not cover the
    /// failures and the group cannot be trained on).
    pub complete: bool,
}

impl EnvManager {
    /// A manager over `proxy`, rendering with `renderer`, recording versions from `version`.
    pub fn new(
        proxy: ProxyHandle,
        tokenizer: Arc<Tokenizer>,
        renderer: Renderer,
        cfg: EnvManagerConfig,
        version: watch::Receiver<PolicyVersion>,
    ) -> Self {
        EnvManager {
            proxy,
            tokenizer,
            renderer,
            cfg,
            version,
            replication: Replication::Expand,
            backoff: Arc::default(),
        }
    }

    /// Spreads each group's requests as `replication` says (default: `Expand`).
    pub fn with_replication(mut self, replication: Replication) -> Self {
        self.replication = replication;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &EnvManagerConfig {
        &self.cfg
    }

    /// Runs `group_size + redundancy` trajectories of fresh environments reset with `seed`
    /// and keeps the first `group_size` usable ones. Every trajectory is its own task; the
    /// surplus is aborted the moment the group is complete.
    pub async fn run_group(
        &self,
        make_env: EnvFactory,
        seed: u64,
        group_size: usize,
        redundancy: usize,
    ) -> GroupResult {
        let group = self.proxy.next_group();
        let mut tasks = JoinSet::new();
        // Surplus trajectories are cancelled through this, not by aborting their tasks, so
        // each still closes its environment (a server-side episode or session).
        let (cancel, cancelled) = watch::channel(false);
        for index in 0..group_size + redundancy {
            let me = self.clone();
            let make_env = Arc::clone(&make_env);
            let mut cancelled = cancelled.clone();
            tasks.spawn(async move {
                match make_env() {
                    Ok(mut env) => {
                        let stop = async move {
                            let _ = cancelled.wait_for(|c| *c).await;
                        };
                        me.run_trajectory_until(env.as_mut(), seed, index, group, stop)
                            .await
                    }
                    Err(e) => failed_before_start(seed, index, &rollflash_core::error_chain(&e)),
                }
            });
        }
        let mut result = GroupResult::default();
        // The keep-the-first-`group_size` rule is core's, shared with `rollflash sim`.
        let mut progress = GroupProgress::new(group_size, redundancy);
        while let Some(joined) = tasks.join_next().await {
            let t = match joined {
                Ok(t) => t,
                // A panicking environment fails its trajectory only.
                Err(e) => failed_before_start(
                    seed,
                    usize::MAX,
                    &format!("task failed: {}", rollflash_core::error_chain(&e)),
                ),
            };
            let end = match &t.end {
                Some(TrajectoryEnd::Failed(reason)) => {
                    result.failed.push(reason.clone());
                    MemberEnd::Failed
                }
                Some(TrajectoryEnd::Aborted) => {
                    result.aborted += 1;
                    MemberEnd::Aborted
                }
                _ => {
                    result.kept.push(t);
                    MemberEnd::Usable
                }
            };
            if let GroupDecision::Done { abort } = progress.record(end) {
                if abort > 0 {
                    // Group complete: stop the surplus, in the environment and on the
                    // backends.
                    result.aborted += abort;
                    let _ = cancel.send(true);
                    self.proxy.abort_group(group);
                    // Each closes its environment within the step timeout.
                    while tasks.join_next().await.is_some() {}
                }
                break;
            }
        }
        result.complete = progress.is_complete();
        if let Some(wait) = self.backoff.record(result.kept.len(), result.failed.len()) {
            tracing::debug!(
                wait_ms = wait.as_millis() as u64,
                failed = result.failed.len(),
                "every trajectory of the group failed: waiting before the next"
            );
            tokio::time::sleep(wait).await;
        }
        result
    }

    /// Runs one trajectory: reset, then (generate → step)* until the episode ends or a limit
    /// is hit, then closes the environment ([`Env::close`], within the step timeout). Never
    /// panics and never returns an error: failures are recorded in `end`.
    pub async fn run_trajectory(
        &self,
        env: &mut dyn Env,
        seed: u64,
        index: usize,
        group: GroupId,
    ) -> Trajectory {
        self.run_trajectory_until(env, seed, index, group, std::future::pending())
            .await
    }

    /// As [`EnvManager::run_trajectory`], aborted (and its environment still closed) when
    /// `stop` completes first.
    pub async fn run_trajectory_until(
        &self,
        env: &mut dyn Env,
        seed: u64,
        index: usize,
        group: GroupId,
        stop: impl std::future::Future<Output = ()> + Send,
    ) -> Trajectory {
        let start_version = *self.version.borrow();
        let mut t = Trajectory {
            start_version,
            seed,
            index,
            ..Default::default()
        };
        // A sticky key per trajectory keeps its turns on one backend (prefix reuse); without
        // prompt replication the whole group shares one backend instead.
        let affinity_key = self.proxy.next_id().0;
        let affinity = match self.replication {
            Replication::Expand => Affinity::Sticky(affinity_key),
            Replication::PerRequest => Affinity::Pinned(group.0),
        };
        let end = tokio::select! {
            end = self.episode(env, &mut t, group, affinity) => end,
            () = stop => TrajectoryEnd::Aborted,
        };
        self.proxy.forget_affinity(affinity_key);
        // A close that fails or hangs costs nothing but a log line: the trajectory is over.
        match tokio::time::timeout(self.cfg.step_timeout, env.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %rollflash_core::error_chain(&e), "closing the environment failed")
            }
            Err(_) => tracing::debug!("closing the environment timed out"),
        }
        t.end = Some(end);
        t
    }

    // Long by design: one episode's loop (reset, then turns of generate and step, each
    // with its deadline), where every way an episode can end returns its end right there.
    async fn episode(
        &self,
        env: &mut dyn Env,
        t: &mut Trajectory,
        group: GroupId,
        affinity: Affinity,
    ) -> TrajectoryEnd {
        let reset = match tokio::time::timeout(self.cfg.step_timeout, env.reset(t.seed)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                return TrajectoryEnd::Failed(format!("reset: {}", rollflash_core::error_chain(&e)))
            }
            Err(_) => return TrajectoryEnd::Failed(self.timeout_reason("reset")),
        };
        let mut messages = Vec::new();
        let prompt = match self.first_prompt(&reset, &mut messages) {
            Ok(p) => p,
            Err(e) => return TrajectoryEnd::Failed(e),
        };
        for &tok in &prompt {
            t.push(tok, 0, 0.0, t.start_version);
        }
        t.prompt_len = prompt.len();
        for turn in 0..self.cfg.max_turns {
            let room = self.cfg.max_total_tokens.saturating_sub(t.tokens.len());
            if room == 0 {
                return TrajectoryEnd::MaxTokens;
            }
            let mut params = self.cfg.sampling.clone();
            params.max_new_tokens = params.max_new_tokens.min(room);
            // Each turn gets its own random stream, derived from the trajectory's seed.
            params.seed = Some(mix(params.seed.unwrap_or(0), t.seed, t.index as u64, turn));
            let req = GenRequest {
                id: self.proxy.next_id(),
                prompt: t.tokens.clone(),
                params,
                start_version: t.start_version,
                resume: None,
            };
            let t0 = Instant::now();
            let out = match self.proxy.generate_with(req, Some(group), affinity).await {
                Ok(out) => out,
                Err(ProxyError::Shutdown) => return TrajectoryEnd::Aborted,
                Err(e) => {
                    return TrajectoryEnd::Failed(format!(
                        "generate: {}",
                        rollflash_core::error_chain(&e)
                    ))
                }
            };
            let gen_time = t0.elapsed();
            for run in &out.served_by {
                rollflash_core::gen::push_served(&mut t.served_by, &run.backend, run.tokens);
            }
            for i in 0..out.output.len() {
                t.push(
                    out.output.tokens[i],
                    1,
                    out.output.logprobs[i],
                    out.output.versions[i],
                );
            }
            if out.finish_reason == FinishReason::Aborted {
                t.turns.push(TurnTiming {
                    generate: gen_time,
                    env: Duration::ZERO,
                    tokens: out.output.len(),
                });
                return TrajectoryEnd::Aborted;
            }
            let action = match self.tokenizer.decode(&out.output.tokens, true) {
                Ok(s) => s,
                Err(e) => return TrajectoryEnd::Failed(format!("decode: {}", error_chain(&e))),
            };
            let t1 = Instant::now();
            let step = match tokio::time::timeout(self.cfg.step_timeout, env.step(&action)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return TrajectoryEnd::Failed(format!(
                        "step: {}",
                        rollflash_core::error_chain(&e)
                    ))
                }
                Err(_) => return TrajectoryEnd::Failed(self.timeout_reason("step")),
            };
            t.turns.push(TurnTiming {
                generate: gen_time,
                env: t1.elapsed(),
                tokens: out.output.len(),
            });
            if !step.reward.is_finite() {
                return TrajectoryEnd::Failed(format!(
                    "step: environment returned reward {}",
                    step.reward
                ));
            }
            t.reward += step.reward;
            t.step_rewards.push(step.reward);
            t.env_metrics = step
                .info
                .iter()
                .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
                .collect();
            t.env_text = step
                .info
                .iter()
                .filter_map(|(k, v)| v.as_str().map(|x| (k.clone(), cut_text(x))))
                .collect();
            if step.terminated {
                return TrajectoryEnd::Terminated;
            }
            if step.truncated {
                return TrajectoryEnd::Truncated;
            }
            if turn + 1 == self.cfg.max_turns {
                break;
            }
            // The stop token the model ended its turn with (the last one it generated).
            let stopped = (out.finish_reason == FinishReason::Stop)
                .then(|| out.output.tokens.last().copied())
                .flatten()
                .filter(|t| self.cfg.sampling.stop_token_ids.contains(t));
            let obs =
                match self.observation_tokens(&step.observation, &action, stopped, &mut messages) {
                    Ok(o) => o,
                    Err(e) => return TrajectoryEnd::Failed(e),
                };
            if t.tokens.len() + obs.len() >= self.cfg.max_total_tokens {
                // No room left for the model to answer this observation.
                return TrajectoryEnd::MaxTokens;
            }
            for tok in obs {
                t.push(tok, 0, 0.0, t.start_version);
            }
        }
        TrajectoryEnd::MaxTurns
    }

    fn timeout_reason(&self, what: &str) -> String {
        format!(
            "{what}: environment timed out after {:.1}s",
            self.cfg.step_timeout.as_secs_f64()
        )
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, false)
            .map_err(|e| format!("tokenize: {}", error_chain(&e)))
    }

    /// The prompt's tokens: the observation as plain text, or through the chat template (the
    /// environment's own messages when its reset gives them, see
    /// [`rollflash_env::env::PROMPT_MESSAGES`]; the renderer's system text only when they
    /// have none). These tokens are the trajectory's prompt: what is generated from is
    /// exactly what the trainer scores.
    fn first_prompt(
        &self,
        reset: &Reset,
        messages: &mut Vec<ChatMessage>,
    ) -> Result<Vec<u32>, String> {
        match &self.renderer {
            Renderer::Plain { .. } => {
                let mut ids = Vec::new();
                if let Some(bos) = self.tokenizer.bos_token_id() {
                    ids.push(bos);
                }
                ids.extend(self.encode(&reset.observation)?);
                Ok(ids)
            }
            Renderer::Chat { template, system } => {
                let own = reset.messages().unwrap_or_default();
                if let Some(s) = system
                    .as_ref()
                    .filter(|_| own.iter().all(|m| m.role != "system"))
                {
                    messages.push(ChatMessage::system(s.clone()));
                }
                if own.is_empty() {
                    messages.push(ChatMessage::user(reset.observation.as_str()));
                }
                messages.extend(own.into_iter().map(|m| ChatMessage::new(m.role, m.content)));
                let text = template
                    .render(messages, true)
                    .map_err(|e| format!("chat template: {}", error_chain(&e)))?;
                self.encode(&text)
            }
        }
    }

    /// Tokens that close the model's turn (where the template adds more than the stop
    /// token) and present the next observation, ending where the model's next turn starts.
    /// Computed as a difference of renders, so it is exactly what the template would
    /// produce for the whole conversation.
    fn observation_tokens(
        &self,
        observation: &str,
        action: &str,
        stopped: Option<u32>,
        messages: &mut Vec<ChatMessage>,
    ) -> Result<Vec<u32>, String> {
        match &self.renderer {
            Renderer::Plain { separator } => {
                let mut text = String::new();
                if stopped.is_none() {
                    text.push_str(separator);
                }
                text.push_str(observation);
                text.push_str(separator);
                self.encode(&text)
            }
            Renderer::Chat { template, .. } => {
                let err =
                    |e: rollflash_model::ModelError| format!("chat template: {}", error_chain(&e));
                // What the template puts after an assistant message's content: the model
                // generated the stop token itself when it stopped; the rest (often a
                // newline) is added here.
                let before = template.render(messages, true).map_err(err)?;
                messages.push(ChatMessage::assistant(action));
                let closed = template.render(messages, false).map_err(err)?;
                let after_content = closed
                    .strip_prefix(&before)
                    .and_then(|s| s.strip_prefix(action))
                    .unwrap_or("");
                let closing = if let Some(stop) = stopped {
                    // Whichever stop id ended the turn (a chat model's end-of-turn token, not
                    // always the tokenizer's end-of-sequence one).
                    let eos = self.tokenizer.decode(&[stop], false).unwrap_or_default();
                    after_content
                        .strip_prefix(eos.as_str())
                        .unwrap_or(after_content)
                        .to_string()
                } else {
                    after_content.to_string()
                };
                messages.push(ChatMessage::user(observation));
                let next = template.render(messages, true).map_err(err)?;
                let Some(delta) = next.strip_prefix(&closed) else {
                    return Err("chat template is not prefix-stable across turns".into());
                };
                self.encode(&format!("{closing}{delta}"))
            }
        }
    }
}

fn failed_before_start(seed: u64, index: usize, reason: &str) -> Trajectory {
    Trajectory {
        seed,
        index,
        end: Some(TrajectoryEnd::Failed(reason.to_string())),
        ..Default::default()
    }
}

/// A well-mixed seed from its parts (splitmix64 steps), so neighbouring trajectories and
/// turns get unrelated random streams.
fn mix(base: u64, seed: u64, index: u64, turn: usize) -> u64 {
    let mut x = base;
    for part in [seed, index, turn as u64] {
        x ^= part;
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
    }
    x
}

/// `text` cut to [`ENV_TEXT_MAX_CHARS`] characters: its start and its end (a traceback's
/// last line says what was raised), joined by ` … `.
fn cut_text(text: &str) -> String {
    let n = text.chars().count();
    if n <= ENV_TEXT_MAX_CHARS {
        return text.to_string();
    }
    let head = ENV_TEXT_MAX_CHARS / 4;
    let tail = ENV_TEXT_MAX_CHARS - head;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(n - tail).collect();
    format!("{start} … {end}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_keeps_its_start_and_its_end() {
        assert_eq!(cut_text("short"), "short");
        let long = format!("Traceback{}ValueError: bad", "x".repeat(5000));
        let cut = cut_text(&long);
        assert!(cut.starts_with("Traceback") && cut.ends_with("ValueError: bad"));
        assert_eq!(
            cut.chars().count(),
            ENV_TEXT_MAX_CHARS + " … ".chars().count()
        );
    }
}
