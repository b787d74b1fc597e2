//! `TinkerBackend` against a real SkyRL 0.4.0 Tinker server (`rollflash_tinker::LocalServer`:
//! the tiny random Qwen3, JAX on CPU), one server for this file and one test that runs the
//! checks in order (they share the trained weights and the JIT-compiled shapes). Skipped with
//! a `SKIPPED:` line where Python 3.12 or the server install is unavailable.
//!
//! Checks: a LoRA model trained a few steps with a high learning rate and saved for the
//! sampler gives the `WeightUpdate::Remote` of version 1; the sampler's log-probs of its own
//! tokens equal the training model's forward pass on the same sequence (within
//! [`LOGPROB_TOL`]), at temperature 1, 0 and 0.5 (SkyRL reports temperature-1 log-probs
//! whatever the temperature); the `Backend` conformance suite (`conformance.rs`); a request
//! running across an update keeps the old version; updates that cannot be loaded are refused
//! and leave the version; after `kill -9` of the server, `generate` and `health` fail as
//! `Unavailable` naming the URL, within the client's bounded retries; after a restart on the
//! same port and database, a new backend samples again, and the trained weights come back
//! once a trainer reloads the model's saved state (SkyRL keeps models in its engine's memory).
//! And the server's exported adapter (`TinkerAdapters` + `DiskWeights::tinker`) on an
//! embedded engine over the same base: the probe against the server passes and the engine
//! answers as the server taught; over another base the probe fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rollflash_core::{GenRequest, PolicyVersion, RequestId, SamplingParams};
use rollflash_rollout::{
    Backend, BackendError, DiskWeights, EngineBackend, EngineBackendConfig, PauseMode,
    TinkerAdapters, TinkerBackend, TinkerBackendConfig, WeightRoute, WeightUpdate,
};
use rollflash_tinker::{
    AdamParams, ClientConfig, Datum, LocalServer, LocalServerError, LoraConfig, RetryPolicy,
    TinkerClient,
};

use crate::conformance::{check_backend, Fixture};

/// Largest |sampler − forward| for one token's log-prob: both f32 on the same weights, but
/// different programs (the sampler's prefill + KV-cache decode vs the training forward over
/// the whole sequence, with the LoRA merged vs applied). The tinker crate's prompt-log-prob
/// check holds them to the same 1e-3.
const LOGPROB_TOL: f32 = 1e-3;
/// The conformance suite's prompt: the trained weights must change its greedy output.
const PROMPT: [u32; 4] = [3, 7, 11, 2];
/// The token the LoRA model is taught to repeat after `PROMPT`.
const TAUGHT: i32 = 42;

fn skip(why: &str) {
    eprintln!("SKIPPED: tinker_backend_against_a_real_skyrl_server: {why}");
}

fn cfg(server: &LocalServer, vocab: usize) -> TinkerBackendConfig {
    let mut c = TinkerBackendConfig::new(server.url());
    c.base_model = Some(server.base_model().to_string());
    c.vocab_size = Some(vocab);
    // A cold JIT compile of a new shape takes tens of seconds on two busy cores.
    c.sample_deadline = Duration::from_secs(600);
    // A dead server is reported after ~1.5 s of retries, not the default ~6 s.
    c.retry = RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(800),
    };
    c.heartbeat_interval = Duration::from_secs(2);
    c
}

fn trainer(server: &LocalServer) -> TinkerClient {
    let mut c = ClientConfig::new(server.url());
    c.future_deadline = Duration::from_secs(600);
    TinkerClient::new(c).unwrap()
}

fn vocab_size(server: &LocalServer) -> usize {
    let text = std::fs::read_to_string(server.model_dir().join("config.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["vocab_size"].as_u64().unwrap() as usize
}

fn req(id: u64, prompt: &[u32], params: SamplingParams) -> GenRequest {
    GenRequest::new(RequestId(id), prompt.to_vec(), params)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tinker_backend_against_a_real_skyrl_server() {
    let mut server = match tokio::task::spawn_blocking(LocalServer::start)
        .await
        .unwrap()
    {
        Ok(s) => s,
        Err(LocalServerError::Unavailable(why)) => return skip(&why),
        Err(e) => panic!("{e}: {e:?}"),
    };
    let t0 = Instant::now();
    if tokio::time::timeout(Duration::from_secs(1200), checks(&mut server, t0))
        .await
        .is_err()
    {
        panic!(
            "the checks took over 20 minutes; server log:\n{}",
            server.log_tail(40)
        );
    }
}

async fn checks(server: &mut LocalServer, t0: Instant) {
    let lap = |what: &str| eprintln!("[{:6.1} s] {what}", t0.elapsed().as_secs_f64());
    let vocab = vocab_size(server);

    // Version 1: a LoRA model taught to answer PROMPT with TAUGHT, saved for the sampler.
    let c = trainer(server);
    let session = c.create_session(vec!["rollout-it".into()]).await.unwrap();
    let model = c
        .create_model(
            &session,
            0,
            server.base_model(),
            LoraConfig::new(8, Some(0)),
        )
        .await
        .unwrap()
        .model_id;
    let mut full: Vec<i32> = PROMPT.iter().map(|&t| t as i32).collect();
    full.extend([TAUGHT; 12]);
    let input = full[..full.len() - 1].to_vec();
    let targets: Vec<i64> = full[1..].iter().map(|&t| i64::from(t)).collect();
    let weights: Vec<f32> = (0..input.len())
        .map(|i| if i + 1 < PROMPT.len() { 0.0 } else { 1.0 })
        .collect();
    let datum = Datum::cross_entropy(input, targets, weights);
    let mut seq = 1;
    for _ in 0..4 {
        c.forward_backward(
            &model,
            seq,
            std::slice::from_ref(&datum),
            "cross_entropy",
            &[],
        )
        .await
        .unwrap();
        c.optim_step(&model, seq + 1, AdamParams::with_lr(5e-2))
            .await
            .unwrap();
        seq += 2;
    }
    let uri = c
        .save_weights_for_sampler(&model, "rollout-v1")
        .await
        .unwrap();
    let v1 = WeightUpdate::Remote {
        uri: uri.clone(),
        version: PolicyVersion(1),
    };
    lap(&format!("trained and saved {uri}"));

    // The sampler's log-probs of its own tokens are the training forward's, at v1.
    let b = TinkerBackend::connect(cfg(server, vocab)).await.unwrap();
    b.update_weights(&v1).await.unwrap();
    let prompt = [1u32, 9, 33, 70, 5];
    for (i, temperature) in [1.0, 0.0, 0.5].into_iter().enumerate() {
        let params = SamplingParams {
            temperature,
            max_new_tokens: 10,
            seed: Some(7),
            ..Default::default()
        };
        let out = b
            .generate(req(10 + i as u64, &prompt, params))
            .await
            .unwrap();
        assert_eq!(out.output.len(), 10);
        assert!(out.output.versions.iter().all(|v| *v == PolicyVersion(1)));
        let mut all: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        all.extend(out.output.tokens.iter().map(|&t| t as i32));
        let fwd = c
            .forward(
                &model,
                seq,
                &[Datum::cross_entropy(
                    all[..all.len() - 1].to_vec(),
                    all[1..].iter().map(|&t| i64::from(t)).collect(),
                    vec![1.0; all.len() - 1],
                )],
                "cross_entropy",
            )
            .await
            .unwrap();
        seq += 1;
        let train_lp = fwd.outputs[0].logprobs().unwrap();
        let mut worst = 0f32;
        for (k, lp) in out.output.logprobs.iter().enumerate() {
            let f = train_lp[prompt.len() - 1 + k];
            assert!(
                (lp - f).abs() <= LOGPROB_TOL,
                "T={temperature} token {k}: sampler {lp} vs forward {f}"
            );
            worst = worst.max((lp - f).abs());
        }
        eprintln!("T={temperature}: largest |sampler - forward| log-prob {worst:.2e}");
    }
    drop(b);
    lap("sampler log-probs = forward log-probs (T = 1, 0, 0.5)");

    // The conformance suite, from the base model (v0) to the trained weights (v1).
    let backend = Arc::new(TinkerBackend::connect(cfg(server, vocab)).await.unwrap());
    check_backend(Fixture {
        backend: backend.clone(),
        update: v1.clone(),
        greedy_is_deterministic: true,
    })
    .await;
    // The trained weights answer PROMPT with what they were taught.
    let taught = backend
        .generate(req(3000, &PROMPT, SamplingParams::greedy(4)))
        .await
        .unwrap();
    assert_eq!(taught.output.tokens, vec![TAUGHT as u32; 4]);
    drop(backend);
    lap("conformance suite");

    // The adapter the server exports, on an embedded engine over the same base model: one
    // download for two backends, the probe against the server passes, and the engine
    // answers PROMPT with what the server taught. An engine over another base fails the
    // probe, naming why.
    let root = tempfile::tempdir().unwrap();
    let adapters = Arc::new(TinkerAdapters::new(
        trainer(server),
        root.path().to_path_buf(),
        2,
        vocab,
    ));
    let base = rollflash_model::hf::load_dir(
        server.model_dir(),
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap()
    .model;
    let engine = |name: &str, model: rollflash_model::model::Transformer| {
        let e = EngineBackend::start(
            Arc::new(model),
            PolicyVersion(0),
            EngineBackendConfig {
                name: name.into(),
                engine: Default::default(),
            },
        )
        .unwrap();
        crate::common::Routed {
            backend: Arc::new(e),
            route: WeightRoute::Disk(DiskWeights::tinker(Arc::clone(&adapters))),
        }
    };
    let same = rollflash_model::model::Transformer::from_weights(
        base.config(),
        &base.weights(),
        base.dtype(),
        base.device(),
    )
    .unwrap();
    let embedded = engine("embedded", same);
    // As the proxy does around a sync: the route leaves the backend paused after its probe.
    embedded.pause(PauseMode::Abort).await.unwrap();
    embedded.update(&v1).await.unwrap();
    embedded.resume().await.unwrap();
    let taught = embedded
        .generate(req(3100, &PROMPT, SamplingParams::greedy(4)))
        .await
        .unwrap();
    assert_eq!(taught.output.tokens, vec![TAUGHT as u32; 4]);
    assert_eq!(taught.output.versions, vec![PolicyVersion(1); 4]);
    let unpacked = adapters.fetch(&uri, PolicyVersion(1)).await.unwrap();
    assert!(unpacked.join("adapter_model.safetensors").is_file());
    let mut w = base.weights();
    let norm = w
        .get(
            "model.norm.weight",
            &[base.config().hidden_size],
            candle_core::DType::F32,
        )
        .unwrap();
    w.insert("model.norm.weight", (norm * 1.5).unwrap());
    let other = rollflash_model::model::Transformer::from_weights(
        base.config(),
        &w,
        base.dtype(),
        base.device(),
    )
    .unwrap();
    let e = engine("other-base", other).update(&v1).await.unwrap_err();
    assert!(e.to_string().contains("failed its probe"), "{e}");
    lap(&format!(
        "the exported adapter on an embedded engine; another base: {e}"
    ));

    // A request submitted before an update finishes on the old session, with its version.
    let b = Arc::new(TinkerBackend::connect(cfg(server, vocab)).await.unwrap());
    let bb = Arc::clone(&b);
    let running = tokio::spawn(async move {
        bb.generate(req(3002, &PROMPT, SamplingParams::greedy(64)))
            .await
    });
    // Submitted before the update starts: registered, and it takes the current session
    // before its first await.
    while b.load().await.unwrap().running < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    b.update_weights(&v1).await.unwrap();
    let old = running.await.unwrap().unwrap();
    assert!(old.output.versions.iter().all(|v| *v == PolicyVersion(0)));
    let new = b
        .generate(req(3003, &PROMPT, SamplingParams::greedy(4)))
        .await
        .unwrap();
    assert_eq!(new.output.versions, vec![PolicyVersion(1); 4]);
    lap("a running request keeps its version across an update");

    // Updates it cannot load are refused, naming why, and leave the version.
    let e = b
        .update_weights(&WeightUpdate::Disk {
            path: "/tmp/nope".into(),
            version: PolicyVersion(2),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e, BackendError::InvalidRequest { .. }) && e.to_string().contains("Remote"),
        "{e}"
    );
    let bad = format!("{}-missing", uri);
    let e = b
        .update_weights(&WeightUpdate::Remote {
            uri: bad,
            version: PolicyVersion(2),
        })
        .await
        .unwrap_err();
    assert!(!e.is_retryable(), "a checkpoint that is not there: {e:?}");
    assert_eq!(b.load().await.unwrap().version, PolicyVersion(1));
    // A prompt outside the vocabulary is refused before sending.
    let e = b
        .generate(req(3004, &[vocab as u32], SamplingParams::greedy(2)))
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::InvalidRequest { .. }), "{e}");
    lap("refused updates and requests");

    // The training state, to bring the model back after the restart below.
    let state = c.save_state(&model, "rollout-state").await.unwrap();

    // kill -9: generate and health fail as Unavailable, naming the URL, within the retries.
    let url = server.url().to_string();
    tokio::task::block_in_place(|| server.kill9()).unwrap();
    let t = Instant::now();
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        b.generate(req(3005, &PROMPT, SamplingParams::greedy(4))),
    )
    .await
    .expect("generate against a dead server must fail within its retries")
    .unwrap_err();
    assert!(matches!(e, BackendError::Unavailable { .. }), "{e:?}");
    assert!(e.is_retryable());
    assert!(e.to_string().contains(&url), "{e}");
    let h = b.health().await.unwrap_err();
    assert!(matches!(h, BackendError::Unavailable { .. }), "{h:?}");
    assert!(h.to_string().contains(&url), "{h}");
    lap(&format!(
        "killed: generate failed after {:.1} s: {e}",
        t.elapsed().as_secs_f64()
    ));
    let e = TinkerBackend::connect(cfg(server, vocab))
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::Unavailable { .. }), "{e:?}");

    // Restarted on the same port and database: a new backend samples again.
    tokio::task::block_in_place(|| server.restart()).unwrap();
    lap("restarted");
    let fresh = TinkerBackend::connect(cfg(server, vocab)).await.unwrap();
    let out = fresh
        .generate(req(3006, &PROMPT, SamplingParams::greedy(4)))
        .await
        .unwrap();
    assert_eq!(out.output.len(), 4);
    // SkyRL keeps models in its engine's memory, not in the database: after a restart the
    // sampler weights saved before cannot be loaded ("Model … not loaded", HTTP 400) until a
    // trainer re-creates the model from its saved state and saves sampler weights again.
    let e = fresh.update_weights(&v1).await.unwrap_err();
    assert!(e.to_string().contains("not loaded"), "{e}");
    assert_eq!(fresh.load().await.unwrap().version, PolicyVersion(0));
    let c = trainer(server);
    let session = c.create_session(vec!["rollout-it".into()]).await.unwrap();
    let model = c
        .create_model(
            &session,
            0,
            server.base_model(),
            LoraConfig::new(8, Some(1)),
        )
        .await
        .unwrap()
        .model_id;
    c.load_state(&model, &state, false).await.unwrap();
    let uri = c
        .save_weights_for_sampler(&model, "rollout-v1-again")
        .await
        .unwrap();
    let v1_again = WeightUpdate::Remote {
        uri,
        version: PolicyVersion(1),
    };
    fresh.update_weights(&v1_again).await.unwrap();
    let out = fresh
        .generate(req(3007, &PROMPT, SamplingParams::greedy(4)))
        .await
        .unwrap();
    assert_eq!(out.output.tokens, vec![TAUGHT as u32; 4]);
    assert_eq!(out.output.versions, vec![PolicyVersion(1); 4]);
    // The old backend: its session is in the same database, so it is healthy, but its
    // sampling session reads the weights the restart dropped: its requests fail as
    // Unavailable (the proxy takes it out of rotation; its probe's catch-up update brings it
    // back once the trainer has published again), and so does an update to those weights.
    b.health().await.unwrap();
    let e = b
        .generate(req(3008, &PROMPT, SamplingParams::greedy(4)))
        .await
        .unwrap_err();
    assert!(
        matches!(e, BackendError::Unavailable { .. }) && e.to_string().contains("not loaded"),
        "{e:?}"
    );
    b.update_weights(&v1_again).await.unwrap();
    let out = b
        .generate(req(3010, &PROMPT, SamplingParams::greedy(4)))
        .await
        .unwrap();
    assert_eq!(out.output.tokens, vec![TAUGHT as u32; 4]);
    lap("after restart: the new backend serves; the old one once given the weights again");
}
