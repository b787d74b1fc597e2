//! `POST /update_weights_from_disk` takes a path from the network: only directories under
//! the configured weights root load. Beyond the `..` and absolute-path cases in `http.rs`:
//! symlinks that leave the root (directly, through a parent, or chained), files instead of
//! directories, NUL bytes and odd encodings are refused with the same 403 (so the route
//! cannot probe which paths exist outside the root), and the weights stay as they were; a
//! symlink that stays inside the root loads.

use std::path::Path;
use std::sync::Arc;

use rollflash_core::PolicyVersion;
use rollflash_rollout::{Backend, ServerConfig, WeightsAccess};
use serde_json::{json, Value};

use crate::common;
use crate::http::start_server_with;

fn write_checkpoint(dir: &Path, seed: u64) {
    let cfg = rollflash_model::config::ModelConfig::tiny(
        rollflash_model::config::Arch::Qwen3,
        common::VOCAB,
    );
    let w = rollflash_model::weights::Weights::random(
        &cfg,
        seed,
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    rollflash_model::hf::save_dir(dir, &cfg, &w, None).unwrap();
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_leaving_the_weights_root_are_refused() {
    use std::os::unix::fs::symlink;

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    write_checkpoint(&root.join("ckpt"), 1);
    write_checkpoint(&outside.join("ckpt"), 2);
    // Out of the root: a link to a checkpoint, a link to a parent, a chain of links.
    symlink(outside.join("ckpt"), root.join("escape")).unwrap();
    symlink(&outside, root.join("parent")).unwrap();
    symlink(root.join("escape"), root.join("chain")).unwrap();
    // Inside the root: allowed.
    symlink(root.join("ckpt"), root.join("alias")).unwrap();
    let engine = common::engine_backend("paths", 1, 4);
    let server = start_server_with(
        Arc::clone(&engine) as Arc<dyn Backend>,
        ServerConfig {
            weights: WeightsAccess::Under(root.clone()),
            ..Default::default()
        },
    )
    .await;
    let c = reqwest::Client::new();
    let post = |path: Value| {
        let c = c.clone();
        let url = format!("{}/update_weights_from_disk", server.url());
        async move {
            let resp = c
                .post(url)
                .json(&json!({ "model_path": path, "weight_version": "9" }))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    let refused = [
        json!("escape"),
        json!("parent/ckpt"),
        json!("chain"),
        json!(root.join("escape")),
        json!(root.join("ckpt/../../outside/ckpt")),
        json!("ckpt/../../outside/ckpt"),
        json!("ckpt/config.json"),
        json!("ckpt\u{0}/../../outside/ckpt"),
        json!("%2e%2e/outside/ckpt"),
        json!("/"),
        json!(outside.join("ckpt")),
    ];
    let mut first_message = None;
    for p in refused {
        let (status, body) = post(p.clone()).await;
        assert_eq!(status, 403, "{p}: {body}");
        assert_eq!(body["success"], false, "{p}");
        let msg = body["message"].as_str().unwrap().to_string();
        assert!(msg.contains("under the weights root"), "{p}: {msg}");
        // The same message shape for existing and missing targets: nothing to probe with.
        let shape = msg.replace(p.as_str().unwrap_or_default(), "<path>");
        assert_eq!(
            first_message.get_or_insert_with(|| shape.clone()),
            &shape,
            "{p}"
        );
    }
    assert_eq!(engine.load().await.unwrap().version, PolicyVersion(0));
    // A link that stays inside the root loads.
    let (status, body) = post(json!("alias")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(engine.load().await.unwrap().version, PolicyVersion(9));
    server.stop().await.unwrap();
}
