//! The LLMProxy over real tasks: queueing, replication, aborts, pause/resume in both modes
//! with real engines, failover, weight sync, a backend that never answers, shutdown.

use std::sync::Arc;
use std::time::Duration;

use rollflash_core::proxy::{LeastLoaded, RoundRobin};
use rollflash_core::{FinishReason, GenRequest, PauseMode, PolicyVersion, SamplingParams};
use rollflash_rollout::{
    Backend, BackendEntry, InstantBackend, LlmProxy, ProxyConfig, ProxyError, Replication,
    WeightUpdate,
};

use crate::common;

fn entry(b: Arc<dyn Backend>, cap: usize) -> BackendEntry {
    BackendEntry {
        backend: b,
        route: rollflash_rollout::WeightRoute::Direct,
        max_running_requests: cap,
        update_timeout: None,
    }
}

fn params(n: usize) -> SamplingParams {
    SamplingParams {
        max_new_tokens: n,
        seed: Some(7),
        ..Default::default()
    }
}

/// Far beyond any deadline the proxy sets (paused time: it costs nothing to wait), so a
/// request that would hang forever fails its test instead.
const FOREVER: Duration = Duration::from_secs(7 * 24 * 3600);

/// Waits (in paused time, without racing real sleeps) until `cond` holds.
async fn until(mut cond: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition never held");
}

#[tokio::test(start_paused = true)]
async fn queue_admits_up_to_capacity_and_completes_everything() {
    let b = Arc::new(InstantBackend::new("i0"));
    b.hold();
    let proxy = LlmProxy::start(
        vec![entry(b.clone(), 3)],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let h = h.clone();
        let req = GenRequest::new(h.next_id(), vec![1, 2], params(4));
        tasks.push(tokio::spawn(async move { h.generate(req).await }));
    }
    until(|| b.running() == 3).await;
    let m = h.metrics().await.unwrap();
    assert_eq!(m.queue_depth, 7);
    assert_eq!(m.backends[0].1, 3);
    b.release();
    for t in tasks {
        let out = t.await.unwrap().unwrap();
        assert_eq!(out.output.len(), 4);
        assert_eq!(out.finish_reason, FinishReason::Length);
    }
    let m = h.metrics().await.unwrap();
    assert_eq!(m.counters.completed, 10);
    assert_eq!(m.tokens, 40);
    let c = proxy.shutdown().await.unwrap();
    assert_eq!(c.submitted, 10);
}

#[tokio::test(start_paused = true)]
async fn replication_spreads_a_group_and_per_request_pins_it() {
    let a = Arc::new(InstantBackend::new("a"));
    let b = Arc::new(InstantBackend::new("b"));
    let proxy = LlmProxy::start(
        vec![entry(a.clone(), 8), entry(b.clone(), 8)],
        Box::new(RoundRobin::default()),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let (_, outs) = h
        .generate_n(
            vec![1, 2, 3],
            params(5),
            PolicyVersion(0),
            8,
            Replication::Expand,
        )
        .await;
    assert_eq!(outs.len(), 8);
    assert!(outs.iter().all(|o| o.as_ref().unwrap().output.len() == 5));
    assert_eq!(
        (a.served(), b.served()),
        (4, 4),
        "replicas spread over backends"
    );
    let (_, outs) = h
        .generate_n(
            vec![1, 2, 3],
            params(5),
            PolicyVersion(0),
            8,
            Replication::PerRequest,
        )
        .await;
    assert_eq!(outs.len(), 8);
    let (sa, sb) = (a.served() - 4, b.served() - 4);
    assert!(
        (sa, sb) == (8, 0) || (sa, sb) == (0, 8),
        "one request's n stay together"
    );
    proxy.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn abort_by_request_and_by_group_returns_partial_outputs() {
    let b = Arc::new(InstantBackend::new("i0"));
    b.hold();
    let proxy = LlmProxy::start(
        vec![entry(b.clone(), 2)],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let group = h.next_group();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let h = h.clone();
        let req = GenRequest::new(h.next_id(), vec![1], params(4));
        tasks.push(tokio::spawn(async move {
            h.generate_with(req, Some(group), rollflash_core::proxy::Affinity::None)
                .await
        }));
    }
    until(|| b.running() == 2).await;
    h.abort_group(group);
    for t in tasks {
        let out = t.await.unwrap().unwrap();
        assert_eq!(out.finish_reason, FinishReason::Aborted);
    }
    let m = h.metrics().await.unwrap();
    assert_eq!(m.counters.aborted, 4);
    assert_eq!(m.counters.completed, 0);
    proxy.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failing_backend_leaves_rotation_and_rejoins() {
    let a = Arc::new(InstantBackend::new("a"));
    let b = Arc::new(InstantBackend::new("b"));
    a.set_failing(true);
    let proxy = LlmProxy::start(
        vec![entry(a.clone(), 4), entry(b.clone(), 4)],
        Box::new(RoundRobin::default()),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let h = h.clone();
        let req = GenRequest::new(h.next_id(), vec![1, 2], params(3));
        tasks.push(tokio::spawn(async move { h.generate(req).await }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().output.len(), 3);
    }
    assert_eq!(
        b.served(),
        20,
        "everything was served by the healthy backend"
    );
    let m = h.metrics().await.unwrap();
    assert!(!m.backends[0].2, "the failing backend is out of rotation");
    assert_eq!(m.counters.completed, 20);
    assert_eq!(m.counters.failed, 0);
    // Heal it: the health probe brings it back and it serves again.
    a.set_failing(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(h.metrics().await.unwrap().backends[0].2);
    let _ = h
        .generate_n(vec![1], params(2), PolicyVersion(0), 8, Replication::Expand)
        .await;
    assert!(a.served() > 0);
    proxy.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn pause_in_abort_mode_resumes_from_partial_output_under_new_weights() {
    let b = Arc::new(InstantBackend::new("i0"));
    b.hold();
    let proxy = LlmProxy::start(
        vec![entry(b.clone(), 4)],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let hh = h.clone();
    let mut req = GenRequest::new(h.next_id(), vec![1, 2], params(6));
    req.start_version = PolicyVersion(0);
    let t = tokio::spawn(async move { hh.generate(req).await });
    until(|| b.running() == 1).await;
    let update = WeightUpdate::Disk {
        path: "unused".into(),
        version: PolicyVersion(1),
    };
    let sync = {
        let h = h.clone();
        let update = update.clone();
        tokio::spawn(async move { h.sync_weights(&update, PauseMode::Abort).await })
    };
    sync.await.unwrap().unwrap();
    b.release();
    let out = t.await.unwrap().unwrap();
    // The caller sees one finished output; its start version is kept, and its tokens
    // were produced after the sync.
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(out.start_version, PolicyVersion(0));
    assert!(out.output.versions.iter().all(|v| *v == PolicyVersion(1)));
    // Every token is attributed to the backend that generated it, across the resume.
    let served: usize = out.served_by.iter().map(|r| r.tokens).sum();
    assert_eq!(served, out.output.len(), "{:?}", out.served_by);
    assert!(out.served_by.iter().all(|r| r.backend == "i0"));
    assert_eq!(h.metrics().await.unwrap().counters.preempted, 1);
    proxy.shutdown().await.unwrap();
}

/// With real engines and a real weight update in the middle of long generations, abort mode
/// and keep mode both deliver complete outputs whose per-token versions say which weights
/// produced each token: never decreasing, all old then all new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weight_sync_mid_generation_with_engines_in_both_modes() {
    for mode in [PauseMode::Abort, PauseMode::Keep] {
        let e0 = common::engine_backend("e0", 1, 4);
        let e1 = common::engine_backend("e1", 1, 4);
        let proxy = LlmProxy::start(
            vec![entry(e0, 4), entry(e1, 4)],
            Box::new(LeastLoaded),
            ProxyConfig::default(),
        );
        let h = proxy.handle();
        let mut tasks = Vec::new();
        for i in 0..8u64 {
            let h = h.clone();
            let mut p = params(150);
            p.seed = Some(i);
            let req = GenRequest::new(h.next_id(), vec![1, 2, 3 + i as u32], p);
            tasks.push(tokio::spawn(async move { h.generate(req).await }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let update = WeightUpdate::InProcess {
            model: common::tiny_model(9),
            version: PolicyVersion(1),
        };
        let timings = h.sync_weights(&update, mode).await.unwrap();
        assert!(timings.total() < Duration::from_secs(30));
        for t in tasks {
            let out = t.await.unwrap().unwrap();
            assert_eq!(out.output.len(), 150, "{mode:?}: complete output");
            assert_eq!(out.finish_reason, FinishReason::Length);
            assert_eq!(out.start_version, PolicyVersion(0));
            assert!(
                out.output.versions.windows(2).all(|w| w[0] <= w[1]),
                "{mode:?}: versions never decrease"
            );
            assert_eq!(out.output.versions.last(), Some(&PolicyVersion(1)));
        }
        let c = proxy.shutdown().await.unwrap();
        assert_eq!(c.completed, 8);
        if mode == PauseMode::Keep {
            assert_eq!(c.preempted, 0);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_aborts_in_flight_and_refuses_new_work() {
    let b = Arc::new(InstantBackend::new("i0"));
    b.hold();
    let proxy = LlmProxy::start(
        vec![entry(b.clone(), 2)],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let h = h.clone();
        let req = GenRequest::new(h.next_id(), vec![1], params(4));
        tasks.push(tokio::spawn(async move { h.generate(req).await }));
    }
    until(|| b.running() == 2).await;
    let c = proxy.shutdown().await.unwrap();
    assert_eq!(c.aborted, 3);
    for t in tasks {
        assert_eq!(
            t.await.unwrap().unwrap().finish_reason,
            FinishReason::Aborted
        );
    }
    let req = GenRequest::new(h.next_id(), vec![1], params(4));
    assert!(matches!(h.generate(req).await, Err(ProxyError::Shutdown)));
}

/// A backend that accepts a request and never answers (its health checks still pass) holds
/// it for one deadline: then the attempt is cancelled there, its slot is freed, and the
/// request is retried on the healthy backend and succeeds.
#[tokio::test(start_paused = true)]
async fn a_request_hung_on_a_backend_is_retried_on_another_after_its_deadline() {
    let hung = Arc::new(common::Hanging::default());
    let ok = Arc::new(InstantBackend::new("ok"));
    let proxy = LlmProxy::start(
        // Least loaded with both idle picks the lowest id: the hanging backend goes first.
        vec![entry(hung.clone(), 4), entry(ok.clone(), 4)],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let req = GenRequest::new(h.next_id(), vec![1, 2], params(3));
    let out = tokio::time::timeout(FOREVER, h.generate(req))
        .await
        .expect("the request hung: nothing expired it")
        .unwrap();
    assert_eq!(out.output.len(), 3);
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!((hung.calls(), ok.served()), (1, 1));
    // The tokens are the healthy backend's: the hung attempt produced none.
    assert_eq!(
        out.served_by,
        vec![rollflash_core::ServedRun {
            backend: "ok".into(),
            tokens: 3
        }]
    );
    until(|| hung.aborts() == 1).await;
    let m = h.metrics().await.unwrap();
    assert_eq!(m.backends[0].1, 0, "the hung attempt's slot was released");
    assert_eq!(m.counters.retries, 1);
    assert_eq!((m.counters.completed, m.counters.failed), (1, 0));
    proxy.shutdown().await.unwrap();
}

/// A backend that let one attempt run past its deadline leaves rotation at once: a second
/// request already running there is retried on the healthy backend then, not when its own
/// deadline passes half a deadline later.
#[tokio::test(start_paused = true)]
async fn a_backend_past_a_request_deadline_leaves_rotation_and_its_other_requests_move() {
    let hung = Arc::new(common::Hanging::default());
    let ok = Arc::new(InstantBackend::new("ok"));
    ok.hold();
    let timeout = rollflash_rollout::DEFAULT_REQUEST_TIMEOUT;
    let proxy = LlmProxy::start(
        vec![entry(hung.clone(), 4), entry(ok.clone(), 1)],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let start = tokio::time::Instant::now();
    // The first request goes to the hanging backend (least loaded, lowest id); a second,
    // half a deadline later, too (the other backend is full: one slot, held).
    let first = {
        let h = h.clone();
        let req = GenRequest::new(h.next_id(), vec![1], params(3));
        tokio::spawn(async move { h.generate(req).await })
    };
    let blocker = {
        let h = h.clone();
        let req = GenRequest::new(h.next_id(), vec![1], params(3));
        tokio::spawn(async move { h.generate(req).await })
    };
    until(|| hung.calls() == 1 && ok.running() == 1).await;
    tokio::time::sleep(timeout / 2).await;
    let second = {
        let h = h.clone();
        let req = GenRequest::new(h.next_id(), vec![1], params(3));
        tokio::spawn(async move { h.generate(req).await })
    };
    until(|| hung.calls() == 2).await;
    // At the first deadline both requests leave the hanging backend, not only the one whose
    // deadline passed: the healthy one serves both as soon as it has room.
    tokio::time::sleep_until(start + timeout + Duration::from_millis(1)).await;
    ok.release();
    for t in [first, second, blocker] {
        let out = tokio::time::timeout(FOREVER, t)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(out.output.len(), 3);
    }
    let took = start.elapsed();
    assert!(
        took < timeout + timeout / 4,
        "the second request waited out its own deadline: {took:?}"
    );
    assert_eq!(ok.served(), 3, "all three answered by the healthy backend");
    proxy.shutdown().await.unwrap();
}

/// With only the hanging backend, every retry hangs too: once the retry budget is spent the
/// caller gets an answer — a failure whose reason says it timed out — and nothing is left
/// running.
#[tokio::test(start_paused = true)]
async fn a_request_hung_on_the_only_backend_fails_as_timed_out_after_its_retries() {
    let hung = Arc::new(common::Hanging::default());
    let proxy = LlmProxy::start(
        vec![entry(hung.clone(), 4)],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let req = GenRequest::new(h.next_id(), vec![1, 2], params(3));
    let result = tokio::time::timeout(FOREVER, h.generate(req))
        .await
        .expect("the request hung: nothing expired it");
    let Err(ProxyError::Failed { reason, .. }) = result else {
        panic!("expected a timeout failure, got {result:?}");
    };
    assert!(reason.contains("timed out"), "{reason}");
    let attempts = ProxyConfig::default().sched.max_retries as usize + 1;
    assert_eq!(hung.calls(), attempts, "one call per attempt");
    until(|| hung.aborts() == attempts).await;
    let m = h.metrics().await.unwrap();
    assert_eq!(m.backends[0].1, 0, "no slot is held by an expired attempt");
    assert_eq!(m.counters.failed, 1);
    assert_eq!(m.queue_depth, 0);
    proxy.shutdown().await.unwrap();
}

/// A backend that holds a request past its deadline and answers only the cancel: that late
/// answer belongs to an expired attempt and is ignored (counted as stale) — the caller gets
/// the retry's complete output from the other backend.
#[tokio::test(start_paused = true)]
async fn a_late_answer_from_an_expired_attempt_is_ignored() {
    let slow = Arc::new(InstantBackend::new("slow"));
    slow.hold();
    let ok = Arc::new(InstantBackend::new("ok"));
    let proxy = LlmProxy::start(
        vec![entry(slow.clone(), 4), entry(ok.clone(), 4)],
        Box::new(LeastLoaded),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    let req = GenRequest::new(h.next_id(), vec![1, 2], params(3));
    let out = tokio::time::timeout(FOREVER, h.generate(req))
        .await
        .expect("the request hung: nothing expired it")
        .unwrap();
    assert_eq!(out.output.len(), 3);
    assert_eq!(out.finish_reason, FinishReason::Length);
    // The slow backend answered the cancel (aborted, no tokens).
    until(|| slow.running() == 0).await;
    let m = h.metrics().await.unwrap();
    assert_eq!(m.counters.stale_replies, 1);
    assert_eq!((m.counters.completed, m.counters.retries), (1, 1));
    assert_eq!((slow.served(), ok.served()), (0, 1));
    assert_eq!(m.backends[0].1, 0);
    proxy.shutdown().await.unwrap();
}
