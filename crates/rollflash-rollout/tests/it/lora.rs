//! Adapter-only weight sync against `rollflash serve`'s API: each version is published as a
//! PEFT directory, loaded with `/load_lora_adapter` (SGLang API) or `/v1/load_lora_adapter`
//! (vLLM API), generation names it, its tokens carry its version, and the probe after each
//! load proves the server applies it — a server that loads the adapter and samples from the
//! base fails the probe, naming why.

use std::sync::Arc;

use rollflash_core::{GenRequest, PolicyVersion, RequestId, SamplingParams};
use rollflash_model::lora::LoraConfig;
use rollflash_model::model::Transformer;
use rollflash_model::train::token_stats;
use rollflash_rollout::{
    AdapterProbe, Backend, DiskWeights, EngineAdapterHost, EngineBackend, EngineBackendConfig,
    Layout, ServerConfig, WeightPublisher, WeightRoute, WeightUpdate, WeightsAccess,
};

use crate::common::{tiny_model_with_vocab, Routed};
use crate::http::{client_config, start_server_with_adapters, TestServer};

/// The built-in tokenizer's vocabulary fits.
const VOCAB: usize = 100;

/// `base` with rank-4 adapters whose `B` is `b`.
fn adapted(base: &Transformer, b: f64) -> Arc<Transformer> {
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        ..LoraConfig::default()
    };
    crate::common::adapted(base, lora, b)
}

/// `rollflash serve` on `base` with adapters (ignored by the stand-in when `ignore`).
async fn server(base: Arc<Transformer>, ignore: bool) -> TestServer {
    let cfg = EngineBackendConfig {
        name: "engine-0".into(),
        engine: Default::default(),
    };
    let engine = Arc::new(EngineBackend::start(base, PolicyVersion(0), cfg.clone()).unwrap());
    let mut host = EngineAdapterHost::new(Arc::clone(&engine), cfg);
    host.ignore_adapters = ignore;
    start_server_with_adapters(
        engine,
        ServerConfig {
            weights: WeightsAccess::Anywhere,
            ..ServerConfig::default()
        },
        Some(Arc::new(host)),
    )
    .await
}

fn request(id: u64) -> GenRequest {
    GenRequest {
        id: RequestId(id),
        prompt: vec![5, 9, 13, 2],
        params: SamplingParams {
            max_new_tokens: 6,
            seed: Some(id),
            ..SamplingParams::default()
        },
        start_version: PolicyVersion(0),
        resume: None,
    }
}

/// The trainer's log-probs of `out`'s tokens after `prompt` under `model` (T = 1).
fn trainer_logprobs(model: &Transformer, prompt: &[u32], out: &[u32]) -> Vec<f32> {
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(out);
    let st = token_stats(model, &[&seq], 1.0, true).unwrap();
    st.logprobs.to_vec1::<f32>().unwrap()[prompt.len()..].to_vec()
}

#[tokio::test]
async fn the_adapter_is_synced_over_the_sglang_api_and_generation_uses_it() {
    let base = tiny_model_with_vocab(3, VOCAB);
    let srv = server(Arc::clone(&base), false).await;
    let tmp = tempfile::tempdir().unwrap();
    let publisher =
        Arc::new(WeightPublisher::new(tmp.path(), 2, base.config().clone(), None).unwrap());
    let client = Arc::new(rollflash_rollout::SglangBackend::new(client_config(&srv)).unwrap());
    let sync = Routed {
        backend: client,
        route: WeightRoute::Disk(DiskWeights::adapter(
            Arc::clone(&publisher),
            AdapterProbe::default(),
        )),
    };
    for v in 1..=3u64 {
        let model = adapted(&base, 0.02 * v as f64);
        // As the proxy's sync does: pause, update, resume.
        sync.pause(rollflash_rollout::PauseMode::Keep)
            .await
            .unwrap();
        sync.update(&WeightUpdate::InProcess {
            model: Arc::clone(&model),
            version: PolicyVersion(v),
        })
        .await
        .unwrap();
        sync.resume().await.unwrap();
        assert_eq!(sync.layout(), Some(Layout::Adapter));
        let dir = publisher.adapter_dir_of(PolicyVersion(v));
        assert!(dir.join("adapter_config.json").is_file());
        assert!(dir.join("adapter_model.safetensors").is_file());
        // No merged model was written: only the adapter travels.
        assert!(!publisher.dir_of(PolicyVersion(v)).exists());
        let req = request(100 + v);
        let out = sync.generate(req.clone()).await.unwrap();
        assert!(out.output.versions.iter().all(|x| *x == PolicyVersion(v)));
        let want = trainer_logprobs(&model, &req.prompt, &out.output.tokens);
        for (a, b) in out.output.logprobs.iter().zip(&want) {
            assert!((a - b).abs() < 1e-4, "served {a} vs trainer {b}");
        }
    }
    // Two versions kept on disk, the oldest pruned.
    assert!(!publisher.adapter_dir_of(PolicyVersion(1)).exists());
    // The server holds the two newest adapters: the oldest was unloaded.
    let models: serde_json::Value = reqwest::get(format!("{}/v1/models", srv.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["rollflash", "rollflash-v2", "rollflash-v3"]);
}

/// A server that loads the adapter but samples from the base fails the probe, and the
/// error says so: the backend leaves rotation with that reason instead of serving the base.
#[tokio::test]
async fn a_server_that_ignores_the_adapter_fails_the_probe() {
    let base = tiny_model_with_vocab(3, VOCAB);
    let srv = server(Arc::clone(&base), true).await;
    let tmp = tempfile::tempdir().unwrap();
    let publisher =
        Arc::new(WeightPublisher::new(tmp.path(), 2, base.config().clone(), None).unwrap());
    let client = Arc::new(rollflash_rollout::SglangBackend::new(client_config(&srv)).unwrap());
    let sync = Routed {
        backend: client,
        route: WeightRoute::Disk(DiskWeights::adapter(publisher, AdapterProbe::default())),
    };
    let e = sync
        .update(&WeightUpdate::InProcess {
            model: adapted(&base, 0.05),
            version: PolicyVersion(1),
        })
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("the adapter is ignored"), "{msg}");
    assert!(msg.contains("rollflash-v1"), "{msg}");
}

/// A server whose base changes under the adapters (restarted on its original model while
/// the trainer's base is another): the next adapter fails its probe, and the update after it
/// (the proxy's catch-up) checks the base again, sends it whole and passes.
#[tokio::test]
async fn a_server_that_lost_its_base_gets_it_back_before_the_next_adapter() {
    let base = tiny_model_with_vocab(3, VOCAB);
    let srv = server(Arc::clone(&base), false).await;
    let tmp = tempfile::tempdir().unwrap();
    let publisher =
        Arc::new(WeightPublisher::new(tmp.path(), 2, base.config().clone(), None).unwrap());
    let client = Arc::new(rollflash_rollout::SglangBackend::new(client_config(&srv)).unwrap());
    let sync = Routed {
        backend: client.clone(),
        route: WeightRoute::Disk(DiskWeights::adapter(
            Arc::clone(&publisher),
            AdapterProbe::default(),
        )),
    };
    let update = |v: u64| WeightUpdate::InProcess {
        model: adapted(&base, 0.02 * v as f64),
        version: PolicyVersion(v),
    };
    sync.update(&update(1)).await.unwrap();
    // The "restart": the server serves another base, unknown to the sync.
    let other = WeightPublisher::new(tmp.path().join("other"), 1, base.config().clone(), None)
        .unwrap()
        .publish(&tiny_model_with_vocab(9, VOCAB), PolicyVersion(1))
        .await
        .unwrap();
    client
        .update_weights(&WeightUpdate::Disk {
            path: other,
            version: PolicyVersion(1),
        })
        .await
        .unwrap();
    // The update leaves the backend paused, as inside the proxy's sync; the proxy resumes.
    let e = sync.update(&update(2)).await.unwrap_err();
    assert!(e.to_string().contains("match neither"), "{e}");
    sync.update(&update(2)).await.unwrap();
    sync.resume().await.unwrap();
    let out = sync.generate(request(200)).await.unwrap();
    let want = trainer_logprobs(
        &adapted(&base, 0.04),
        &request(200).prompt,
        &out.output.tokens,
    );
    for (a, b) in out.output.logprobs.iter().zip(&want) {
        assert!((a - b).abs() < 1e-4, "served {a} vs trainer {b}");
    }
}

/// The vLLM-style routes: `/v1/load_lora_adapter`, `model` naming the adapter on
/// `/v1/completions`, `/v1/unload_lora_adapter`; an unknown adapter is a 404.
#[tokio::test]
async fn the_vllm_routes_load_name_and_unload_an_adapter() {
    let base = tiny_model_with_vocab(3, VOCAB);
    let srv = server(Arc::clone(&base), false).await;
    let tmp = tempfile::tempdir().unwrap();
    let publisher = WeightPublisher::new(tmp.path(), 2, base.config().clone(), None).unwrap();
    let model = adapted(&base, 0.05);
    let dir = publisher
        .publish_adapter(&model, PolicyVersion(1))
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let post = |route: &str, body: serde_json::Value| {
        http.post(format!("{}{route}", srv.url()))
            .json(&body)
            .send()
    };
    let r = post(
        "/v1/load_lora_adapter",
        serde_json::json!({"lora_name": "a", "lora_path": dir.to_string_lossy()}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let prompt = [5u32, 9, 13, 2];
    let complete = |m: &'static str| {
        post(
            "/v1/completions",
            serde_json::json!({"model": m, "prompt": prompt, "max_tokens": 4, "seed": 7,
                "temperature": 1.0, "logprobs": 0, "return_token_ids": true,
                "return_tokens_as_token_ids": true}),
        )
    };
    let v: serde_json::Value = complete("a").await.unwrap().json().await.unwrap();
    let ids: Vec<u32> = serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap();
    let lps: Vec<f32> =
        serde_json::from_value(v["choices"][0]["logprobs"]["token_logprobs"].clone()).unwrap();
    let want = trainer_logprobs(&model, &prompt, &ids);
    for (a, b) in lps.iter().zip(&want) {
        assert!((a - b).abs() < 1e-4, "served {a} vs trainer {b}");
    }
    let r = post(
        "/v1/unload_lora_adapter",
        serde_json::json!({"lora_name": "a"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(complete("a").await.unwrap().status(), 404);
}
