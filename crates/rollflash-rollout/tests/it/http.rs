//! HTTP backends against the in-process server: `SglangBackend` and `OpenAiBackend` talking to
//! `serve` over loopback, in front of an `EngineBackend` with a tiny random model (outputs are
//! compared with the engine called directly) or of `GateBackend`, a scripted backend that holds
//! every request until it is aborted, so abort and pause are tested without racing a
//! generation. Also the server's security answers (401, 400, 413, 404, 403).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use candle_core::{DType, Device};
use rollflash_core::{
    FinishReason, GenOutput, GenRequest, Generated, PolicyVersion, RequestId, SamplingParams,
};
use rollflash_model::chat::{ChatMessage, ChatTemplate};
use rollflash_model::config::{Arch, ModelConfig};
use rollflash_model::engine::EngineConfig;
use rollflash_model::model::Transformer;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    serve, Backend, BackendError, BackendLoad, EngineBackend, EngineBackendConfig,
    HttpBackendConfig, OpenAiBackend, OpenAiConfig, PauseMode, ServerConfig, ServerError,
    ServerState, SglangBackend, WeightHook, WeightUpdate, WeightsAccess,
};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// The built-in tokenizer's `<eos>`.
const EOS: u32 = 1;

/// A server running in this process; shut down (gracefully) on drop or by [`TestServer::stop`].
pub(crate) struct TestServer {
    pub(crate) addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
}

impl TestServer {
    /// `http://ADDR`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts down and waits for the server to finish.
    pub(crate) async fn stop(mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(t) => t.await.expect("server task panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Serves `backend` on 127.0.0.1 (a free port) with the built-in tokenizer and chat template
/// and default settings. For other test modules (the conformance suite) too.
pub(crate) async fn start_test_server(backend: Arc<dyn Backend>) -> TestServer {
    start_server_with(backend, ServerConfig::default()).await
}

/// Like [`start_test_server`], with `cfg` (its `eos_token_ids` replaced by the built-in `<eos>`).
pub(crate) async fn start_server_with(backend: Arc<dyn Backend>, cfg: ServerConfig) -> TestServer {
    start_server_with_adapters(backend, cfg, None).await
}

/// Like [`start_server_with`], serving LoRA adapters through `adapters`.
pub(crate) async fn start_server_with_adapters(
    backend: Arc<dyn Backend>,
    cfg: ServerConfig,
    adapters: Option<Arc<dyn rollflash_rollout::AdapterHost>>,
) -> TestServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = ServerState {
        backend,
        tokenizer: Some(Tokenizer::builtin()),
        chat_template: Some(ChatTemplate::builtin().unwrap()),
        config: ServerConfig {
            eos_token_ids: vec![EOS],
            ..cfg
        },
        adapters,
    };
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, state, async move {
        let _ = rx.await;
    }));
    TestServer {
        addr,
        shutdown: Some(tx),
        task: Some(task),
    }
}

/// A client config for `server` with fast retries, so failure tests finish quickly.
pub(crate) fn client_config(server: &TestServer) -> HttpBackendConfig {
    HttpBackendConfig {
        max_retries: 1,
        backoff_initial: Duration::from_millis(5),
        backoff_max: Duration::from_millis(50),
        timeout: Duration::from_secs(120),
        ..HttpBackendConfig::new(server.url())
    }
}

pub(crate) fn sglang_client(server: &TestServer) -> SglangBackend {
    SglangBackend::new(client_config(server)).unwrap()
}

pub(crate) fn openai_client(server: &TestServer) -> OpenAiBackend {
    OpenAiBackend::new(OpenAiConfig {
        http: client_config(server),
        model: None,
        weight_hook: WeightHook::update_weights_from_disk(),
        use_extension: true,
    })
    .unwrap()
}

/// A tiny Qwen3 over the built-in vocabulary with weights scaled up (std ≈ 0.2), so that
/// output distributions are far from uniform and comparisons are sensitive.
fn tiny_weights(seed: u64) -> (ModelConfig, Weights) {
    let cfg = ModelConfig::tiny(Arch::Qwen3, Tokenizer::builtin().vocab_size());
    let base = Weights::random(&cfg, seed, DType::F32, &Device::Cpu).unwrap();
    let mut w = Weights::default();
    for name in base.names() {
        let t = &base.tensors()[name];
        let t = if name.ends_with("norm.weight") {
            t.clone()
        } else {
            (t * 10.0).unwrap()
        };
        w.insert(name, t);
    }
    (cfg, w)
}

fn tiny_model(seed: u64) -> Arc<Transformer> {
    let (cfg, w) = tiny_weights(seed);
    Arc::new(Transformer::from_weights(&cfg, &w, DType::F32, &Device::Cpu).unwrap())
}

fn engine(seed: u64) -> Arc<EngineBackend> {
    Arc::new(
        EngineBackend::start(
            tiny_model(seed),
            PolicyVersion(0),
            EngineBackendConfig {
                name: "engine-test".into(),
                engine: EngineConfig {
                    max_running_requests: 8,
                    max_prefill_tokens: 4096,
                    threads: 1,
                },
            },
        )
        .unwrap(),
    )
}

fn request(id: u64, params: SamplingParams) -> GenRequest {
    GenRequest::new(RequestId(id), vec![2, 40, 41, 42, 43], params)
}

/// Asserts two outputs of the same request agree: ids, tokens, versions and finish exactly,
/// log-probs within 1e-5.
fn assert_same(http: &GenOutput, direct: &GenOutput, what: &str) {
    assert_eq!(http.id, direct.id, "{what}: id");
    assert_eq!(http.prompt_len, direct.prompt_len, "{what}: prompt_len");
    assert_eq!(http.output.tokens, direct.output.tokens, "{what}: tokens");
    assert_eq!(
        http.output.versions, direct.output.versions,
        "{what}: versions"
    );
    assert_eq!(http.finish_reason, direct.finish_reason, "{what}: finish");
    assert_eq!(
        http.start_version, direct.start_version,
        "{what}: start_version"
    );
    assert_eq!(http.output.logprobs.len(), direct.output.logprobs.len());
    for (i, (a, b)) in http
        .output
        .logprobs
        .iter()
        .zip(&direct.output.logprobs)
        .enumerate()
    {
        assert!((a - b).abs() <= 1e-5, "{what}: logprob {i}: {a} vs {b}");
    }
}

/// The next message, or a failed test after a minute (instead of a hung one).
async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("timed out waiting for the gate backend")
        .expect("gate backend gone")
}

/// Waits until `cond` holds, polling; a gate on observable state, not a timing assumption.
async fn until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..5000 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_over_both_apis_matches_the_engine() {
    let eng = engine(1);
    let server = start_test_server(eng.clone()).await;
    let sgl = sglang_client(&server);
    let oai = openai_client(&server);
    sgl.health().await.unwrap();
    oai.health().await.unwrap();

    let greedy = SamplingParams::greedy(10);
    let sampled = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 10,
        seed: None,
        ..Default::default()
    };
    let direct_greedy = eng.generate(request(42, greedy.clone())).await.unwrap();
    assert_eq!(direct_greedy.output.len(), 10);
    assert_eq!(direct_greedy.finish_reason, FinishReason::Length);
    // A stop token the greedy output reaches (plus eos, which the server always adds).
    let stop_at = direct_greedy.output.tokens[3];
    let stopping = SamplingParams {
        stop_token_ids: vec![EOS, stop_at],
        ..greedy.clone()
    };
    let cases = [
        ("greedy", greedy),
        ("sampled, seed from the id", sampled),
        ("greedy with stop tokens", stopping),
    ];
    for (what, params) in cases {
        let mut req = request(42, params);
        req.start_version = PolicyVersion(3);
        let direct = eng.generate(req.clone()).await.unwrap();
        for o in &direct.output.logprobs {
            assert!(o.is_finite() && *o <= 0.0);
        }
        let via_sgl = sgl.generate(req.clone()).await.unwrap();
        assert_same(&via_sgl, &direct, &format!("sglang, {what}"));
        let via_oai = oai.generate(req).await.unwrap();
        assert_same(&via_oai, &direct, &format!("openai, {what}"));
    }
    let stopped = eng
        .generate(request(42, cases_stop(stop_at)))
        .await
        .unwrap();
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.output.tokens.last(), Some(&stop_at));

    // Nothing stays registered client-side.
    assert_eq!(sgl.load().await.unwrap().running, 0);
    assert_eq!(oai.load().await.unwrap().running, 0);
    server.stop().await.unwrap();
}

fn cases_stop(stop_at: u32) -> SamplingParams {
    SamplingParams {
        stop_token_ids: vec![EOS, stop_at],
        ..SamplingParams::greedy(10)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_requests_continue_the_same_random_stream() {
    let eng = engine(2);
    let server = start_test_server(eng.clone()).await;
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 12,
        seed: Some(7),
        ..Default::default()
    };
    let full = eng.generate(request(5, params.clone())).await.unwrap();
    assert_eq!(full.output.len(), 12);
    let head = Generated {
        tokens: full.output.tokens[..5].to_vec(),
        logprobs: full.output.logprobs[..5].to_vec(),
        versions: full.output.versions[..5].to_vec(),
    };
    let mut resumed = request(5, params);
    resumed.resume = Some(head.clone());
    let backends: [(&str, Box<dyn Backend>); 2] = [
        ("sglang", Box::new(sglang_client(&server))),
        ("openai", Box::new(openai_client(&server))),
    ];
    for (what, b) in backends {
        let out = b.generate(resumed.clone()).await.unwrap();
        assert_same(&out, &full, what);
        // The resumed part comes back exactly as given.
        assert_eq!(out.output.logprobs[..5], head.logprobs[..], "{what}");
    }
    // A resumed part that fills the budget needs no call.
    let mut filled = request(6, SamplingParams::greedy(5));
    filled.resume = Some(head);
    let out = sglang_client(&server).generate(filled).await.unwrap();
    assert_eq!(
        (out.output.len(), out.finish_reason),
        (5, FinishReason::Length)
    );
}

/// A scripted backend: every request gets [`GATE_TOKENS`] after its resumed part at once, then
/// waits until it is aborted (by `abort` or `pause(Abort)`) and returns them as aborted.
struct GateBackend {
    /// Server-side ids of started requests, in order.
    started: mpsc::UnboundedSender<RequestId>,
    /// Ids aborted, in order.
    aborted: mpsc::UnboundedSender<RequestId>,
    holds: Mutex<HashMap<RequestId, oneshot::Sender<()>>>,
    version: PolicyVersion,
}

const GATE_TOKENS: [u32; 3] = [10, 11, 12];

struct Gate {
    started: mpsc::UnboundedReceiver<RequestId>,
    aborted: mpsc::UnboundedReceiver<RequestId>,
}

fn gate_backend() -> (Arc<GateBackend>, Gate) {
    let (stx, srx) = mpsc::unbounded_channel();
    let (atx, arx) = mpsc::unbounded_channel();
    let b = Arc::new(GateBackend {
        started: stx,
        aborted: atx,
        holds: Mutex::new(HashMap::new()),
        version: PolicyVersion(9),
    });
    (
        b,
        Gate {
            started: srx,
            aborted: arx,
        },
    )
}

#[async_trait]
impl Backend for GateBackend {
    fn name(&self) -> &str {
        "gate"
    }

    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        let (tx, rx) = oneshot::channel();
        self.holds.lock().unwrap().insert(req.id, tx);
        let _ = self.started.send(req.id);
        let _ = rx.await;
        let mut output = req.resume.clone().unwrap_or_default();
        output.extend(&Generated {
            tokens: GATE_TOKENS.to_vec(),
            logprobs: vec![-0.5; 3],
            versions: vec![self.version; 3],
        });
        Ok(GenOutput {
            id: req.id,
            prompt_len: req.prompt.len(),
            output,
            finish_reason: FinishReason::Aborted,
            start_version: req.start_version,
            served_by: Vec::new(),
        })
    }

    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        if let Some(tx) = self.holds.lock().unwrap().remove(&id) {
            let _ = self.aborted.send(id);
            let _ = tx.send(());
        }
        Ok(())
    }

    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        if mode == PauseMode::Abort {
            let ids: Vec<RequestId> = self.holds.lock().unwrap().keys().copied().collect();
            for id in ids {
                self.abort(id).await?;
            }
        }
        Ok(())
    }

    async fn resume(&self) -> Result<(), BackendError> {
        Ok(())
    }

    async fn update_weights(&self, _: &WeightUpdate) -> Result<(), BackendError> {
        Ok(())
    }

    async fn load(&self) -> Result<BackendLoad, BackendError> {
        Ok(BackendLoad {
            running: self.holds.lock().unwrap().len(),
            waiting: 0,
            version: self.version,
        })
    }

    async fn health(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

fn resumed_request(id: u64) -> GenRequest {
    let mut req = request(id, SamplingParams::greedy(20));
    req.resume = Some(Generated {
        tokens: vec![50, 51],
        logprobs: vec![-1.0, -2.0],
        versions: vec![PolicyVersion(1); 2],
    });
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_returns_the_partial_output() {
    let (gate_b, mut gate) = gate_backend();
    let server = start_test_server(gate_b.clone()).await;

    // SGLang: the abort reaches the server by rid; the partial output comes back.
    let sgl = Arc::new(sglang_client(&server));
    let task = tokio::spawn({
        let sgl = Arc::clone(&sgl);
        async move { sgl.generate(resumed_request(100)).await }
    });
    let server_id = next(&mut gate.started).await;
    assert_eq!(sgl.load().await.unwrap().running, 1);
    sgl.abort(RequestId(100)).await.unwrap();
    assert_eq!(next(&mut gate.aborted).await, server_id);
    let out = task.await.unwrap().unwrap();
    assert_eq!(out.finish_reason, FinishReason::Aborted);
    assert_eq!(out.output.tokens, vec![50, 51, 10, 11, 12]);
    assert_eq!(out.output.logprobs, vec![-1.0, -2.0, -0.5, -0.5, -0.5]);
    let versions: Vec<u64> = out.output.versions.iter().map(|v| v.0).collect();
    assert_eq!(versions, vec![1, 1, 9, 9, 9]);

    // OpenAI: no abort route; the client drops the request, the server notices the closed
    // connection and aborts the generation; the client keeps the resumed part.
    let oai = Arc::new(openai_client(&server));
    let task = tokio::spawn({
        let oai = Arc::clone(&oai);
        async move { oai.generate(resumed_request(101)).await }
    });
    let server_id = next(&mut gate.started).await;
    oai.abort(RequestId(101)).await.unwrap();
    let out = task.await.unwrap().unwrap();
    assert_eq!(out.finish_reason, FinishReason::Aborted);
    assert_eq!(out.output.tokens, vec![50, 51]);
    assert_eq!(next(&mut gate.aborted).await, server_id);

    // Unknown ids are ignored.
    sgl.abort(RequestId(999)).await.unwrap();
    oai.abort(RequestId(999)).await.unwrap();
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_abort_stops_in_flight_requests_and_holds_new_ones() {
    // In flight, SGLang: /pause_generation {"mode": "abort"} aborts it on the server.
    let (gate_b, mut gate) = gate_backend();
    let server = start_test_server(gate_b.clone()).await;
    let sgl = Arc::new(sglang_client(&server));
    let task = tokio::spawn({
        let sgl = Arc::clone(&sgl);
        async move { sgl.generate(resumed_request(1)).await }
    });
    next(&mut gate.started).await;
    sgl.pause(PauseMode::Abort).await.unwrap();
    let out = task.await.unwrap().unwrap();
    assert_eq!(out.finish_reason, FinishReason::Aborted);
    assert_eq!(out.output.len(), 5);
    sgl.resume().await.unwrap();

    // In flight, OpenAI: the client cancels it.
    let oai = Arc::new(openai_client(&server));
    let task = tokio::spawn({
        let oai = Arc::clone(&oai);
        async move { oai.generate(resumed_request(2)).await }
    });
    next(&mut gate.started).await;
    oai.pause(PauseMode::Abort).await.unwrap();
    let out = task.await.unwrap().unwrap();
    assert_eq!(
        (out.finish_reason, out.output.len()),
        (FinishReason::Aborted, 2)
    );
    oai.resume().await.unwrap();
    next(&mut gate.aborted).await;
    server.stop().await.unwrap();

    // New requests while paused wait, then run after resume (engine behind the server).
    let eng = engine(3);
    let server = start_test_server(eng.clone()).await;
    let sgl = Arc::new(sglang_client(&server));
    let oai = Arc::new(openai_client(&server));
    let direct = eng
        .generate(request(7, SamplingParams::greedy(6)))
        .await
        .unwrap();

    sgl.pause(PauseMode::Abort).await.unwrap();
    let task = tokio::spawn({
        let sgl = Arc::clone(&sgl);
        async move { sgl.generate(request(7, SamplingParams::greedy(6))).await }
    });
    until("the engine holds the request", || {
        let eng = eng.clone();
        async move { eng.load().await.unwrap().waiting == 1 }
    })
    .await;
    sgl.resume().await.unwrap();
    assert_same(
        &task.await.unwrap().unwrap(),
        &direct,
        "sglang after resume",
    );

    oai.pause(PauseMode::Keep).await.unwrap();
    let task = tokio::spawn({
        let oai = Arc::clone(&oai);
        async move { oai.generate(request(7, SamplingParams::greedy(6))).await }
    });
    until("the client holds the request", || {
        let oai = Arc::clone(&oai);
        async move { oai.load().await.unwrap().waiting == 1 }
    })
    .await;
    assert_eq!(eng.load().await.unwrap().running, 0);
    oai.resume().await.unwrap();
    assert_same(
        &task.await.unwrap().unwrap(),
        &direct,
        "openai after resume",
    );
    server.stop().await.unwrap();
}

/// Writes a checkpoint of the tiny model with weights from `seed`.
fn write_checkpoint(dir: &Path, seed: u64) {
    let (cfg, w) = tiny_weights(seed);
    rollflash_model::hf::save_dir(dir, &cfg, &w, None).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_weights_from_disk_changes_version_and_outputs() {
    let root = tempfile::tempdir().unwrap();
    write_checkpoint(&root.path().join("ckpt-5"), 50);
    write_checkpoint(&root.path().join("ckpt-6"), 60);
    let eng = engine(4);
    let server = start_server_with(
        eng.clone(),
        ServerConfig {
            weights: WeightsAccess::Under(root.path().to_path_buf()),
            ..Default::default()
        },
    )
    .await;
    let sgl = sglang_client(&server);
    let req = request(1, SamplingParams::greedy(8));
    let before = sgl.generate(req.clone()).await.unwrap();
    assert!(before
        .output
        .versions
        .iter()
        .all(|v| *v == PolicyVersion(0)));

    sgl.update_weights(&WeightUpdate::Disk {
        path: root.path().join("ckpt-5"),
        version: PolicyVersion(5),
    })
    .await
    .unwrap();
    assert_eq!(sgl.load().await.unwrap().version, PolicyVersion(5));
    assert_eq!(eng.load().await.unwrap().version, PolicyVersion(5));
    let info: Value = reqwest::get(format!("{}/get_model_info", server.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["weight_version"], "5");
    assert_eq!(info["is_generation"], true);
    let after = sgl.generate(req.clone()).await.unwrap();
    assert!(after.output.versions.iter().all(|v| *v == PolicyVersion(5)));
    assert_ne!(after.output.logprobs, before.output.logprobs);

    // Through the OpenAI backend's hook, with a relative path (under the root).
    let oai = openai_client(&server);
    oai.update_weights(&WeightUpdate::Disk {
        path: "ckpt-6".into(),
        version: PolicyVersion(6),
    })
    .await
    .unwrap();
    let via_oai = oai.generate(req.clone()).await.unwrap();
    assert!(via_oai
        .output
        .versions
        .iter()
        .all(|v| *v == PolicyVersion(6)));
    assert_ne!(via_oai.output.logprobs, after.output.logprobs);
    // Without our extension, versions are the ones this client set.
    let plain = OpenAiBackend::new(OpenAiConfig {
        use_extension: false,
        model: Some("rollflash".into()),
        ..OpenAiConfig::new(format!("{}/v1", server.url()))
    })
    .unwrap();
    let out = plain.generate(req.clone()).await.unwrap();
    assert_eq!(out.output.tokens, via_oai.output.tokens);
    assert!(out.output.versions.iter().all(|v| *v == PolicyVersion(0)));
    assert!(matches!(
        plain
            .update_weights(&WeightUpdate::Disk {
                path: "ckpt-6".into(),
                version: PolicyVersion(7)
            })
            .await,
        Err(BackendError::Unsupported { .. })
    ));

    // Outside the root, by absolute path or by `..`, and missing directories: refused.
    let elsewhere = tempfile::tempdir().unwrap();
    write_checkpoint(elsewhere.path(), 70);
    let outside = [
        elsewhere.path().to_path_buf(),
        root.path()
            .join("..")
            .join(elsewhere.path().file_name().unwrap()),
        root.path().join("missing"),
    ];
    for path in outside {
        let e = sgl
            .update_weights(&WeightUpdate::Disk {
                path: path.clone(),
                version: PolicyVersion(8),
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&e, BackendError::InvalidRequest { reason, .. } if reason.contains("403")),
            "{path:?}: {e}"
        );
    }
    assert_eq!(eng.load().await.unwrap().version, PolicyVersion(6));
    // In-process weights cannot cross HTTP.
    let e = sgl
        .update_weights(&WeightUpdate::InProcess {
            model: tiny_model(1),
            version: PolicyVersion(9),
        })
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::Unsupported { .. }), "{e}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_loads_are_refused_without_a_weights_root() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), 1);
    let server = start_test_server(engine(5)).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/update_weights_from_disk", server.url()))
        .json(&json!({ "model_path": dir.path() }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["success"], false);
    let msg = body["message"].as_str().unwrap();
    assert!(
        msg.contains("disabled") && msg.contains("--weights-root"),
        "{msg}"
    );
}

/// POSTs raw bytes, optionally with a bearer key; status and JSON body.
async fn post_raw(server: &TestServer, route: &str, body: &str, key: Option<&str>) -> (u16, Value) {
    let mut rb = reqwest::Client::new()
        .post(format!("{}{route}", server.url()))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(k) = key {
        rb = rb.bearer_auth(k);
    }
    let resp = rb.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn error_message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_answers() {
    let server = start_server_with(
        engine(6),
        ServerConfig {
            api_key: Some("s3cret".into()),
            max_body_bytes: 1024,
            ..Default::default()
        },
    )
    .await;
    let ok_body = r#"{"input_ids": [2, 40, 41], "sampling_params": {"max_new_tokens": 2}}"#;

    // API key.
    let (s, v) = post_raw(&server, "/generate", ok_body, None).await;
    assert_eq!(s, 401);
    assert_eq!(v["error"]["type"], "authentication_error");
    let (s, v) = post_raw(&server, "/generate", ok_body, Some("s3cres")).await;
    assert_eq!((s, error_message(&v)), (401, "invalid API key"));
    let (s, v) = post_raw(&server, "/generate", ok_body, Some("s3cret")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["output_ids"].as_array().unwrap().len(), 2);
    let health = reqwest::get(format!("{}/health", server.url()))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // Unknown routes need the key too (nothing is revealed), then answer 404.
    let (s, _) = post_raw(&server, "/nope", "{}", None).await;
    assert_eq!(s, 401);
    let (s, v) = post_raw(&server, "/nope", "{}", Some("s3cret")).await;
    assert_eq!(s, 404);
    assert_eq!(v["error"]["type"], "not_found_error");
    let resp = reqwest::Client::new()
        .get(format!("{}/generate", server.url()))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    // A client with the wrong key gets a non-retryable error.
    let wrong = SglangBackend::new(HttpBackendConfig {
        api_key: Some("wrong".into()),
        ..client_config(&server)
    })
    .unwrap();
    let e = wrong
        .generate(request(1, SamplingParams::greedy(2)))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, BackendError::Protocol { reason, .. } if reason.contains("401")),
        "{e}"
    );
    assert!(!e.is_retryable());

    let key = Some("s3cret");
    // Malformed JSON and wrong types: 400 naming the problem.
    let (s, v) = post_raw(&server, "/generate", r#"{"input_ids": [2, 40"#, key).await;
    assert_eq!(s, 400);
    assert!(error_message(&v).contains("invalid JSON body"), "{v}");
    let (s, v) = post_raw(
        &server,
        "/generate",
        r#"{"input_ids": [2, 40], "sampling_params": {"temperature": "hot"}}"#,
        key,
    )
    .await;
    assert_eq!(s, 400);
    assert!(
        error_message(&v).contains("sampling_params.temperature"),
        "{v}"
    );
    // Invalid and unsupported parameters.
    let (s, v) = post_raw(
        &server,
        "/generate",
        r#"{"input_ids": [2, 40], "sampling_params": {"temperature": -1}}"#,
        key,
    )
    .await;
    assert_eq!(s, 400);
    assert!(error_message(&v).contains("temperature"), "{v}");
    let (s, v) = post_raw(
        &server,
        "/generate",
        r#"{"input_ids": [2, 40], "sampling_params": {"stop": ["x"]}}"#,
        key,
    )
    .await;
    assert_eq!(s, 400);
    assert!(error_message(&v).contains("sampling_params.stop"), "{v}");
    let (s, v) = post_raw(&server, "/generate", r#"{"input_ids": [2, 4000]}"#, key).await;
    assert_eq!(s, 400);
    assert!(error_message(&v).contains("vocabulary"), "{v}");
    // Oversized body.
    let big = format!(r#"{{"input_ids": [{}]}}"#, vec!["40"; 600].join(", "));
    let (s, v) = post_raw(&server, "/generate", &big, key).await;
    assert_eq!(s, 413, "{v}");
    assert!(error_message(&v).contains("limit"), "{v}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_routes_answer_in_openai_shapes() {
    let server = start_test_server(engine(7)).await;
    let client = reqwest::Client::new();
    let models: Value = client
        .get(format!("{}/v1/models", server.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "rollflash");

    let (s, v) = post_raw(
        &server,
        "/v1/completions",
        r#"{"model": "rollflash", "prompt": "1+1=", "max_tokens": 4, "temperature": 0,
            "logprobs": 1, "n": 2, "ignore_eos": true}"#,
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for c in choices {
        let lp = &c["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
        assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
        assert_eq!(lp["text_offset"].as_array().unwrap().len(), 4);
        // The sampled token and one alternative (one entry when they are the same token).
        for top in lp["top_logprobs"].as_array().unwrap() {
            let n = top.as_object().unwrap().len();
            assert!((1..=2).contains(&n), "{top}");
        }
        assert_eq!(c["finish_reason"], "length");
        assert_eq!(c["rollflash"]["output_ids"].as_array().unwrap().len(), 4);
    }
    // Greedy: both choices agree.
    assert_eq!(choices[0]["text"], choices[1]["text"]);
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["total_tokens"], 8 + 5);

    let (s, v) = post_raw(
        &server,
        "/v1/chat/completions",
        r#"{"model": "rollflash", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5, "logprobs": true, "top_logprobs": 0}"#,
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant");
    let content = c["logprobs"]["content"].as_array().unwrap();
    assert!(!content.is_empty() && content.len() <= 5);
    for e in content {
        assert!(e["token"].is_string());
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        assert!(e["bytes"].is_array());
        assert_eq!(e["top_logprobs"], json!([]));
    }
    // The prompt is the built-in template's rendering.
    let expected = Tokenizer::builtin()
        .encode("<|user|>\nhi\n<|assistant|>\n", false)
        .unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], expected.len());

    let (s, v) = post_raw(
        &server,
        "/v1/completions",
        r#"{"model": "gpt-4", "prompt": "x"}"#,
        None,
    )
    .await;
    assert_eq!(s, 404);
    assert!(error_message(&v).contains("gpt-4"), "{v}");
    let (s, v) = post_raw(
        &server,
        "/v1/completions",
        r#"{"prompt": "x", "stop": [""]}"#,
        None,
    )
    .await;
    assert_eq!(s, 400);
    assert!(error_message(&v).contains("stop"), "{v}");

    // The backend's chat method.
    let oai = openai_client(&server);
    let chat = oai
        .chat(&[ChatMessage::user("hi")], &SamplingParams::greedy(5))
        .await
        .unwrap();
    let ids = chat.token_ids.unwrap();
    assert_eq!(ids.len(), chat.logprobs.len());
    assert_eq!(Tokenizer::builtin().decode(&ids, true).unwrap(), chat.text);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_text_prompts_and_rids() {
    let (gate_b, mut gate) = gate_backend();
    let server = start_test_server(gate_b).await;
    let task = tokio::spawn({
        let url = server.url();
        async move {
            reqwest::Client::new()
                .post(format!("{url}/generate"))
                .json(&json!({ "text": "ab", "rid": "my-rid", "return_logprob": true }))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    });
    next(&mut gate.started).await;
    let (s, v) = post_raw(&server, "/abort_request", r#"{"rid": "my-rid"}"#, None).await;
    assert_eq!((s, &v["aborted"]), (200, &json!(1)));
    let v = task.await.unwrap();
    assert_eq!(v["meta_info"]["id"], "my-rid");
    assert_eq!(v["meta_info"]["finish_reason"]["type"], "abort");
    // "ab" with the built-in tokenizer's <bos>.
    assert_eq!(v["meta_info"]["prompt_tokens"], 3);
    assert_eq!(v["output_ids"], json!(GATE_TOKENS));
    assert_eq!(
        v["meta_info"]["output_token_logprobs"][0],
        json!([-0.5, 10, null])
    );
    assert_eq!(v["meta_info"]["weight_version"], "9");
    assert_eq!(v["meta_info"]["output_token_versions"], json!([9, 9, 9]));
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_aborts_generations_in_flight() {
    let (gate_b, mut gate) = gate_backend();
    let server = start_test_server(gate_b).await;
    let sgl = Arc::new(sglang_client(&server));
    let task = tokio::spawn({
        let sgl = Arc::clone(&sgl);
        async move { sgl.generate(resumed_request(1)).await }
    });
    next(&mut gate.started).await;
    server.stop().await.unwrap();
    let out = task.await.unwrap().unwrap();
    assert_eq!(out.finish_reason, FinishReason::Aborted);
    assert_eq!(out.output.tokens, vec![50, 51, 10, 11, 12]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable() {
    // A port nobody listens on: bind one, then free it.
    let addr = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let cfg = HttpBackendConfig {
        max_retries: 2,
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(2),
        ..HttpBackendConfig::new(format!("http://{addr}"))
    };
    let sgl = SglangBackend::new(cfg.clone()).unwrap();
    let e = sgl.health().await.unwrap_err();
    assert!(matches!(e, BackendError::Unavailable { .. }), "{e}");
    assert!(e.is_retryable());
    // The message names the server that is down, and the transport error is kept.
    assert!(e.to_string().contains(&cfg.base_url), "{e}");
    let transport = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<reqwest::Error>())
        .unwrap_or_else(|| panic!("no reqwest source: {e:?}"));
    assert!(transport.is_connect(), "{transport}");
    let e = sgl
        .generate(request(1, SamplingParams::greedy(2)))
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::Unavailable { .. }), "{e}");
    let oai = OpenAiBackend::new(OpenAiConfig {
        http: cfg,
        ..OpenAiConfig::new("")
    })
    .unwrap();
    assert!(matches!(
        oai.health().await,
        Err(BackendError::Unavailable { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_engine_refuses_keeps_the_engine_error() {
    let eng = engine(0);
    let e = eng
        .generate(GenRequest::new(
            RequestId(1),
            Vec::new(),
            SamplingParams::greedy(2),
        ))
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::InvalidRequest { .. }), "{e}");
    assert!(!e.is_retryable());
    let source = std::error::Error::source(&e).unwrap_or_else(|| panic!("no source: {e:?}"));
    assert!(source.is::<rollflash_model::ModelError>(), "{source:?}");
}

/// The `data:` payloads of a server-sent event stream, `[DONE]` last.
async fn sse(server: &TestServer, route: &str, body: Value) -> Vec<String> {
    let resp = reqwest::Client::new()
        .post(format!("{}{route}", server.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ctype.starts_with("text/event-stream"), "{ctype}");
    let text = resp.text().await.unwrap();
    let data: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
    data
}

fn chunks(data: &[String]) -> Vec<Value> {
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

async fn post_json(server: &TestServer, route: &str, body: Value) -> Value {
    let (s, v) = post_raw(server, route, &body.to_string(), None).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// What harnesses and agent frameworks send: streaming (both routes, with a usage chunk),
/// stop strings, echo with prompt log-probs, and top log-prob alternatives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_routes_stream_stop_echo_and_list_alternatives() {
    let server = start_test_server(engine(7)).await;
    let base = json!({"prompt": "1+1=", "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let whole = post_json(&server, "/v1/completions", base.clone()).await;
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    let ids = whole["choices"][0]["rollflash"]["output_ids"].clone();

    // Streaming completions: the same text, a finish reason, a usage chunk, [DONE].
    let mut body = base.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body["return_token_ids"] = json!(true);
    let cs = chunks(&sse(&server, "/v1/completions", body).await);
    let usage = cs.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    let mut streamed = String::new();
    let mut streamed_ids = Vec::new();
    for c in &cs[..cs.len() - 1] {
        assert_eq!(c["object"], "text_completion");
        streamed.push_str(c["choices"][0]["text"].as_str().unwrap());
        streamed_ids.extend(c["choices"][0]["token_ids"].as_array().unwrap().clone());
    }
    assert_eq!(streamed, text);
    assert_eq!(json!(streamed_ids), ids);
    assert_eq!(cs[cs.len() - 2]["choices"][0]["finish_reason"], "length");

    // Streaming chat: the role first, then content, the finish reason last.
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
        "temperature": 0, "ignore_eos": true});
    let whole_chat = post_json(&server, "/v1/chat/completions", chat.clone()).await;
    let mut body = chat.clone();
    body["stream"] = json!(true);
    let cs = chunks(&sse(&server, "/v1/chat/completions", body).await);
    assert_eq!(cs[0]["object"], "chat.completion.chunk");
    assert_eq!(cs[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = cs
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, whole_chat["choices"][0]["message"]["content"]);
    assert_eq!(cs.last().unwrap()["choices"][0]["finish_reason"], "length");

    // Stop strings: cut before the earliest match, finish "stop", the string as stop_reason;
    // streamed or not, and kept with include_stop_str_in_output.
    let chars: Vec<char> = text.chars().collect();
    let (at, stop) = (2..chars.len() - 1)
        .map(|p| (p, chars[p..p + 2].iter().collect::<String>()))
        .find(|(p, s)| text.find(s.as_str()) == Some(text.char_indices().nth(*p).unwrap().0))
        .expect("a two-character stop string in the greedy text");
    let before: String = chars[..at].iter().collect();
    let mut body = base.clone();
    body["stop"] = json!([stop, "never-generated"]);
    let v = post_json(&server, "/v1/completions", body.clone()).await;
    let c = &v["choices"][0];
    assert_eq!(c["text"], json!(before));
    assert_eq!(c["finish_reason"], "stop");
    assert_eq!(c["stop_reason"], json!(stop));
    body["stream"] = json!(true);
    let cs = chunks(&sse(&server, "/v1/completions", body.clone()).await);
    let streamed: String = cs
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, before);
    assert_eq!(cs.last().unwrap()["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(false);
    body["include_stop_str_in_output"] = json!(true);
    let v = post_json(&server, "/v1/completions", body).await;
    assert_eq!(v["choices"][0]["text"], json!(format!("{before}{stop}")));
    let mut chat_stop = chat.clone();
    let chat_text = whole_chat["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    let first: String = chat_text.chars().skip(1).take(1).collect();
    chat_stop["stop"] = json!(first);
    let v = post_json(&server, "/v1/chat/completions", chat_stop).await;
    let got = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        !got.contains(first.as_str()),
        "{got:?} still holds {first:?}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Echo: the prompt's text first; with logprobs, prompt log-probs (the first is null).
    let mut body = base.clone();
    body["echo"] = json!(true);
    body["max_tokens"] = json!(3);
    body["logprobs"] = json!(0);
    let v = post_json(&server, "/v1/completions", body.clone()).await;
    let c = &v["choices"][0];
    let prompt_len = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(c["text"].as_str().unwrap().starts_with("1+1="), "{c}");
    let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), prompt_len + 3);
    assert!(lps[0].is_null());
    assert!(lps[1..]
        .iter()
        .all(|x| x.as_f64().is_some_and(|x| x <= 0.0)));
    body["max_tokens"] = json!(0);
    let v = post_json(&server, "/v1/completions", body).await;
    assert!(v["choices"][0]["text"].as_str().unwrap().ends_with("1+1="));
    assert_eq!(v["usage"]["completion_tokens"], 0);

    // Alternatives: `logprobs: 3` lists the three most likely (greedy: the sampled one is the
    // best, with the same log-prob), `top_logprobs: 2` on chat.
    let mut body = base.clone();
    body["logprobs"] = json!(3);
    body["max_tokens"] = json!(4);
    let v = post_json(&server, "/v1/completions", body).await;
    let lp = &v["choices"][0]["logprobs"];
    for (j, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 3, "{top:?}");
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let sampled = lp["token_logprobs"][j].as_f64().unwrap();
        assert!((best - sampled).abs() < 1e-4, "{best} vs {sampled}");
    }
    let mut body = chat.clone();
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let v = post_json(&server, "/v1/chat/completions", body).await;
    for e in v["choices"][0]["logprobs"]["content"].as_array().unwrap() {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], e["token"], "greedy samples the best token");
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
    }
    server.stop().await.unwrap();
}
