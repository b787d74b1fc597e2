//! The EnvManager: trajectory structure (masks, log-probs, versions), limits, rendering,
//! environment-level asynchrony under paused time, and redundancy with failing envs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rollflash_core::proxy::{LeastLoaded, Sticky};
use rollflash_core::{PolicyVersion, SamplingParams, TrajectoryEnd};
use rollflash_env::{Env, EnvError, Reset, Step};
use rollflash_model::chat::{ChatMessage, ChatTemplate};
use rollflash_model::tokenizer::Tokenizer;
use rollflash_rollout::{
    Backend, BackendEntry, EnvFactory, EnvManager, EnvManagerConfig, InstantBackend, LlmProxy,
    ProxyConfig, Renderer,
};
use tokio::sync::watch;

use crate::common;

/// What a scripted environment does on each call.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Terminates after `turns` steps, reward 1 per step; each step waits `latency`.
    Count { turns: usize, latency: Duration },
    /// `step` fails.
    Crash,
    /// `step` never returns.
    Hang,
    /// `step` returns a NaN reward.
    Garbage,
    /// `step` panics.
    Panic,
}

struct Scripted {
    b: Behaviour,
    steps: usize,
}

#[async_trait]
impl Env for Scripted {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        self.steps = 0;
        Ok(Reset {
            observation: format!("start {seed}"),
            info: Default::default(),
        })
    }

    async fn step(&mut self, _action: &str) -> Result<Step, EnvError> {
        self.steps += 1;
        match self.b {
            Behaviour::Count { turns, latency } => {
                tokio::time::sleep(latency).await;
                Ok(Step {
                    observation: format!("obs {}", self.steps),
                    reward: 1.0,
                    terminated: self.steps >= turns,
                    ..Default::default()
                })
            }
            Behaviour::Crash => Err(EnvError::Failed("boom".into())),
            Behaviour::Hang => {
                std::future::pending::<()>().await;
                unreachable!()
            }
            Behaviour::Garbage => Ok(Step {
                reward: f64::NAN,
                ..Default::default()
            }),
            Behaviour::Panic => panic!("environment bug"),
        }
    }
}

fn factory(b: Behaviour) -> EnvFactory {
    Arc::new(move || Ok(Box::new(Scripted { b, steps: 0 }) as Box<dyn Env>))
}

fn instant_proxy(cap: usize) -> (LlmProxy, Arc<InstantBackend>) {
    let b = Arc::new(InstantBackend::new("i0"));
    let proxy = LlmProxy::start(
        vec![BackendEntry {
            backend: b.clone() as Arc<dyn Backend>,
            route: rollflash_rollout::WeightRoute::Direct,
            max_running_requests: cap,
            update_timeout: None,
        }],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    (proxy, b)
}

fn manager(proxy: &LlmProxy, renderer: Renderer, cfg: EnvManagerConfig) -> EnvManager {
    let (_tx, rx) = watch::channel(PolicyVersion(3));
    EnvManager::new(
        proxy.handle(),
        Arc::new(Tokenizer::builtin()),
        renderer,
        cfg,
        rx,
    )
}

fn plain() -> Renderer {
    Renderer::Plain {
        separator: "\n".into(),
    }
}

fn cfg(max_turns: usize, per_turn: usize) -> EnvManagerConfig {
    EnvManagerConfig {
        max_turns,
        max_total_tokens: 400,
        sampling: SamplingParams {
            max_new_tokens: per_turn,
            ..Default::default()
        },
        step_timeout: Duration::from_secs(5),
    }
}

#[tokio::test(start_paused = true)]
async fn multi_turn_trajectory_masks_observations_and_records_versions() {
    let (proxy, _) = instant_proxy(4);
    let m = manager(&proxy, plain(), cfg(10, 6));
    let f = factory(Behaviour::Count {
        turns: 3,
        latency: Duration::from_millis(100),
    });
    let g = m.run_group(f, 42, 1, 0).await;
    assert!(g.complete);
    let t = &g.kept[0];
    assert!(t.is_consistent());
    assert_eq!(t.end, Some(TrajectoryEnd::Terminated));
    assert_eq!(t.turns.len(), 3);
    assert_eq!(t.response_tokens(), 18);
    assert_eq!(t.step_rewards, vec![1.0, 1.0, 1.0]);
    assert_eq!(t.reward, 3.0);
    assert_eq!(t.start_version, PolicyVersion(3));
    assert_eq!(t.seed, 42);
    // The prompt is "start 42" (with bos), then blocks of 6 model tokens separated by
    // observations with mask 0.
    let tok = Tokenizer::builtin();
    let prompt = tok.decode(&t.tokens[..t.prompt_len], true).unwrap();
    assert_eq!(prompt, "start 42");
    let masks: String = t.loss_mask.iter().map(|m| char::from(b'0' + m)).collect();
    let obs1 = tok.encode("\nobs 1\n", false).unwrap().len();
    let expect = format!(
        "{}{}{}{}{}{}",
        "0".repeat(t.prompt_len),
        "1".repeat(6),
        "0".repeat(obs1),
        "1".repeat(6),
        "0".repeat(obs1),
        "1".repeat(6)
    );
    assert_eq!(masks, expect);
    for (i, m) in t.loss_mask.iter().enumerate() {
        if *m == 0 {
            assert_eq!(t.logprobs[i], 0.0);
        } else {
            assert_eq!(t.logprobs[i], -1.0);
        }
    }
    // Env time is recorded per turn (paused clock: exactly the latency).
    assert!(t.turns.iter().all(|x| x.env == Duration::from_millis(100)));
    proxy.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn limits_end_trajectories() {
    let (proxy, _) = instant_proxy(4);
    let endless = factory(Behaviour::Count {
        turns: usize::MAX,
        latency: Duration::ZERO,
    });
    let m = manager(&proxy, plain(), cfg(4, 5));
    let g = m.run_group(endless.clone(), 1, 1, 0).await;
    assert_eq!(g.kept[0].end, Some(TrajectoryEnd::MaxTurns));
    assert_eq!(g.kept[0].turns.len(), 4);
    let mut c = cfg(100, 50);
    c.max_total_tokens = 120;
    let m = manager(&proxy, plain(), c);
    let g = m.run_group(endless, 1, 1, 0).await;
    let t = &g.kept[0];
    assert_eq!(t.end, Some(TrajectoryEnd::MaxTokens));
    assert!(
        t.tokens.len() <= 120,
        "the budget holds: {}",
        t.tokens.len()
    );
    assert!(
        t.tokens.len() > 100,
        "turns were cut to the budget, not skipped"
    );
    proxy.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failing_environments_cost_one_trajectory_each() {
    let (proxy, _) = instant_proxy(8);
    let m = manager(&proxy, plain(), cfg(3, 4));
    for (b, needle) in [
        (Behaviour::Crash, "boom"),
        (Behaviour::Hang, "timed out"),
        (Behaviour::Garbage, "NaN"),
        (Behaviour::Panic, "panic"),
    ] {
        let g = m.run_group(factory(b), 7, 2, 0).await;
        assert!(!g.complete, "{b:?}");
        assert_eq!(g.failed.len(), 2, "{b:?}");
        assert!(
            g.failed.iter().all(|r| r.contains(needle)),
            "{b:?}: {:?}",
            g.failed
        );
    }
    proxy.shutdown().await.unwrap();
}

/// Groups whose every trajectory fails are paced: each waits 50 ms, 100, 200, … (at most
/// 5 s) before it returns, so an environment server that is down costs a bounded number of
/// failed trajectories instead of a spin; a group with a usable trajectory resets the pace.
#[tokio::test(start_paused = true)]
async fn groups_that_fail_entirely_back_off_exponentially_and_a_success_resets() {
    use rollflash_rollout::FailureBackoff;
    let (proxy, _) = instant_proxy(8);
    let m = manager(&proxy, plain(), cfg(3, 4));
    let mut waits = Vec::new();
    for _ in 0..9 {
        let t = tokio::time::Instant::now();
        let g = m.run_group(factory(Behaviour::Crash), 7, 2, 0).await;
        assert_eq!(g.failed.len(), 2);
        waits.push(t.elapsed().as_millis());
    }
    assert_eq!(waits, [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    // A usable group returns at once and resets the streak.
    let t = tokio::time::Instant::now();
    let ok = m
        .run_group(
            factory(Behaviour::Count {
                turns: 1,
                latency: Duration::ZERO,
            }),
            7,
            2,
            0,
        )
        .await;
    assert!(ok.complete);
    assert_eq!(t.elapsed(), Duration::ZERO);
    let t = tokio::time::Instant::now();
    m.run_group(factory(Behaviour::Crash), 7, 2, 0).await;
    assert_eq!(t.elapsed(), FailureBackoff::FIRST);
    proxy.shutdown().await.unwrap();

    // The rule as plain data: aborted-only groups (a shutdown) neither wait nor count.
    let b = FailureBackoff::default();
    assert_eq!(b.record(0, 0), None);
    assert_eq!(b.record(0, 3), Some(FailureBackoff::FIRST));
    assert_eq!(b.record(1, 3), None);
    assert_eq!(b.record(0, 1), Some(FailureBackoff::FIRST));
}

/// A group of 4 + 2 redundant trajectories where two environments crash and one hangs:
/// redundancy covers the failures... the hang outlives the group and is aborted.
#[tokio::test(start_paused = true)]
async fn redundancy_covers_failures_and_aborts_the_surplus() {
    let (proxy, _) = instant_proxy(8);
    let m = manager(&proxy, plain(), cfg(3, 4));
    let n = Arc::new(AtomicUsize::new(0));
    let f: EnvFactory = {
        let n = Arc::clone(&n);
        Arc::new(move || {
            let b = match n.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Behaviour::Crash,
                2 => Behaviour::Hang,
                _ => Behaviour::Count {
                    turns: 2,
                    latency: Duration::from_millis(10),
                },
            };
            Ok(Box::new(Scripted { b, steps: 0 }) as Box<dyn Env>)
        })
    };
    let g = m.run_group(f, 9, 3, 3).await;
    assert!(g.complete);
    assert_eq!(g.kept.len(), 3);
    assert_eq!(g.failed.len(), 2);
    assert_eq!(
        g.aborted, 1,
        "the hung trajectory was aborted, not waited for"
    );
    assert!(g
        .kept
        .iter()
        .all(|t| t.end == Some(TrajectoryEnd::Terminated)));
    proxy.shutdown().await.unwrap();
}

/// 200 trajectories, each 3 turns with a 1 s environment step, through a proxy that runs 4
/// requests at a time. Waiting on the environment holds no generation slot, so all
/// trajectories wait at once: the whole thing takes about 3 s of (virtual) time, not the
/// 150 s a slot-holding design would.
#[tokio::test(start_paused = true)]
async fn trajectories_waiting_on_environments_hold_no_generation_slot() {
    let b = Arc::new(InstantBackend::with_delay("i0", Duration::from_millis(1)));
    let proxy = LlmProxy::start(
        vec![BackendEntry {
            backend: b.clone() as Arc<dyn Backend>,
            route: rollflash_rollout::WeightRoute::Direct,
            max_running_requests: 4,
            update_timeout: None,
        }],
        Box::new(Sticky::default()),
        ProxyConfig::default(),
    );
    let m = manager(&proxy, plain(), cfg(5, 4));
    let f = factory(Behaviour::Count {
        turns: 3,
        latency: Duration::from_secs(1),
    });
    let start = tokio::time::Instant::now();
    let mut groups = tokio::task::JoinSet::new();
    for seed in 0..50 {
        let m = m.clone();
        let f = Arc::clone(&f);
        groups.spawn(async move { m.run_group(f, seed, 4, 0).await });
    }
    let mut done = 0;
    while let Some(g) = groups.join_next().await {
        let g = g.unwrap();
        assert!(g.complete);
        done += g.kept.len();
    }
    assert_eq!(done, 200);
    let elapsed = start.elapsed();
    // 3 env waits of 1 s, plus 600 generations of 1 ms 4 at a time (150 ms).
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
    assert_eq!(b.served(), 600);
    proxy.shutdown().await.unwrap();
}

/// With a chat template, the token sequence is exactly the template's rendering of the
/// whole conversation: observations are user messages, turns assistant messages.
#[tokio::test(start_paused = true)]
async fn chat_rendering_matches_the_template_for_the_whole_conversation() {
    let (proxy, _) = instant_proxy(4);
    let template = Arc::new(ChatTemplate::builtin().unwrap());
    let renderer = Renderer::Chat {
        template: Arc::clone(&template),
        system: Some("be brief".into()),
    };
    let m = manager(&proxy, renderer, cfg(2, 5));
    let f = factory(Behaviour::Count {
        turns: 2,
        latency: Duration::ZERO,
    });
    let g = m.run_group(f, 5, 1, 0).await;
    let t = &g.kept[0];
    let tok = Tokenizer::builtin();
    // The first turn's text, as the model produced it.
    let first_turn: Vec<u32> = t
        .tokens
        .iter()
        .zip(&t.loss_mask)
        .skip(t.prompt_len)
        .take_while(|(_, m)| **m == 1)
        .map(|(x, _)| *x)
        .collect();
    let a0 = tok.decode(&first_turn, true).unwrap();
    let last_model_start = t.loss_mask.iter().rposition(|m| *m == 0).unwrap() + 1;
    let text = tok.decode(&t.tokens[..last_model_start], false).unwrap();
    let expect = template
        .render(
            &[
                ChatMessage::system("be brief"),
                ChatMessage::user("start 5"),
                ChatMessage::assistant(a0),
                ChatMessage::user("obs 1"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(text, expect);
    proxy.shutdown().await.unwrap();
}

/// A real engine generates the turns: log-probs are real, versions are the engine's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trajectories_through_a_real_engine() {
    let tok = Tokenizer::builtin();
    let e =
        common::engine_backend_over("e0", common::tiny_model_with_vocab(4, tok.vocab_size()), 8);
    let proxy = LlmProxy::start(
        vec![BackendEntry {
            backend: e as Arc<dyn Backend>,
            route: rollflash_rollout::WeightRoute::Direct,
            max_running_requests: 8,
            update_timeout: None,
        }],
        Box::new(Sticky::default()),
        ProxyConfig::default(),
    );
    let m = manager(&proxy, plain(), cfg(2, 8));
    let f = factory(Behaviour::Count {
        turns: 2,
        latency: Duration::from_millis(5),
    });
    let g = m.run_group(f, 3, 4, 0).await;
    assert!(g.complete, "{:?}", g.failed);
    for t in &g.kept {
        assert!(t.is_consistent());
        assert!(t
            .logprobs
            .iter()
            .zip(&t.loss_mask)
            .all(|(lp, m)| *m == 0 || (lp.is_finite() && *lp < 0.0)));
        assert_eq!(t.end, Some(TrajectoryEnd::Terminated));
        assert_eq!(t.response_tokens(), 16);
        assert!(t
            .versions
            .iter()
            .all(|v| *v == PolicyVersion(0) || *v == PolicyVersion(3)));
    }
    proxy.shutdown().await.unwrap();
}

/// A generation that times out (the only backend never answers) fails its trajectory with
/// the reason, like any other failed generation: the group ends, incomplete, instead of
/// waiting forever.
#[tokio::test(start_paused = true)]
async fn a_generation_that_times_out_fails_its_trajectory() {
    let hung = Arc::new(common::Hanging::default());
    let proxy = LlmProxy::start(
        vec![BackendEntry {
            backend: hung.clone() as Arc<dyn Backend>,
            route: rollflash_rollout::WeightRoute::Direct,
            max_running_requests: 4,
            update_timeout: None,
        }],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let m = manager(&proxy, plain(), cfg(3, 4));
    let f = factory(Behaviour::Count {
        turns: 2,
        latency: Duration::from_millis(10),
    });
    let g = tokio::time::timeout(Duration::from_secs(7 * 24 * 3600), m.run_group(f, 11, 2, 0))
        .await
        .expect("the group hung: nothing expired its generations");
    assert!(!g.complete);
    assert!(g.kept.is_empty());
    assert_eq!(g.failed.len(), 2);
    assert!(
        g.failed
            .iter()
            .all(|r| r.starts_with("generate:") && r.contains("timed out")),
        "{:?}",
        g.failed
    );
    proxy.shutdown().await.unwrap();
}

/// An environment that gives its prompt as chat messages (`Reset::info["messages"]`).
struct Conversational;

#[async_trait]
impl Env for Conversational {
    async fn reset(&mut self, _seed: u64) -> Result<Reset, EnvError> {
        let mut info = rollflash_env::Info::new();
        info.insert(
            rollflash_env::env::PROMPT_MESSAGES.into(),
            serde_json::json!([
                {"role": "system", "content": "own system"},
                {"role": "user", "content": "1+1?"},
                {"role": "assistant", "content": "2"},
                {"role": "user", "content": "2+2?"}
            ]),
        );
        Ok(Reset {
            observation: "plain form".into(),
            info,
        })
    }

    async fn step(&mut self, _action: &str) -> Result<Step, EnvError> {
        Ok(Step {
            reward: 1.0,
            terminated: true,
            ..Default::default()
        })
    }
}

/// With a chat template, an environment's own messages are the prompt, rendered exactly as
/// the template renders them (its system message wins over the renderer's); with the plain
/// renderer, the observation is. Those tokens are the trajectory's prompt, the one trained on.
#[tokio::test(start_paused = true)]
async fn an_environments_own_messages_are_the_chat_prompt() {
    let (proxy, _) = instant_proxy(4);
    let template = Arc::new(ChatTemplate::builtin().unwrap());
    let renderer = Renderer::Chat {
        template: Arc::clone(&template),
        system: Some("renderer system".into()),
    };
    let f: EnvFactory = Arc::new(|| Ok(Box::new(Conversational) as Box<dyn Env>));
    let m = manager(&proxy, renderer, cfg(1, 3));
    let g = m.run_group(Arc::clone(&f), 5, 1, 0).await;
    let t = &g.kept[0];
    let tok = Tokenizer::builtin();
    let prompt = tok.decode(&t.tokens[..t.prompt_len], false).unwrap();
    let expect = template
        .render(
            &[
                ChatMessage::system("own system"),
                ChatMessage::user("1+1?"),
                ChatMessage::assistant("2"),
                ChatMessage::user("2+2?"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(prompt, expect);
    let m = manager(&proxy, plain(), cfg(1, 3));
    let g = m.run_group(f, 5, 1, 0).await;
    let t = &g.kept[0];
    let prompt = tok.decode(&t.tokens[..t.prompt_len], true).unwrap();
    assert_eq!(prompt, "plain form");
    proxy.shutdown().await.unwrap();
}
