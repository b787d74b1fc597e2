//! Fault injection into whole controller runs (instant backends, paused time): environments
//! that panic, hang past their timeout or answer garbage; a weight sync that fails on one
//! backend; the controller's shutdown path with work in flight; and thousands of concurrent
//! trajectories with random delays. Every run must finish its steps with the accounting
//! balanced, never train a sample twice, never train a token older than its sample's start
//! version, and leave no environment alive behind it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollflash_core::buffer::{Batch, BufferConfig};
use rollflash_core::proxy::LeastLoaded;
use rollflash_core::{PauseMode, PolicyVersion, SamplingParams, Trajectory};
use rollflash_env::latency::{FailureConfig, FailureKind, Flaky};
use rollflash_env::{Env, EnvError, Reset, Step};
use rollflash_model::tokenizer::Tokenizer;
use rollflash_rollout::{
    Backend, BackendEntry, EnvFactory, EnvManager, EnvManagerConfig, InstantBackend, LlmProxy,
    ProxyConfig, Renderer, WeightUpdate,
};
use rollflash_trainer::{
    AsyncController, ControllerConfig, CoreConfig, Learner, LearnerError, RunReport, StepStats,
};
use tokio::sync::watch;

/// Environments alive now and at most, per test (tests run in parallel); every run must end
/// with none alive.
#[derive(Default)]
struct LiveEnvs {
    now: AtomicUsize,
    peak: AtomicUsize,
}

type Live = Arc<LiveEnvs>;

/// How one scripted environment misbehaves.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    PanicInReset,
    PanicInStep,
    /// Never answers `step`: only the manager's step timeout ends it.
    Hang,
    /// A reward that is not a number.
    NanReward,
}

/// A one- or multi-turn environment with a seeded random latency per step, and a fault.
struct ScriptedEnv {
    fault: Fault,
    rng: ChaCha8Rng,
    max_delay_ms: u64,
    turns: usize,
    turn: usize,
    live: Live,
}

impl ScriptedEnv {
    fn new(fault: Fault, seed: u64, max_delay_ms: u64, turns: usize, live: &Live) -> Self {
        let n = live.now.fetch_add(1, Ordering::SeqCst) + 1;
        live.peak.fetch_max(n, Ordering::SeqCst);
        ScriptedEnv {
            live: Arc::clone(live),
            fault,
            rng: ChaCha8Rng::seed_from_u64(seed),
            max_delay_ms,
            turns,
            turn: 0,
        }
    }
}

impl Drop for ScriptedEnv {
    fn drop(&mut self) {
        self.live.now.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Env for ScriptedEnv {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        if self.fault == Fault::PanicInReset {
            panic!("injected panic in reset");
        }
        Ok(Reset {
            observation: format!("task {seed}"),
            info: Default::default(),
        })
    }

    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let ms = self.rng.random_range(0..=self.max_delay_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        self.turn += 1;
        match self.fault {
            Fault::PanicInStep => panic!("injected panic in step"),
            Fault::Hang => std::future::pending().await,
            Fault::NanReward => Ok(Step {
                reward: f64::NAN,
                terminated: true,
                ..Default::default()
            }),
            _ => Ok(Step {
                observation: "go on".into(),
                // Varies with the sample, so groups are not all equal.
                reward: ((action.len() + self.rng.random_range(0..2)) % 2) as f64,
                terminated: self.turn >= self.turns,
                ..Default::default()
            }),
        }
    }
}

/// What the learner saw, for checks after the run.
#[derive(Default)]
struct Seen {
    /// (seed, index) of every trained trajectory: a repeat is a sample trained twice.
    samples: Vec<(u64, usize)>,
    versions: Vec<PolicyVersion>,
}

/// A hook the learner calls at the start of each step, to inject faults at chosen steps.
type StepHook = Box<dyn FnMut(PolicyVersion) + Send>;

/// A learner that checks every batch: whole groups, α respected, no token older than its
/// sample's start version, and records what it trained.
struct CheckingLearner {
    cfg: BufferConfig,
    seen: Arc<Mutex<Seen>>,
    hook: Option<StepHook>,
}

impl Learner for CheckingLearner {
    fn train(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError> {
        if let Some(h) = self.hook.as_mut() {
            h(batch.version);
        }
        let mut seen = self.seen.lock().unwrap();
        seen.versions.push(batch.version);
        assert_eq!(batch.groups.len(), self.cfg.groups_per_batch);
        for g in &batch.groups {
            assert_eq!(g.samples.len(), self.cfg.group_size, "whole groups only");
            assert!(
                batch.version.0 - g.start.0 <= self.cfg.max_staleness(),
                "a sample older than α was trained"
            );
            for (t, r) in &g.samples {
                assert!(r.is_finite(), "a non-finite reward reached the learner");
                assert!(t.is_consistent());
                assert!(t.end.as_ref().is_some_and(|e| e.is_usable()), "{:?}", t.end);
                for (i, v) in t.versions.iter().enumerate() {
                    if t.loss_mask[i] == 1 {
                        assert!(
                            *v >= t.start_version,
                            "token {i} of ({}, {}) was generated by version {v}, older than its start {}",
                            t.seed,
                            t.index,
                            t.start_version
                        );
                    }
                }
                seen.samples.push((t.seed, t.index));
            }
        }
        Ok((
            WeightUpdate::Disk {
                path: "unused".into(),
                version: PolicyVersion(batch.version.0 + 1),
            },
            StepStats::default(),
        ))
    }
}

/// One run's setup.
struct Setup {
    backends: Vec<Arc<InstantBackend>>,
    capacity: usize,
    buffer: BufferConfig,
    redundancy: usize,
    steps: usize,
    max_turns: usize,
    step_timeout: Duration,
    pause_mode: PauseMode,
    make_env: EnvFactory,
    hook: Option<StepHook>,
    probe_interval: Duration,
}

impl Setup {
    fn new(make_env: EnvFactory) -> Self {
        Setup {
            backends: (0..2)
                .map(|i| {
                    Arc::new(InstantBackend::with_delay(
                        format!("i{i}"),
                        Duration::from_millis(5),
                    ))
                })
                .collect(),
            capacity: 16,
            buffer: BufferConfig {
                groups_per_batch: 4,
                group_size: 4,
                alpha: 1.0,
                ..Default::default()
            },
            redundancy: 2,
            steps: 6,
            max_turns: 1,
            step_timeout: Duration::from_secs(10),
            pause_mode: PauseMode::Abort,
            make_env,
            hook: None,
            probe_interval: ProxyConfig::default().health_probe_interval,
        }
    }

    /// Runs the controller, shuts the proxy down, and checks what every run must satisfy.
    async fn run(self) -> (RunReport, Seen) {
        let entries = self
            .backends
            .iter()
            .map(|b| BackendEntry {
                backend: Arc::clone(b) as Arc<dyn Backend>,
                route: rollflash_rollout::WeightRoute::Direct,
                max_running_requests: self.capacity,
                update_timeout: None,
            })
            .collect();
        let proxy = LlmProxy::start(
            entries,
            Box::new(LeastLoaded),
            ProxyConfig {
                health_probe_interval: self.probe_interval,
                ..Default::default()
            },
        );
        let (vtx, vrx) = watch::channel(PolicyVersion(0));
        let envs = EnvManager::new(
            proxy.handle(),
            Arc::new(Tokenizer::builtin()),
            Renderer::Plain {
                separator: "\n".into(),
            },
            EnvManagerConfig {
                max_turns: self.max_turns,
                max_total_tokens: 256,
                sampling: SamplingParams {
                    max_new_tokens: 7,
                    ..Default::default()
                },
                step_timeout: self.step_timeout,
            },
            vrx,
        );
        let seen = Arc::new(Mutex::new(Seen::default()));
        let learner = CheckingLearner {
            cfg: self.buffer.clone(),
            seen: Arc::clone(&seen),
            hook: self.hook,
        };
        let ctl = AsyncController::new(
            ControllerConfig {
                core: CoreConfig {
                    buffer: self.buffer,
                    redundancy: self.redundancy,
                    steps: self.steps,
                    seed: 1,
                    ..ControllerConfig::default().core
                },
                pause_mode: self.pause_mode,
                ..Default::default()
            },
            proxy.handle(),
            envs,
            self.make_env,
            vtx,
            learner,
        )
        .unwrap();
        // A deadlock (or a lost wake-up) would park every task; paused time then jumps
        // straight to this bound and the test fails instead of hanging.
        let report = tokio::time::timeout(Duration::from_secs(24 * 3600), ctl.run())
            .await
            .expect("the run deadlocked")
            .unwrap();
        let counters = proxy.shutdown().await.unwrap();
        // For RELIABILITY.md (`--nocapture` shows it).
        eprintln!(
            "run: {:?} virtual, {:?}, proxy {counters:?}",
            report.wall, report.accounting
        );
        assert_eq!(report.steps.len(), self.steps);
        let a = report.accounting;
        assert!(a.balanced(), "{a:?}");
        // Groups that finished after the last batch stay counted as buffered; nothing runs.
        assert_eq!(a.running, 0, "{a:?}");
        assert_eq!(
            a.trained,
            (self.steps * a_batch(&report)) as u64,
            "every step trained a full batch"
        );
        assert_eq!(
            counters.submitted,
            counters.completed + counters.aborted + counters.failed,
            "every request the proxy took was answered: {counters:?}"
        );
        for b in &self.backends {
            assert_eq!(b.running(), 0, "{} still generates", b.name());
        }
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let unique: HashSet<_> = seen.samples.iter().collect();
        assert_eq!(
            unique.len(),
            seen.samples.len(),
            "a sample was trained twice"
        );
        assert_eq!(seen.samples.len() as u64, a.trained);
        (report, seen)
    }
}

fn a_batch(r: &RunReport) -> usize {
    r.steps.first().map_or(0, |s| s.samples)
}

/// Environments numbered as the factory builds them; `fault(k)` picks the k-th one's fault.
fn factory(fault: fn(u64) -> Fault, max_delay_ms: u64, turns: usize, live: &Live) -> EnvFactory {
    let n = Arc::new(AtomicU64::new(0));
    let live = Arc::clone(live);
    Arc::new(move || {
        let k = n.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(ScriptedEnv::new(fault(k), k, max_delay_ms, turns, &live)) as Box<dyn Env>)
    })
}

/// Half of all environments misbehave, in every way at once; redundancy (4 + 4) covers the
/// failures of most groups, and the run trains its six steps regardless.
#[tokio::test(start_paused = true)]
async fn panicking_hanging_and_garbage_environments_fail_only_their_trajectories() {
    let fault = |k: u64| match k % 10 {
        1 => Fault::PanicInStep,
        3 => Fault::Hang,
        5 => Fault::NanReward,
        7 => Fault::PanicInReset,
        _ => Fault::None,
    };
    // Flaky garbage on top: a fifth of the remaining calls lose their reply.
    let live = Live::default();
    let inner = factory(fault, 50, 1, &live);
    let wrapped = Arc::new(AtomicU64::new(0));
    let make_env: EnvFactory = Arc::new(move || {
        let env = inner()?;
        let seed = wrapped.fetch_add(1, Ordering::SeqCst);
        let flaky = Flaky::new(
            env,
            None,
            Some(FailureConfig {
                rate: 0.1,
                kind: FailureKind::Garbage,
            }),
            seed,
        )?;
        Ok(Box::new(flaky) as Box<dyn Env>)
    });
    let mut setup = Setup::new(make_env);
    setup.buffer.group_size = 4;
    setup.redundancy = 4;
    let (report, _) = setup.run().await;
    let a = report.accounting;
    assert!(a.failed > 0, "faults were injected: {a:?}");
    assert_eq!(
        live.now.load(Ordering::SeqCst),
        0,
        "hung environments were dropped"
    );
}

/// Each failure reason reaches the group result: the trajectory fails *with its reason*.
#[tokio::test(start_paused = true)]
async fn each_fault_fails_its_trajectory_with_a_reason_naming_it() {
    let proxy = LlmProxy::start(
        vec![BackendEntry {
            backend: Arc::new(InstantBackend::new("i")) as Arc<dyn Backend>,
            route: rollflash_rollout::WeightRoute::Direct,
            max_running_requests: 8,
            update_timeout: None,
        }],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let (_vtx, vrx) = watch::channel(PolicyVersion(0));
    let envs = EnvManager::new(
        proxy.handle(),
        Arc::new(Tokenizer::builtin()),
        Renderer::Plain {
            separator: "\n".into(),
        },
        EnvManagerConfig {
            step_timeout: Duration::from_secs(3),
            sampling: SamplingParams {
                max_new_tokens: 4,
                ..Default::default()
            },
            ..Default::default()
        },
        vrx,
    );
    for (fault, needle) in [
        (Fault::PanicInReset, "panic"),
        (Fault::PanicInStep, "panic"),
        (Fault::Hang, "timed out after 3.0s"),
        (Fault::NanReward, "reward NaN"),
    ] {
        let live = Live::default();
        let make: EnvFactory =
            Arc::new(move || Ok(Box::new(ScriptedEnv::new(fault, 0, 0, 1, &live)) as Box<dyn Env>));
        let g = envs.run_group(make, 1, 2, 0).await;
        assert_eq!(g.failed.len(), 2, "{fault:?}: {g:?}");
        assert!(!g.complete);
        for reason in &g.failed {
            assert!(reason.contains(needle), "{fault:?}: {reason}");
        }
    }
    proxy.shutdown().await.unwrap();
}

/// A weight sync fails on one of two backends at step 2 and it stays broken until step 5:
/// meanwhile it serves nothing (it would serve version-1 weights to samples started later),
/// so no trained token is older than its sample's start version; once healed it is caught
/// up and the run ends with both backends on the final weights.
#[tokio::test(start_paused = true)]
async fn a_weight_sync_failing_on_one_backend_never_trains_stale_tokens() {
    let live = Live::default();
    let mut setup = Setup::new(factory(|_| Fault::None, 200, 2, &live));
    setup.max_turns = 2;
    setup.steps = 8;
    setup.pause_mode = PauseMode::Keep;
    // Probes far more often than steps: a backend let back on health alone would serve
    // its old weights for several steps.
    setup.probe_interval = Duration::from_millis(10);
    let broken = Arc::clone(&setup.backends[1]);
    setup.hook = Some(Box::new(move |v: PolicyVersion| {
        // Called as step `v` starts; its publication is version v + 1.
        broken.set_failing_updates((2..5).contains(&v.0));
    }));
    let backends = setup.backends.clone();
    let (report, seen) = setup.run().await;
    assert_eq!(seen.versions.len(), 8);
    let last = PolicyVersion(8);
    assert_eq!(backends[0].version(), last);
    assert_eq!(
        backends[1].version(),
        last,
        "the broken backend was caught up"
    );
    assert!(report.accounting.balanced());
}

/// The controller's shutdown path: the run ends while many groups are still generating
/// (slow multi-turn environments, α = 2). They are aborted and counted; no environment,
/// request or backend call outlives the run.
#[tokio::test(start_paused = true)]
async fn ending_a_run_aborts_and_counts_everything_in_flight() {
    let live = Live::default();
    let mut setup = Setup::new(factory(|_| Fault::None, 2_000, 3, &live));
    setup.max_turns = 3;
    setup.steps = 3;
    setup.buffer.alpha = 2.0;
    setup.redundancy = 0;
    let (report, _) = setup.run().await;
    let a = report.accounting;
    assert!(
        a.aborted > 0,
        "groups were in flight when the run ended: {a:?}"
    );
    assert_eq!(live.now.load(Ordering::SeqCst), 0);
}

/// Thousands of trajectories at once (64 groups × 16 per batch, α = 2: up to ~3000 in
/// flight), three turns each with random environment delays, through four backends of 32
/// slots with abort-mode syncs that preempt everything running: no deadlock, no lost
/// wake-up, exact accounting.
#[tokio::test(start_paused = true)]
async fn thousands_of_concurrent_trajectories_with_random_delays() {
    let live = Live::default();
    let mut setup = Setup::new(factory(|_| Fault::None, 1_000, 3, &live));
    setup.backends = (0..4)
        .map(|i| {
            Arc::new(InstantBackend::with_delay(
                format!("i{i}"),
                Duration::from_millis(1 + 3 * i),
            ))
        })
        .collect();
    setup.capacity = 32;
    setup.buffer = BufferConfig {
        groups_per_batch: 64,
        group_size: 16,
        alpha: 2.0,
        ..Default::default()
    };
    setup.redundancy = 2;
    setup.max_turns = 3;
    setup.steps = 4;
    let (report, _) = setup.run().await;
    let a = report.accounting;
    assert!(a.started >= 3 * 64 * 18, "{a:?}");
    let peak = live.peak.load(Ordering::SeqCst);
    eprintln!("peak concurrent trajectories: {peak}");
    assert!(peak >= 2000, "{peak}");
    assert_eq!(live.now.load(Ordering::SeqCst), 0);
}
