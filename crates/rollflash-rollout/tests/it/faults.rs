//! Faults around weights, through the real proxy task (paused time): a backend whose weight
//! update fails, and one that silently lost its weights (a restarted server), never serve a
//! token older than the weights they were supposed to hold; both are caught up by the health
//! probe and rejoin.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rollflash_core::proxy::RoundRobin;
use rollflash_core::RequestId;
use rollflash_core::{GenOutput, GenRequest, PauseMode, PolicyVersion, SamplingParams};
use rollflash_rollout::{
    Backend, BackendEntry, BackendError, BackendLoad, InstantBackend, LlmProxy, ProxyConfig,
    ProxyError, ProxyHandle, WeightUpdate,
};

fn entry(b: &Arc<InstantBackend>) -> BackendEntry {
    BackendEntry {
        backend: Arc::clone(b) as Arc<dyn Backend>,
        route: rollflash_rollout::WeightRoute::Direct,
        max_running_requests: 4,
        update_timeout: None,
    }
}

fn update(v: u64) -> WeightUpdate {
    WeightUpdate::Disk {
        path: "unused".into(),
        version: PolicyVersion(v),
    }
}

/// `n` concurrent requests of 3 tokens each.
async fn burst(h: &ProxyHandle, n: usize) -> Vec<GenOutput> {
    let futs = (0..n).map(|_| {
        let req = GenRequest::new(
            h.next_id(),
            vec![1, 2],
            SamplingParams {
                max_new_tokens: 3,
                ..Default::default()
            },
        );
        h.generate(req)
    });
    futures::future::join_all(futs)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

fn assert_all_tokens_at(outs: &[GenOutput], v: u64) {
    for o in outs {
        assert!(
            o.output.versions.iter().all(|x| *x == PolicyVersion(v)),
            "{}: versions {:?}, expected all {v}",
            o.id,
            o.output.versions
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_backend_whose_sync_failed_serves_nothing_until_it_holds_the_current_weights() {
    let a = Arc::new(InstantBackend::with_delay("a", Duration::from_millis(5)));
    let b = Arc::new(InstantBackend::with_delay("b", Duration::from_millis(5)));
    let proxy = LlmProxy::start(
        vec![entry(&a), entry(&b)],
        Box::new(RoundRobin::default()),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    assert_all_tokens_at(&burst(&h, 8).await, 0);
    assert!(b.served() > 0);

    b.set_failing_updates(true);
    let e = h
        .sync_weights(&update(1), PauseMode::Abort)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ProxyError::Sync { version, failed, .. } if *version == PolicyVersion(1) && failed == &["b".to_string()]),
        "{e}"
    );
    let served_by_b = b.served();
    // The probe keeps failing to update it: whatever time passes, b stays out and every
    // token comes from the current weights.
    for _ in 0..3 {
        let outs = burst(&h, 16).await;
        assert_all_tokens_at(&outs, 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert_eq!(b.served(), served_by_b, "b served with stale weights");
    assert_eq!(b.version(), PolicyVersion(0));
    let m = h.metrics().await.unwrap();
    assert!(!m.backends[1].2, "b is out of rotation");

    // Healed: the probe gives it the latest weights and it rejoins.
    b.set_failing_updates(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(b.version(), PolicyVersion(1), "caught up by the probe");
    assert!(h.metrics().await.unwrap().backends[1].2, "back in rotation");
    assert_all_tokens_at(&burst(&h, 16).await, 1);
    assert!(b.served() > served_by_b, "b serves again");
    let c = proxy.shutdown().await.unwrap();
    assert_eq!(c.failed, 0);
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_lost_its_weights_unnoticed_is_refused_and_caught_up() {
    let a = Arc::new(InstantBackend::with_delay("a", Duration::from_millis(5)));
    let b = Arc::new(InstantBackend::with_delay("b", Duration::from_millis(5)));
    let proxy = LlmProxy::start(
        vec![entry(&a), entry(&b)],
        Box::new(RoundRobin::default()),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    h.sync_weights(&update(2), PauseMode::Abort).await.unwrap();
    assert_eq!(b.version(), PolicyVersion(2));
    // b restarts behind the proxy's back: its next answers carry version 0.
    b.lose_weights();
    let outs = burst(&h, 16).await;
    assert_all_tokens_at(&outs, 2);
    let m = h.metrics().await.unwrap();
    assert!(m.counters.retries > 0, "b's stale answers were re-run");
    assert_eq!(m.counters.completed, 16);
    // The probe reloads the latest weights into it, and it serves again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(b.version(), PolicyVersion(2));
    assert!(h.metrics().await.unwrap().backends[1].2);
    let before = b.served();
    assert_all_tokens_at(&burst(&h, 16).await, 2);
    assert!(b.served() > before);
    proxy.shutdown().await.unwrap();
}

/// A catch-up racing a newer sync never leaves the backend on the older weights: updates to
/// one backend are applied in publication order.
#[tokio::test(start_paused = true)]
async fn catch_up_and_a_newer_sync_apply_in_order() {
    let a = Arc::new(InstantBackend::new("a"));
    let b = Arc::new(InstantBackend::new("b"));
    let proxy = LlmProxy::start(
        vec![entry(&a), entry(&b)],
        Box::new(RoundRobin::default()),
        ProxyConfig::default(),
    );
    let h = proxy.handle();
    for v in 1..=20u64 {
        // Every other sync fails on b, and b heals at odd moments: probes and syncs
        // interleave.
        b.set_failing_updates(v % 2 == 1);
        let _ = h.sync_weights(&update(v), PauseMode::Keep).await;
        if v % 3 == 0 {
            b.set_failing_updates(false);
        }
        tokio::time::sleep(Duration::from_millis(300 * (v % 4))).await;
    }
    b.set_failing_updates(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(a.version(), PolicyVersion(20));
    assert_eq!(b.version(), PolicyVersion(20));
    assert_all_tokens_at(&burst(&h, 16).await, 20);
    assert!(h.metrics().await.unwrap().backends.iter().all(|b| b.2));
    proxy.shutdown().await.unwrap();
}

/// A backend whose weight updates never return (a server wedged while loading), and that
/// otherwise serves as the instant backend it wraps.
struct WedgedUpdates(Arc<InstantBackend>);

#[async_trait]
impl Backend for WedgedUpdates {
    fn name(&self) -> &str {
        self.0.name()
    }
    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        self.0.generate(req).await
    }
    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        self.0.abort(id).await
    }
    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        self.0.pause(mode).await
    }
    async fn resume(&self) -> Result<(), BackendError> {
        self.0.resume().await
    }
    async fn update_weights(&self, _: &WeightUpdate) -> Result<(), BackendError> {
        std::future::pending().await
    }
    async fn load(&self) -> Result<BackendLoad, BackendError> {
        self.0.load().await
    }
    async fn health(&self) -> Result<(), BackendError> {
        self.0.health().await
    }
}

/// `b` behind [`WedgedUpdates`], with its own update deadline or the proxy's.
fn wedged(b: &Arc<InstantBackend>, update_timeout: Option<Duration>) -> BackendEntry {
    BackendEntry {
        backend: Arc::new(WedgedUpdates(Arc::clone(b))),
        route: rollflash_rollout::WeightRoute::Direct,
        max_running_requests: 4,
        update_timeout,
    }
}

#[tokio::test(start_paused = true)]
async fn a_weight_update_that_never_returns_costs_one_deadline_and_the_others_serve() {
    let a = Arc::new(InstantBackend::with_delay("a", Duration::from_millis(5)));
    let b = Arc::new(InstantBackend::with_delay("b", Duration::from_millis(5)));
    let timeout = Duration::from_secs(30);
    let proxy = LlmProxy::start(
        vec![entry(&a), wedged(&b, None)],
        Box::new(RoundRobin::default()),
        ProxyConfig {
            update_timeout: timeout,
            ..ProxyConfig::default()
        },
    );
    let h = proxy.handle();
    let t0 = tokio::time::Instant::now();
    let e = h
        .sync_weights(&update(1), PauseMode::Abort)
        .await
        .unwrap_err();
    let waited = t0.elapsed();
    assert!(
        waited >= timeout && waited < timeout + Duration::from_secs(1),
        "the sync took {waited:?}, not one update deadline ({timeout:?})"
    );
    let ProxyError::Sync {
        failed, timings, ..
    } = &e
    else {
        panic!("{e}");
    };
    assert_eq!(failed, &["b".to_string()]);
    assert_eq!(timings.backends.len(), 2);
    assert!(timings.backends[0].loaded && !timings.backends[1].loaded);
    assert!(timings.backends[1].took >= timeout);
    // The sync ended; a serves the new weights, b is out of rotation.
    assert_all_tokens_at(&burst(&h, 8).await, 1);
    assert_eq!(b.served(), 0);
    assert!(!h.metrics().await.unwrap().backends[1].2);
    // Its catch-ups are bounded too: shutdown is not held by them.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let c = proxy.shutdown().await.unwrap();
    assert_eq!(c.failed, 0);
}

#[tokio::test(start_paused = true)]
async fn each_backend_s_own_update_deadline_bounds_its_update() {
    // Two servers wedged while loading: one with its own 5 s deadline, one on the proxy's
    // 30 s default. Each is given up on at its own deadline; the sync waits for the longer.
    let a = Arc::new(InstantBackend::with_delay("a", Duration::from_millis(5)));
    let b = Arc::new(InstantBackend::with_delay("b", Duration::from_millis(5)));
    let c = Arc::new(InstantBackend::with_delay("c", Duration::from_millis(5)));
    let own = Duration::from_secs(5);
    let default = Duration::from_secs(30);
    let proxy = LlmProxy::start(
        vec![entry(&c), wedged(&a, Some(own)), wedged(&b, None)],
        Box::new(RoundRobin::default()),
        ProxyConfig {
            update_timeout: default,
            ..ProxyConfig::default()
        },
    );
    let h = proxy.handle();
    let e = h
        .sync_weights(&update(1), PauseMode::Abort)
        .await
        .unwrap_err();
    let ProxyError::Sync {
        failed, timings, ..
    } = &e
    else {
        panic!("{e}");
    };
    assert_eq!(failed, &["a".to_string(), "b".to_string()]);
    let took: Vec<Duration> = timings.backends.iter().map(|b| b.took).collect();
    assert!(timings.backends[0].loaded);
    assert!(
        took[1] >= own && took[1] < own + Duration::from_secs(1),
        "a's update took {:?}, not its own deadline {own:?}",
        took[1]
    );
    assert!(
        took[2] >= default && took[2] < default + Duration::from_secs(1),
        "b's update took {:?}, not the default deadline {default:?}",
        took[2]
    );
    assert_all_tokens_at(&burst(&h, 8).await, 1);
    tokio::time::sleep(Duration::from_secs(120)).await;
    proxy.shutdown().await.unwrap();
}
