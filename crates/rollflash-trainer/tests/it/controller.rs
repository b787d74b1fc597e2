//! The AsyncController end to end over instant backends and scripted environments (paused
//! time): α bounds staleness, batches are whole groups, the synchronous baseline is on-policy,
//! and every started sample is accounted for.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rollflash_core::buffer::{Batch, BufferConfig};
use rollflash_core::controller::Waiting;
use rollflash_core::proxy::LeastLoaded;
use rollflash_core::timeline::{EventKind, TimelineEvent, TimelineSink};
use rollflash_core::{PauseMode, PolicyVersion, SamplingParams, Trajectory};
use rollflash_env::{Env, EnvError, Reset, Step};
use rollflash_model::tokenizer::Tokenizer;
use rollflash_rollout::GroupResult;
use rollflash_rollout::Timeline;
use rollflash_rollout::{
    Backend, BackendEntry, EnvFactory, EnvManager, EnvManagerConfig, InstantBackend, LlmProxy,
    ProxyConfig, Renderer, WeightUpdate,
};
use rollflash_trainer::{
    AsyncController, ControllerConfig, CoreConfig, EnvGroups, GroupRunner, Learner, LearnerError,
    NoSink, RunEnd, StepStats, StopFlag,
};
use tokio::sync::watch;

/// One step, reward depends on the seed so groups have variance; latency grows with the
/// seed's residue to give a long tail; seed % 13 == 0 crashes.
struct TailEnv {
    seed: u64,
    _live: Live,
}

/// Counts environments alive, so a test can check that none outlives the run.
struct Live(Arc<AtomicUsize>);

impl Live {
    fn new(n: &Arc<AtomicUsize>) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Live(Arc::clone(n))
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Env for TailEnv {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        self.seed = seed;
        Ok(Reset {
            observation: format!("task {seed}"),
            info: Default::default(),
        })
    }
    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let ms = 10 + (self.seed % 7) * (self.seed % 7) * 40;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(Step {
            reward: (action.len() % 2) as f64,
            terminated: true,
            ..Default::default()
        })
    }
}

/// (version trained from, start versions of its groups) per step.
type Seen = Arc<std::sync::Mutex<Vec<(PolicyVersion, Vec<PolicyVersion>)>>>;

/// A learner that checks each batch and takes a fixed (virtual) time.
struct CheckingLearner {
    cfg: BufferConfig,
    seen: Seen,
    /// Asks for a stop while training this step (a Ctrl-C mid-step).
    stop_at: Option<(usize, StopFlag)>,
}

impl Learner for CheckingLearner {
    fn train(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError> {
        assert_eq!(batch.groups.len(), self.cfg.groups_per_batch);
        for g in &batch.groups {
            assert_eq!(g.samples.len(), self.cfg.group_size, "whole groups only");
            assert!(
                batch.version.0 - g.start.0 <= self.cfg.max_staleness(),
                "a sample older than α was trained"
            );
        }
        let mut seen = self.seen.lock().unwrap();
        if let Some((at, stop)) = &self.stop_at {
            if seen.len() == *at {
                stop.stop();
            }
        }
        seen.push((
            batch.version,
            batch.groups.iter().map(|g| g.start).collect(),
        ));
        Ok((
            WeightUpdate::Disk {
                path: "unused".into(),
                version: PolicyVersion(batch.version.0 + 1),
            },
            StepStats::default(),
        ))
    }
}

/// A proxy over `backends`, an environment manager and a factory of [`TailEnv`]s.
struct Rollout {
    proxy: LlmProxy,
    envs: EnvManager,
    make_env: EnvFactory,
    version: watch::Sender<PolicyVersion>,
    /// Environments alive.
    live: Arc<AtomicUsize>,
}

fn rollout(backends: Vec<Arc<InstantBackend>>) -> Rollout {
    rollout_with(backends, ProxyConfig::default())
}

fn rollout_with(backends: Vec<Arc<InstantBackend>>, cfg: ProxyConfig) -> Rollout {
    rollout_over(
        backends
            .into_iter()
            .map(|b| b as Arc<dyn Backend>)
            .collect(),
        cfg,
    )
}

/// As [`rollout_with`], over backends of any kind.
fn rollout_over(backends: Vec<Arc<dyn Backend>>, cfg: ProxyConfig) -> Rollout {
    let backends: Vec<BackendEntry> = backends
        .into_iter()
        .map(|backend| BackendEntry {
            backend,
            route: rollflash_rollout::WeightRoute::Direct,
            max_running_requests: 16,
            update_timeout: None,
        })
        .collect();
    let proxy = LlmProxy::start(backends, Box::new(LeastLoaded), cfg);
    let (vtx, vrx) = watch::channel(PolicyVersion(0));
    let envs = EnvManager::new(
        proxy.handle(),
        Arc::new(Tokenizer::builtin()),
        Renderer::Plain {
            separator: "\n".into(),
        },
        EnvManagerConfig {
            max_turns: 1,
            max_total_tokens: 64,
            sampling: SamplingParams {
                max_new_tokens: 7,
                ..Default::default()
            },
            step_timeout: Duration::from_secs(10),
        },
        vrx,
    );
    let live = Arc::new(AtomicUsize::new(0));
    let live_envs = Arc::clone(&live);
    let make_env: EnvFactory = Arc::new(move || {
        Ok(Box::new(TailEnv {
            seed: 0,
            _live: Live::new(&live_envs),
        }) as Box<dyn Env>)
    });
    Rollout {
        proxy,
        envs,
        make_env,
        version: vtx,
        live,
    }
}

async fn run(
    alpha: f64,
    barrier: bool,
    redundancy: usize,
) -> (
    rollflash_trainer::RunReport,
    Vec<(PolicyVersion, Vec<PolicyVersion>)>,
) {
    let (report, seen, _) = run_stopping(alpha, barrier, redundancy, None).await;
    (report, seen)
}

/// As [`run`], asking for a stop during step `stop_at` when given; also returns how many
/// environments are still alive after the run.
async fn run_stopping(
    alpha: f64,
    barrier: bool,
    redundancy: usize,
    stop_at: Option<usize>,
) -> (
    rollflash_trainer::RunReport,
    Vec<(PolicyVersion, Vec<PolicyVersion>)>,
    usize,
) {
    let backends = (0..2)
        .map(|i| {
            Arc::new(InstantBackend::with_delay(
                format!("i{i}"),
                Duration::from_millis(5),
            ))
        })
        .collect();
    let Rollout {
        proxy,
        envs,
        make_env,
        version: vtx,
        live,
    } = rollout(backends);
    let buffer = BufferConfig {
        groups_per_batch: 4,
        group_size: 4,
        alpha,
        extra_groups: 0,
        barrier,
        ..Default::default()
    };
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = StopFlag::new();
    let learner = CheckingLearner {
        cfg: buffer.clone(),
        seen: Arc::clone(&seen),
        stop_at: stop_at.map(|at| (at, stop.clone())),
    };
    let ctl = AsyncController::new(
        ControllerConfig {
            core: CoreConfig {
                buffer,
                redundancy,
                steps: 6,
                seed: 1,
                ..ControllerConfig::default().core
            },
            pause_mode: PauseMode::Abort,
            ..Default::default()
        },
        proxy.handle(),
        envs,
        make_env,
        vtx,
        learner,
    )
    .unwrap()
    .with_stop(stop);
    let report = ctl.run().await.unwrap();
    let alive = live.load(Ordering::SeqCst);
    proxy.shutdown().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    (report, seen, alive)
}

#[tokio::test(start_paused = true)]
async fn async_run_bounds_staleness_and_accounts_for_every_sample() {
    for alpha in [1.0, 2.0] {
        let (report, seen) = run(alpha, false, 1).await;
        assert_eq!(report.steps.len(), 6);
        assert_eq!(seen.len(), 6);
        for (i, (v, _)) in seen.iter().enumerate() {
            assert_eq!(v.0, i as u64, "one version per step");
        }
        let a = report.accounting;
        assert!(a.balanced(), "{a:?}");
        assert_eq!(a.trained, 6 * 16);
        assert_eq!((a.running, a.buffered), (0, 0));
        assert!(report
            .staleness
            .iter()
            .all(|(s, _)| *s as f64 <= alpha.ceil()));
        // Redundancy: one extra trajectory per group was started and aborted (or failed).
        assert!(a.aborted + a.failed >= 6 * 4);
    }
}

#[tokio::test(start_paused = true)]
async fn synchronous_baseline_is_on_policy() {
    let (report, seen) = run(0.0, true, 0).await;
    assert_eq!(report.steps.len(), 6);
    for (v, starts) in &seen {
        assert!(
            starts.iter().all(|s| s == v),
            "α = 0 trains only current samples"
        );
    }
    assert_eq!(report.staleness, vec![(0, 6 * 16)]);
    assert!(report.accounting.balanced());
}

/// The point of it all: with a long-tailed environment, the asynchronous run finishes the
/// same number of steps in less (virtual) time than the synchronous one.
#[tokio::test(start_paused = true)]
async fn async_beats_sync_on_a_long_tail_in_virtual_time() {
    let (sync, _) = run(0.0, true, 0).await;
    let (asy, _) = run(2.0, false, 0).await;
    assert!(
        asy.wall < sync.wall,
        "async {:?} vs sync {:?}",
        asy.wall,
        sync.wall
    );
}

/// Ctrl-C mid-step: the running step finishes and is published, rollout in flight is
/// aborted and counted, nothing is left buffered or running, and no environment outlives
/// the run.
#[tokio::test(start_paused = true)]
async fn a_stop_mid_run_aborts_rollout_publishes_the_running_step_and_accounts_for_all() {
    for (alpha, barrier) in [(0.0, true), (2.0, false)] {
        let (report, seen, alive) = run_stopping(alpha, barrier, 1, Some(2)).await;
        assert!(report.interrupted);
        assert_eq!(
            report.steps.len(),
            3,
            "steps 0 and 1, and the one the stop came in"
        );
        assert_eq!(seen.len(), 3);
        assert_eq!(report.cursor.steps_done, 3);
        assert_eq!(report.cursor.version, PolicyVersion(3));
        let a = report.accounting;
        assert!(a.balanced(), "{a:?}");
        assert_eq!((a.running, a.buffered), (0, 0), "{a:?}");
        assert_eq!(a.trained, 3 * 16);
        if !barrier {
            assert!(a.aborted > 3 * 4, "work in flight was aborted: {a:?}");
        }
        assert_eq!(alive, 0, "an environment outlived the run");
    }
    // Without a stop nothing changes.
    let (report, _, alive) = run_stopping(1.0, false, 0, None).await;
    assert!(!report.interrupted);
    assert_eq!((report.steps.len(), alive), (6, 0));
}

/// Rolls groups out with [`EnvGroups`], except that the group of task seed `panic_seed`
/// panics in the group task itself (not in an environment, which the manager catches).
struct PanickingGroups {
    inner: EnvGroups,
    panic_seed: u64,
}

#[async_trait]
impl GroupRunner for PanickingGroups {
    async fn run_group(&self, seed: u64, group_size: usize, redundancy: usize) -> GroupResult {
        if seed == self.panic_seed {
            panic!("boom in group {seed}");
        }
        self.inner.run_group(seed, group_size, redundancy).await
    }
}

/// A group task that panics is counted as failed, with its panic message, and another group
/// takes its place: the synchronous baseline used to wait forever for its batch.
#[tokio::test(start_paused = true)]
async fn a_panicking_group_task_counts_as_failed_and_the_run_goes_on() {
    for barrier in [true, false] {
        let r = rollout(vec![Arc::new(InstantBackend::with_delay(
            "i0",
            Duration::from_millis(5),
        ))]);
        let buffer = BufferConfig {
            groups_per_batch: 2,
            group_size: 4,
            alpha: if barrier { 0.0 } else { 1.0 },
            barrier,
            ..Default::default()
        };
        let learner = CheckingLearner {
            cfg: buffer.clone(),
            seen: Arc::default(),
            stop_at: None,
        };
        let groups = PanickingGroups {
            inner: EnvGroups {
                envs: r.envs.clone(),
                make_env: Arc::clone(&r.make_env),
            },
            panic_seed: 2,
        };
        let ctl = AsyncController::with_groups(
            ControllerConfig {
                core: CoreConfig {
                    buffer,
                    redundancy: 1,
                    steps: 3,
                    seed: 1,
                    ..ControllerConfig::default().core
                },
                ..Default::default()
            },
            r.proxy.handle(),
            Arc::new(groups),
            r.version,
            learner,
        )
        .unwrap();
        let report = tokio::time::timeout(Duration::from_secs(24 * 3600), ctl.run())
            .await
            .expect("the run waited forever for the panicked group")
            .unwrap();
        assert_eq!(report.steps.len(), 3);
        let a = report.accounting;
        assert!(a.balanced(), "{a:?}");
        assert!(
            a.failed >= 5,
            "the lost group's 4 + 1 samples failed: {a:?}"
        );
        assert_eq!(report.lost_groups.len(), 1, "{:?}", report.lost_groups);
        assert!(
            report.lost_groups[0].contains("boom in group 2"),
            "{:?}",
            report.lost_groups
        );
        r.proxy.shutdown().await.unwrap();
    }
}

/// The only backend cannot load any weight update: after the first step's sync nothing can
/// generate under the current weights. The run stops as stalled after `serve_timeout`
/// (it used to wait forever while the proxy retried the update).
#[tokio::test(start_paused = true)]
async fn a_weight_sync_no_backend_can_load_stops_the_run_as_stalled() {
    let backend = Arc::new(InstantBackend::with_delay("i0", Duration::from_millis(5)));
    backend.set_failing_updates(true);
    let r = rollout(vec![Arc::clone(&backend)]);
    let buffer = BufferConfig {
        groups_per_batch: 2,
        group_size: 2,
        alpha: 1.0,
        ..Default::default()
    };
    let learner = CheckingLearner {
        cfg: buffer.clone(),
        seen: Arc::default(),
        stop_at: None,
    };
    let ctl = AsyncController::new(
        ControllerConfig {
            core: CoreConfig {
                buffer,
                steps: 4,
                seed: 1,
                serve_timeout: Duration::from_secs(30),
                ..ControllerConfig::default().core
            },
            ..Default::default()
        },
        r.proxy.handle(),
        r.envs.clone(),
        Arc::clone(&r.make_env),
        r.version,
        learner,
    )
    .unwrap();
    let (report, learner) = tokio::time::timeout(
        Duration::from_secs(24 * 3600),
        ctl.run_with_sink(&mut NoSink),
    )
    .await
    .expect("the run waited forever for a backend")
    .unwrap();
    let RunEnd::Stalled { version, waited } = report.end else {
        panic!("the run ended {:?}", report.end);
    };
    assert!(
        learner.is_some(),
        "the learner comes back, to be checkpointed"
    );
    assert_eq!(version, report.cursor.version);
    assert!(waited >= Duration::from_secs(30), "{waited:?}");
    assert!(
        report.steps.len() < 4,
        "stopped before its steps: {}",
        report.steps.len()
    );
    let a = report.accounting;
    assert!(a.balanced() && a.running == 0 && a.buffered == 0, "{a:?}");
    assert_eq!(
        r.live.load(Ordering::SeqCst),
        0,
        "no environment outlives the run"
    );
    r.proxy.shutdown().await.unwrap();
}

/// Timeline events kept in memory.
#[derive(Default)]
struct Recorded(std::sync::Mutex<Vec<TimelineEvent>>);

impl TimelineSink for Recorded {
    fn record(&self, event: TimelineEvent) {
        self.0.lock().unwrap().push(event);
    }
}

/// The synchronous baseline's timeline, as the proxy and the controller report it: a train
/// bar per step, a pause and a weight load per backend per step, generation on both
/// backends, and no generation overlapping a training step (the picture the baseline
/// draws).
#[tokio::test(start_paused = true)]
async fn the_timeline_shows_every_step_sync_and_pause_and_the_baseline_never_overlaps() {
    let rec = Arc::new(Recorded::default());
    let timeline = Timeline::new(Arc::clone(&rec) as Arc<dyn TimelineSink>);
    let backends = (0..2)
        .map(|i| {
            Arc::new(InstantBackend::with_delay(
                format!("i{i}"),
                Duration::from_millis(5),
            ))
        })
        .collect();
    let r = rollout_with(
        backends,
        ProxyConfig {
            timeline: Some(timeline.clone()),
            ..Default::default()
        },
    );
    let buffer = BufferConfig {
        groups_per_batch: 2,
        group_size: 4,
        alpha: 0.0,
        extra_groups: 0,
        barrier: true,
        ..Default::default()
    };
    let learner = CheckingLearner {
        cfg: buffer.clone(),
        seen: Arc::default(),
        stop_at: None,
    };
    let ctl = AsyncController::new(
        ControllerConfig {
            core: CoreConfig {
                buffer,
                steps: 3,
                seed: 1,
                ..ControllerConfig::default().core
            },
            ..Default::default()
        },
        r.proxy.handle(),
        r.envs,
        r.make_env,
        r.version,
        learner,
    )
    .unwrap()
    .with_timeline(timeline);
    let report = ctl.run().await.unwrap();
    r.proxy.shutdown().await.unwrap();
    let ev = rec.0.lock().unwrap().clone();
    let of = |k: EventKind| ev.iter().filter(move |e| e.kind == k);
    let train: Vec<_> = of(EventKind::Train).collect();
    assert_eq!(train.len(), 3);
    for (i, t) in train.iter().enumerate() {
        assert_eq!(
            (t.lane.as_str(), t.version, t.count),
            ("trainer", i as u64, 8)
        );
    }
    assert_eq!(of(EventKind::Sync).count(), 3 * 2);
    assert!(of(EventKind::Sync).all(|e| e.count == 1));
    assert_eq!(of(EventKind::Pause).count(), 3 * 2);
    let generate: Vec<_> = of(EventKind::Generate).collect();
    for lane in ["i0", "i1"] {
        assert!(
            generate.iter().any(|e| e.lane == lane),
            "no generation on {lane}"
        );
    }
    // Every trained sample's request finished inside some busy interval.
    let finished: u64 = generate.iter().map(|e| e.count).sum();
    assert!(
        finished >= report.accounting.trained,
        "{finished} requests in the bars"
    );
    for g in &generate {
        for t in &train {
            assert!(
                g.end_ms <= t.start_ms || g.start_ms >= t.end_ms,
                "the baseline generated while it trained: {g:?} {t:?}"
            );
        }
    }
}

/// Groups that never finish: a wedged environment fleet, as the controller sees it.
struct HangingGroups;

#[async_trait]
impl GroupRunner for HangingGroups {
    async fn run_group(&self, _: u64, _: usize, _: usize) -> GroupResult {
        std::future::pending().await
    }
}

/// With no step published for `stall_report`, the run says what it waits on, again every
/// interval, until the progress deadline stops it: the trainer waiting for a batch that no
/// running group delivers, and the proxy's backends.
#[tokio::test(start_paused = true)]
async fn a_run_that_makes_no_progress_reports_what_waits_on_what() {
    let r = rollout(vec![Arc::new(InstantBackend::with_delay(
        "i0",
        Duration::from_millis(5),
    ))]);
    let buffer = BufferConfig {
        groups_per_batch: 2,
        group_size: 2,
        alpha: 1.0,
        ..Default::default()
    };
    let learner = CheckingLearner {
        cfg: buffer.clone(),
        seen: Arc::default(),
        stop_at: None,
    };
    let ctl = AsyncController::with_groups(
        ControllerConfig {
            core: CoreConfig {
                buffer,
                steps: 2,
                seed: 1,
                progress_timeout: Duration::from_secs(300),
                ..ControllerConfig::default().core
            },
            stall_report: Some(Duration::from_secs(60)),
            ..Default::default()
        },
        r.proxy.handle(),
        Arc::new(HangingGroups),
        r.version,
        learner,
    )
    .unwrap();
    let (report, _) = tokio::time::timeout(
        Duration::from_secs(24 * 3600),
        ctl.run_with_sink(&mut NoSink),
    )
    .await
    .expect("the run waited forever")
    .unwrap();
    assert!(
        matches!(report.end, RunEnd::NoProgress { .. }),
        "{:?}",
        report.end
    );
    // At 60, 120, 180, 240 s (and perhaps at the 300 s deadline itself).
    let n = report.stall_reports.len();
    assert!((4..=5).contains(&n), "{n} reports");
    let first = &report.stall_reports[0];
    assert_eq!(first.since_step.as_secs(), 60);
    assert_eq!(
        first.waiting,
        Waiting::Batch {
            ready_groups: 0,
            groups_per_batch: 2,
            running_groups: 4,
            admissible: 0,
        },
        "α = 1 admits two batches of groups, all hanging"
    );
    let text = first.to_string();
    for want in [
        "no step published for 60 s (0 steps done)",
        "the trainer waits for a batch (0 of 2 groups ready, 4 rolling out, 0 more may start)",
        "proxy: 0 queued; i0: 0 running, in rotation",
        "8 running",
    ] {
        assert!(text.contains(want), "{want:?} not in {text:?}");
    }
    assert_eq!(report.stall_reports[1].since_step.as_secs(), 120);
    r.proxy.shutdown().await.unwrap();
}

/// A sync no backend can load: the report says so, with the backend out of rotation.
#[tokio::test(start_paused = true)]
async fn a_stall_report_names_the_backend_that_does_not_serve_the_new_weights() {
    let backend = Arc::new(InstantBackend::with_delay("i0", Duration::from_millis(5)));
    backend.set_failing_updates(true);
    let r = rollout(vec![Arc::clone(&backend)]);
    let buffer = BufferConfig {
        groups_per_batch: 2,
        group_size: 2,
        alpha: 1.0,
        ..Default::default()
    };
    let learner = CheckingLearner {
        cfg: buffer.clone(),
        seen: Arc::default(),
        stop_at: None,
    };
    let ctl = AsyncController::new(
        ControllerConfig {
            core: CoreConfig {
                buffer,
                steps: 4,
                seed: 1,
                serve_timeout: Duration::from_secs(30),
                ..ControllerConfig::default().core
            },
            stall_report: Some(Duration::from_secs(10)),
            ..Default::default()
        },
        r.proxy.handle(),
        r.envs.clone(),
        Arc::clone(&r.make_env),
        r.version,
        learner,
    )
    .unwrap();
    let (report, _) = tokio::time::timeout(
        Duration::from_secs(24 * 3600),
        ctl.run_with_sink(&mut NoSink),
    )
    .await
    .expect("the run waited forever")
    .unwrap();
    assert!(matches!(report.end, RunEnd::Stalled { .. }));
    let first = report.stall_reports.first().expect("a stall report");
    assert!(
        matches!(first.waiting, Waiting::Unserved { .. }),
        "{:?}",
        first.waiting
    );
    let text = first.to_string();
    let serves = format!("no backend serves {}", report.cursor.version);
    for want in [serves.as_str(), "i0: 0 running, OUT of rotation"] {
        assert!(text.contains(want), "{want:?} not in {text:?}");
    }
    r.proxy.shutdown().await.unwrap();
}

/// Publishes weights one version ahead of what the controller decided from the second step on.
struct LyingLearner;

impl Learner for LyingLearner {
    fn train(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError> {
        let skip = if batch.version.0 == 0 { 1 } else { 2 };
        Ok((
            WeightUpdate::Disk {
                path: "unused".into(),
                version: PolicyVersion(batch.version.0 + skip),
            },
            StepStats::default(),
        ))
    }
}

/// The core is the one author of the version: a learner that reports another stops the run
/// before its weights reach a backend or the rollouts' version, and every sample is counted.
#[tokio::test(start_paused = true)]
async fn a_learner_reporting_another_version_fails_the_run() {
    let backends = vec![Arc::new(InstantBackend::with_delay(
        "i0".to_string(),
        Duration::from_millis(5),
    ))];
    let Rollout {
        proxy,
        envs,
        make_env,
        version: vtx,
        ..
    } = rollout(backends);
    let seen = vtx.subscribe();
    let ctl = AsyncController::new(
        ControllerConfig {
            core: CoreConfig {
                buffer: BufferConfig {
                    groups_per_batch: 2,
                    group_size: 2,
                    alpha: 1.0,
                    ..Default::default()
                },
                steps: 4,
                seed: 1,
                ..ControllerConfig::default().core
            },
            ..Default::default()
        },
        proxy.handle(),
        envs,
        make_env,
        vtx,
        LyingLearner,
    )
    .unwrap();
    let err = ctl.run().await.unwrap_err();
    match err {
        rollflash_trainer::ControllerError::VersionMismatch { expected, learner } => {
            assert_eq!((expected, learner), (PolicyVersion(2), PolicyVersion(3)));
        }
        e => panic!("expected a version mismatch, got {e}"),
    }
    // Only the first (honest) step reached the rollouts; no backend took version 3.
    assert_eq!(*seen.borrow(), PolicyVersion(1));
    let m = proxy.handle().metrics().await.unwrap();
    assert!(m.backends.iter().all(|(_, _, up)| *up));
    proxy.shutdown().await.unwrap();
}

/// A server that keeps trained weights in memory (as SkyRL does) over an instant backend:
/// [`Forgetful::restart`] loses every copy saved so far, after which the weights it was
/// serving, and any update to a lost copy, fail until it is given a copy saved after the
/// restart.
struct Forgetful {
    inner: InstantBackend,
    state: std::sync::Mutex<ForgetfulState>,
}

#[derive(Default)]
struct ForgetfulState {
    /// Copies the server has lost (update paths).
    lost: Vec<String>,
    /// Copies loaded, in order.
    loaded: Vec<String>,
    /// Whether the copy it samples from was lost.
    broken: bool,
}

impl Forgetful {
    fn restart(&self) {
        let mut s = self.state.lock().unwrap();
        let lost = s.loaded.clone();
        s.lost.extend(lost);
        s.broken = true;
    }

    fn check(&self) -> Result<(), rollflash_rollout::BackendError> {
        if self.state.lock().unwrap().broken {
            return Err(rollflash_rollout::BackendError::Unavailable {
                backend: "forgetful".into(),
                reason: "model not loaded".into(),
                source: None,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Backend for Forgetful {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn generate(
        &self,
        req: rollflash_core::GenRequest,
    ) -> Result<rollflash_core::GenOutput, rollflash_rollout::BackendError> {
        self.check()?;
        let out = self.inner.generate(req).await;
        // A restart fails what was in flight too.
        self.check()?;
        out
    }
    async fn abort(
        &self,
        id: rollflash_core::RequestId,
    ) -> Result<(), rollflash_rollout::BackendError> {
        self.inner.abort(id).await
    }
    async fn pause(&self, mode: PauseMode) -> Result<(), rollflash_rollout::BackendError> {
        self.inner.pause(mode).await
    }
    async fn resume(&self) -> Result<(), rollflash_rollout::BackendError> {
        self.inner.resume().await
    }
    async fn update_weights(
        &self,
        update: &WeightUpdate,
    ) -> Result<(), rollflash_rollout::BackendError> {
        let WeightUpdate::Disk { path, .. } = update else {
            panic!("{update:?}");
        };
        let path = path.display().to_string();
        if self.state.lock().unwrap().lost.contains(&path) {
            return Err(rollflash_rollout::BackendError::Unavailable {
                backend: "forgetful".into(),
                reason: format!("{path}: model not loaded"),
                source: None,
            });
        }
        self.inner.update_weights(update).await?;
        let mut s = self.state.lock().unwrap();
        s.loaded.push(path);
        s.broken = false;
        Ok(())
    }
    async fn load(
        &self,
    ) -> Result<rollflash_rollout::BackendLoad, rollflash_rollout::BackendError> {
        self.inner.load().await
    }
    async fn health(&self) -> Result<(), rollflash_rollout::BackendError> {
        self.inner.health().await
    }
}

/// A learner whose trainer is the [`Forgetful`] server: it saves each version as
/// `gen-version`; in its idle calls it restarts the server once, after `restart_after` is
/// published, and on the next call notices, rebuilds (a new `gen`) and hands back the last
/// version's weights again — under `version + lie`.
struct RemoteLike {
    server: Arc<Forgetful>,
    restart_after: PolicyVersion,
    published: PolicyVersion,
    generation: usize,
    restarted: bool,
    rebuilt: Arc<AtomicUsize>,
    lie: u64,
}

impl RemoteLike {
    fn update(&self, version: PolicyVersion) -> WeightUpdate {
        WeightUpdate::Disk {
            path: format!("{}-v{}", self.generation, version.0).into(),
            version,
        }
    }
}

impl Learner for RemoteLike {
    fn train(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError> {
        assert!(
            !self.restarted || self.generation > 0,
            "trained on a lost model"
        );
        self.published = batch.version.next();
        Ok((self.update(self.published), StepStats::default()))
    }

    fn idle_every(&self) -> Option<Duration> {
        Some(Duration::from_millis(2))
    }

    fn idle(&mut self) -> Result<Option<WeightUpdate>, LearnerError> {
        if self.published < self.restart_after || self.generation > 0 {
            return Ok(None);
        }
        if !self.restarted {
            self.server.restart();
            self.restarted = true;
            return Ok(None);
        }
        self.generation += 1;
        self.rebuilt.fetch_add(1, Ordering::SeqCst);
        let mut u = self.update(self.published);
        if let WeightUpdate::Disk { version, .. } = &mut u {
            version.0 += self.lie;
        }
        Ok(Some(u))
    }
}

async fn run_forgetful(
    lie: u64,
) -> (
    Result<rollflash_trainer::RunReport, rollflash_trainer::ControllerError>,
    Arc<Forgetful>,
    usize,
) {
    let server = Arc::new(Forgetful {
        inner: InstantBackend::with_delay("forgetful", Duration::from_millis(5)),
        state: Default::default(),
    });
    let r = rollout_over(
        vec![Arc::clone(&server) as Arc<dyn Backend>],
        ProxyConfig::default(),
    );
    let rebuilt = Arc::new(AtomicUsize::new(0));
    let learner = RemoteLike {
        server: Arc::clone(&server),
        restart_after: PolicyVersion(2),
        published: PolicyVersion(0),
        generation: 0,
        restarted: false,
        rebuilt: Arc::clone(&rebuilt),
        lie,
    };
    let ctl = AsyncController::new(
        ControllerConfig {
            core: CoreConfig {
                // The synchronous baseline: nothing sampled before the restart can make
                // the next batch, so only the rebuilt weights let the run go on.
                buffer: BufferConfig {
                    groups_per_batch: 2,
                    group_size: 2,
                    alpha: 0.0,
                    barrier: true,
                    ..Default::default()
                },
                steps: 5,
                seed: 1,
                serve_timeout: Duration::from_secs(60),
                ..ControllerConfig::default().core
            },
            ..Default::default()
        },
        r.proxy.handle(),
        r.envs.clone(),
        Arc::clone(&r.make_env),
        r.version,
        learner,
    )
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(24 * 3600), ctl.run())
        .await
        .expect("the run waited forever");
    r.proxy.shutdown().await.unwrap();
    (out, server, rebuilt.load(Ordering::SeqCst))
}

/// A remote trainer's server restarts while the learner waits for a batch: it loses the
/// trained weights, so its samplers can serve nothing and no batch would ever come. The
/// learner's idle call notices, rebuilds and hands back the same version's weights saved
/// again; the controller gives them to the fleet's catch-up (no sync, no new version), the
/// backend rejoins, and the run finishes every step with every sample counted.
#[tokio::test(start_paused = true)]
async fn a_learner_that_rebuilds_its_weights_while_idle_brings_the_fleet_back() {
    let (out, server, rebuilt) = run_forgetful(0).await;
    let report = out.unwrap();
    assert_eq!(report.end, RunEnd::Completed);
    assert_eq!(report.steps.len(), 5);
    assert_eq!(rebuilt, 1);
    let loaded = server.state.lock().unwrap().loaded.clone();
    assert!(
        loaded.contains(&"1-v2".to_string()),
        "the backend caught up to the rebuilt copy: {loaded:?}"
    );
    assert_eq!(
        loaded.last().map(String::as_str),
        Some("1-v5"),
        "{loaded:?}"
    );
    assert_eq!(server.inner.version(), PolicyVersion(5));
    let a = report.accounting;
    assert!(a.balanced() && a.running == 0 && a.buffered == 0, "{a:?}");
}

/// The version an idle call hands back is checked like a step's: another one stops the run.
#[tokio::test(start_paused = true)]
async fn an_idle_rebuild_under_another_version_fails_the_run() {
    let (out, server, _) = run_forgetful(1).await;
    match out {
        Err(rollflash_trainer::ControllerError::VersionMismatch { expected, learner }) => {
            assert_eq!((expected, learner), (PolicyVersion(2), PolicyVersion(3)));
        }
        other => panic!("expected a version mismatch, got {other:?}"),
    }
    assert!(
        !server
            .state
            .lock()
            .unwrap()
            .loaded
            .iter()
            .any(|p| p.starts_with("1-")),
        "the lying copy reached no backend"
    );
}
