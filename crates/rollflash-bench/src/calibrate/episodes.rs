//! Real multi-turn episodes of the run's starting policy: its first tasks rolled out through
//! the real rollout plane (engine workers behind the `LlmProxy`, the `EnvManager`, the
//! run's renderer and sampling seeds), and what the simulator needs of each — its turns'
//! response and observation lengths and its reward.

use std::sync::Arc;

use rollflash_core::{PolicyVersion, SamplingParams, Trajectory};
use rollflash_env::envs::make_env;
use rollflash_model::engine::EngineConfig;
use rollflash_rollout::{
    Backend, BackendEntry, EngineBackend, EngineBackendConfig, EnvFactory, EnvManager,
    EnvManagerConfig, LlmProxy, ProxyConfig,
};
use rollflash_sim::{Episode, EpisodeTurn};

use super::engine::TurnRequest;
use super::plan::Plan;
use super::CalibrateError;

/// The rolled-out groups, each in member order, and what could not be used.
#[derive(Debug, Default)]
pub struct Rollout {
    pub groups: Vec<Vec<Trajectory>>,
    /// Trajectories that failed (without injected failures: a bug or a full context).
    pub failed: usize,
}

/// Rolls out the run's first `groups` tasks, `plan.members()` episodes each, all at once,
/// through the rollout plane `rollflash train` builds (without the environment's injected
/// latency and failures, which the simulator draws itself). The sampling seeds are the
/// run's, so with the same policy these are the run's own first groups.
pub fn roll_out(
    plan: &Plan,
    policy: &super::Policy,
    groups: usize,
) -> Result<Rollout, CalibrateError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(CalibrateError::Runtime)?;
    rt.block_on(roll_out_async(plan, policy, groups))
}

// Not `rollflash_run::stack::Stack::build_with`, though it is the same plane: the stack
// builds its environments from the run's spec with the injected latency and failures (a
// wrapping hook cannot take them off again, and the simulator draws them itself, so
// measuring them here would count them twice), and it starts its engines from a
// `TrainableModel` snapshot and a `rollflash_run` `Policy`, where calibration holds only the
// inference model it replays and times. Routing it through the stack would change what is
// measured, so this builds its engines, proxy and `EnvManager` itself.
async fn roll_out_async(
    plan: &Plan,
    policy: &super::Policy,
    groups: usize,
) -> Result<Rollout, CalibrateError> {
    let (model, tokenizer) = (&policy.model, &policy.tokenizer);
    let version = PolicyVersion(0);
    let mut backends = Vec::new();
    for i in 0..plan.engines {
        let b = EngineBackend::start(
            Arc::clone(model),
            version,
            EngineBackendConfig {
                name: format!("engine-{i}"),
                engine: EngineConfig {
                    max_running_requests: plan.max_running,
                    threads: plan.engine_threads,
                    ..Default::default()
                },
            },
        )?;
        backends.push(BackendEntry {
            backend: Arc::new(b) as Arc<dyn Backend>,
            route: rollflash_rollout::WeightRoute::Direct,
            max_running_requests: plan.max_running,
            update_timeout: None,
        });
    }
    let routing = plan.routing.policy();
    let proxy = LlmProxy::start(
        backends,
        routing,
        ProxyConfig::with_request_timeout(plan.request_timeout),
    );
    let (_vtx, vrx) = tokio::sync::watch::channel(version);
    let eos = policy.model_cfg.stop_tokens(Some(tokenizer));
    let envs = EnvManager::new(
        proxy.handle(),
        Arc::clone(tokenizer),
        plan.renderer.clone(),
        EnvManagerConfig {
            max_turns: plan.max_turns,
            max_total_tokens: plan.max_total_tokens,
            sampling: SamplingParams {
                temperature: plan.temperature,
                top_p: plan.top_p,
                max_new_tokens: plan.max_new_tokens,
                stop_token_ids: eos,
                seed: Some(plan.seed),
                ..Default::default()
            },
            step_timeout: plan.step_timeout,
        },
        vrx,
    );
    let spec = plan.quiet_env();
    spec.validate()?;
    let make: EnvFactory = Arc::new(move || make_env(&spec));
    let members = plan.members();
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..groups as u64 {
        let envs = envs.clone();
        let make = Arc::clone(&make);
        let seed = plan.task_seed.wrapping_add(k);
        // Every member kept (no surplus to abort): the simulator replays all of them.
        tasks.spawn(async move { (k, envs.run_group(make, seed, members, 0).await) });
    }
    let mut results = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(r) => results.push(r),
            Err(e) => {
                let _ = proxy.shutdown().await;
                return Err(CalibrateError::Invalid(format!(
                    "rollout task failed: {}",
                    rollflash_core::error_chain(&e)
                )));
            }
        }
    }
    proxy.shutdown().await?;
    results.sort_by_key(|(k, _)| *k);
    let mut out = Rollout::default();
    for (_, mut r) in results {
        out.failed += r.failed.len();
        r.kept.sort_by_key(|t| t.index);
        if !r.kept.is_empty() {
            out.groups.push(r.kept);
        }
    }
    Ok(out)
}

/// Spans of a trajectory after its first prompt: each model turn (a run of tokens with
/// loss mask 1) and the observation after it (the run of other tokens that follows).
fn turn_spans(t: &Trajectory) -> Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    let mask = &t.loss_mask;
    let mut spans = Vec::new();
    let mut i = t.prompt_len.min(mask.len());
    while i < mask.len() {
        let r0 = i;
        while i < mask.len() && mask[i] == 1 {
            i += 1;
        }
        let o0 = i;
        while i < mask.len() && mask[i] != 1 {
            i += 1;
        }
        if o0 > r0 {
            spans.push((r0..o0, o0..i));
        }
    }
    spans
}

/// What the simulator replays of one episode.
pub fn episode_shape(t: &Trajectory) -> Episode {
    Episode {
        prompt_tokens: t.prompt_len as u64,
        turns: turn_spans(t)
            .into_iter()
            .map(|(r, o)| EpisodeTurn {
                response_tokens: r.len() as u64,
                observation_tokens: o.len() as u64,
            })
            .collect(),
        reward: t.reward,
    }
}

/// The engine requests of an episode's turns: each turn's prompt is everything before it,
/// and it generates exactly as many tokens as the measured turn (no stop token), so a
/// replay through the engine costs what the episode cost.
pub fn turn_requests(t: &Trajectory, sampling: &SamplingParams) -> Vec<TurnRequest> {
    turn_spans(t)
        .into_iter()
        .map(|(r, _)| TurnRequest {
            prompt: t.tokens[..r.start].to_vec(),
            params: SamplingParams {
                max_new_tokens: r.len(),
                stop_token_ids: Vec::new(),
                ..sampling.clone()
            },
        })
        .collect()
}
