//! The `Backend` conformance suite: one set of checks of the trait's contract (see
//! `backend.rs`), run against every implementation: the engine and instant backends in
//! process, and the SGLang-native and OpenAI-compatible clients talking to a real server
//! (`rollout::server` over an engine) on loopback; `vllm.rs` runs it against `VllmBackend`
//! and a real vLLM server.

use std::sync::Arc;

use rollflash_core::{
    FinishReason, GenOutput, GenRequest, PauseMode, PolicyVersion, RequestId, SamplingParams,
};
use rollflash_rollout::{Backend, InstantBackend, WeightUpdate};

use crate::common;

/// What the suite needs from an implementation.
pub struct Fixture {
    pub backend: Arc<dyn Backend>,
    /// A weight update the backend accepts; it must carry `PolicyVersion(1)`.
    pub update: WeightUpdate,
    /// Whether generation is deterministic for greedy params (real models: yes).
    pub greedy_is_deterministic: bool,
}

fn req(id: u64, prompt: &[u32], params: SamplingParams) -> GenRequest {
    GenRequest {
        id: RequestId(id),
        prompt: prompt.to_vec(),
        params,
        start_version: PolicyVersion(0),
        resume: None,
    }
}

fn check_shape(out: &GenOutput, max_new: usize) {
    assert_eq!(out.output.tokens.len(), out.output.logprobs.len());
    assert_eq!(out.output.tokens.len(), out.output.versions.len());
    assert!(out.output.len() <= max_new);
    for lp in &out.output.logprobs {
        assert!(lp.is_finite() && *lp <= 1e-6, "log-prob {lp}");
    }
}

/// Runs every check. Ids used are 1000.. so a server's own ids do not collide.
pub async fn check_backend(f: Fixture) {
    let b = &f.backend;
    b.health().await.unwrap();
    let load = b.load().await.unwrap();
    assert_eq!(load.version, PolicyVersion(0));

    // Greedy, length-bounded: full output, one log-prob and version per token.
    let prompt = [3u32, 7, 11, 2];
    let mut r = req(1000, &prompt, SamplingParams::greedy(12));
    r.start_version = PolicyVersion(0);
    let a = b.generate(r.clone()).await.unwrap();
    check_shape(&a, 12);
    assert_eq!(a.id, RequestId(1000));
    assert_eq!(a.prompt_len, prompt.len());
    assert_eq!(a.finish_reason, FinishReason::Length);
    assert_eq!(a.output.len(), 12);
    assert!(a.output.versions.iter().all(|v| *v == PolicyVersion(0)));

    if f.greedy_is_deterministic {
        // Same request, same output.
        let mut r2 = r.clone();
        r2.id = RequestId(1001);
        let a2 = b.generate(r2).await.unwrap();
        assert_eq!(a2.output.tokens, a.output.tokens);

        // A stop token ends generation and is part of the output.
        let stop = a.output.tokens[3];
        let first = a.output.tokens.iter().position(|&t| t == stop).unwrap();
        let mut p = SamplingParams::greedy(12);
        p.stop_token_ids = vec![stop];
        let s = b.generate(req(1002, &prompt, p)).await.unwrap();
        assert_eq!(s.finish_reason, FinishReason::Stop);
        assert_eq!(s.output.tokens, a.output.tokens[..=first].to_vec());

        // Resume: continuing from the first 5 tokens gives the same 12, and the resumed
        // part keeps its log-probs and versions.
        let mut head = a.output.clone();
        head.tokens.truncate(5);
        head.logprobs.truncate(5);
        head.versions.truncate(5);
        let mut rr = req(1003, &prompt, SamplingParams::greedy(12));
        rr.resume = Some(head.clone());
        rr.start_version = PolicyVersion(0);
        let c = b.generate(rr).await.unwrap();
        assert_eq!(c.output.tokens, a.output.tokens);
        assert_eq!(c.output.logprobs[..5], head.logprobs[..]);
        for (x, y) in c.output.logprobs.iter().zip(&a.output.logprobs) {
            assert!((x - y).abs() < 1e-4, "resumed log-prob {x} vs {y}");
        }
    }

    // start_version is copied, whatever it is.
    let mut r = req(1004, &prompt, SamplingParams::greedy(3));
    r.start_version = PolicyVersion(0);
    assert_eq!(b.generate(r).await.unwrap().start_version, PolicyVersion(0));

    // Invalid requests are errors that retrying would not fix.
    let e = b
        .generate(req(1005, &[], SamplingParams::greedy(3)))
        .await
        .unwrap_err();
    assert!(!e.is_retryable(), "{e}");

    // Abort: the request returns, aborted, with what it had (possibly nothing).
    let long = SamplingParams::greedy(200);
    let bb = Arc::clone(b);
    let h = tokio::spawn(async move { bb.generate(req(1006, &[1, 2, 3], long)).await });
    // Abort until it lands: the request may not have reached the backend yet.
    let out = loop {
        b.abort(RequestId(1006)).await.unwrap();
        if h.is_finished() {
            break h.await.unwrap().unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    };
    check_shape(&out, 200);
    assert!(
        out.finish_reason == FinishReason::Aborted
            || (out.finish_reason == FinishReason::Length && out.output.len() == 200)
    );

    // Pause in abort mode: in-flight requests come back aborted.
    let bb = Arc::clone(b);
    let h = tokio::spawn(async move {
        bb.generate(req(1007, &[4, 5, 6], SamplingParams::greedy(200)))
            .await
    });
    tokio::task::yield_now().await;
    b.pause(PauseMode::Abort).await.unwrap();
    // A request may still be on its way to the backend: abort it too, as the proxy would.
    let out = loop {
        if h.is_finished() {
            break h.await.unwrap().unwrap();
        }
        b.pause(PauseMode::Abort).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    };
    check_shape(&out, 200);
    assert!(out.finish_reason == FinishReason::Aborted || out.output.len() == 200);

    // While paused (keep mode), requests are accepted and finish after resume.
    b.pause(PauseMode::Keep).await.unwrap();
    let bb = Arc::clone(b);
    let h = tokio::spawn(async move {
        bb.generate(req(1008, &prompt, SamplingParams::greedy(4)))
            .await
    });
    tokio::task::yield_now().await;
    b.resume().await.unwrap();
    let out = h.await.unwrap().unwrap();
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(out.output.len(), 4);

    // New weights: later tokens carry the new version, and load reports it.
    b.update_weights(&f.update).await.unwrap();
    assert_eq!(b.load().await.unwrap().version, PolicyVersion(1));
    let mut r = req(1009, &prompt, SamplingParams::greedy(4));
    r.start_version = PolicyVersion(0);
    let out = b.generate(r).await.unwrap();
    assert!(out.output.versions.iter().all(|v| *v == PolicyVersion(1)));
    assert_eq!(out.start_version, PolicyVersion(0));
    if f.greedy_is_deterministic {
        // The update changed the model (the fixture's new weights differ).
        let mut r = req(1010, &prompt, SamplingParams::greedy(12));
        r.start_version = PolicyVersion(1);
        let after = b.generate(r).await.unwrap();
        assert_ne!(after.output.tokens, a.output.tokens);
    }

    // Many concurrent requests all complete.
    let mut hs = Vec::new();
    for i in 0..16u64 {
        let bb = Arc::clone(b);
        let p = SamplingParams {
            max_new_tokens: 1 + (i as usize % 7),
            seed: Some(i),
            ..Default::default()
        };
        hs.push(tokio::spawn(async move {
            bb.generate(req(2000 + i, &[1 + i as u32 % 5, 2], p)).await
        }));
    }
    for (i, h) in hs.into_iter().enumerate() {
        let out = h.await.unwrap().unwrap();
        assert_eq!(out.output.len(), 1 + i % 7);
    }
    assert_eq!(b.load().await.unwrap().running, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_backend_conforms() {
    let backend = common::engine_backend("engine-0", 1, 8);
    check_backend(Fixture {
        backend,
        update: WeightUpdate::InProcess {
            model: common::tiny_model(2),
            version: PolicyVersion(1),
        },
        greedy_is_deterministic: true,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_backend_conforms_with_weights_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(3);
    let weights = model.weights();
    rollflash_model::hf::save_dir(dir.path(), model.config(), &weights, None).unwrap();
    check_backend(Fixture {
        backend: common::engine_backend("engine-disk", 1, 8),
        update: WeightUpdate::Disk {
            path: dir.path().to_path_buf(),
            version: PolicyVersion(1),
        },
        greedy_is_deterministic: true,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instant_backend_conforms() {
    check_backend(Fixture {
        backend: Arc::new(InstantBackend::new("instant")),
        update: WeightUpdate::Disk {
            path: "unused".into(),
            version: PolicyVersion(1),
        },
        greedy_is_deterministic: false,
    })
    .await;
}

/// A checkpoint of `tiny_model(seed)` under a fresh weights root, for HTTP weight updates.
fn checkpoint_under_root(seed: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("v1");
    let model = common::tiny_model(seed);
    rollflash_model::hf::save_dir(&dir, model.config(), &model.weights(), None).unwrap();
    (root, dir)
}

async fn http_server_over_engine(root: &std::path::Path) -> crate::http::TestServer {
    let engine = common::engine_backend("engine-behind-http", 1, 8);
    crate::http::start_server_with(
        engine,
        rollflash_rollout::ServerConfig {
            weights: rollflash_rollout::WeightsAccess::Under(root.to_path_buf()),
            ..Default::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_backend_conforms_through_a_real_server() {
    let (root, dir) = checkpoint_under_root(2);
    let server = http_server_over_engine(root.path()).await;
    check_backend(Fixture {
        backend: Arc::new(crate::http::sglang_client(&server)),
        update: WeightUpdate::Disk {
            path: dir,
            version: PolicyVersion(1),
        },
        greedy_is_deterministic: true,
    })
    .await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_backend_conforms_through_a_real_server() {
    let (root, dir) = checkpoint_under_root(2);
    let server = http_server_over_engine(root.path()).await;
    check_backend(Fixture {
        backend: Arc::new(crate::http::openai_client(&server)),
        update: WeightUpdate::Disk {
            path: dir,
            version: PolicyVersion(1),
        },
        greedy_is_deterministic: true,
    })
    .await;
    server.stop().await.unwrap();
}
