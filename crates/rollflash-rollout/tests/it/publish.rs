//! Weight publication for remote backends: one directory per version, written once however
//! many backends ask, loadable as a whole model, older ones pruned; the disk weight route
//! turns an in-process update into a disk one of that directory.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rollflash_core::{GenOutput, GenRequest, PolicyVersion, RequestId};
use rollflash_rollout::{
    Backend, BackendError, BackendLoad, DiskWeights, InstantBackend, PauseMode, TokenScore,
    WeightPublisher, WeightRoute, WeightUpdate,
};

use crate::common::tiny_model;

/// Records the updates it is given, and serves as the instant backend it wraps.
struct Recording {
    inner: InstantBackend,
    seen: Mutex<Vec<WeightUpdate>>,
}

#[async_trait]
impl Backend for Recording {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        self.inner.generate(req).await
    }
    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        self.inner.abort(id).await
    }
    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        self.inner.pause(mode).await
    }
    async fn resume(&self) -> Result<(), BackendError> {
        self.inner.resume().await
    }
    async fn update_weights(&self, u: &WeightUpdate) -> Result<(), BackendError> {
        self.seen.lock().unwrap().push(u.clone());
        self.inner.update_weights(u).await
    }
    async fn load(&self) -> Result<BackendLoad, BackendError> {
        self.inner.load().await
    }
    async fn health(&self) -> Result<(), BackendError> {
        self.inner.health().await
    }
    /// One entry per scored position, so a wrapper that fell back to the trait's default
    /// (`Unsupported`) shows.
    async fn score(
        &self,
        tokens: &[u32],
        _temperature: f64,
        _top: usize,
    ) -> Result<Vec<TokenScore>, BackendError> {
        Ok(tokens
            .windows(2)
            .map(|w| TokenScore {
                logprob: -(w[1] as f32),
                top: Vec::new(),
            })
            .collect())
    }
}

#[tokio::test]
async fn each_version_is_one_loadable_directory_and_old_ones_are_pruned() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(3);
    let publisher = Arc::new(
        WeightPublisher::new(tmp.path().join("w"), 2, model.config().clone(), None).unwrap(),
    );
    let rec: Vec<Arc<Recording>> = (0..2)
        .map(|i| {
            Arc::new(Recording {
                inner: InstantBackend::new(format!("r{i}")),
                seen: Mutex::new(Vec::new()),
            })
        })
        .collect();
    // One route per backend, as the proxy holds them; the publisher is shared.
    let routes: Vec<WeightRoute> = rec
        .iter()
        .map(|_| WeightRoute::Disk(DiskWeights::new(Arc::clone(&publisher))))
        .collect();
    for v in 1..=3 {
        let update = WeightUpdate::InProcess {
            model: Arc::clone(&model),
            version: PolicyVersion(v),
        };
        let (a, b) = tokio::join!(
            routes[0].send(rec[0].as_ref(), &update),
            routes[1].send(rec[1].as_ref(), &update)
        );
        a.unwrap();
        b.unwrap();
    }
    for r in &rec {
        let seen = r.seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        for (i, u) in seen.iter().enumerate() {
            let WeightUpdate::Disk { path, version } = u else {
                panic!("in-process weights reached a remote backend: {u:?}");
            };
            assert_eq!(*version, PolicyVersion(i as u64 + 1));
            assert_eq!(path, &publisher.dir_of(*version));
        }
    }
    // The newest two remain, complete (no temporary directory left), and load as the model.
    let mut names: Vec<String> = std::fs::read_dir(publisher.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["v00000002", "v00000003"]);
    assert!(publisher.root().is_absolute());
    let dir = publisher.dir_of(PolicyVersion(3));
    let loaded = rollflash_model::hf::load_weights(&dir, &candle_core::Device::Cpu).unwrap();
    assert_eq!(loaded.max_abs_diff(&model.weights()).unwrap(), 0.0);
}

#[tokio::test]
async fn a_fixed_weights_server_takes_only_the_version_it_serves() {
    let judge = InstantBackend::new("judge");
    let route = WeightRoute::Fixed {
        serves: PolicyVersion(0),
    };
    route
        .send(
            &judge,
            &WeightUpdate::Disk {
                path: "x".into(),
                version: PolicyVersion(0),
            },
        )
        .await
        .unwrap();
    let e = route
        .send(
            &judge,
            &WeightUpdate::Disk {
                path: "x".into(),
                version: PolicyVersion(1),
            },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("weights = \"none\""), "{e}");
}

/// A model with LoRA adapters is published merged: the directory holds `W + (alpha/r)·B·A`
/// under the base's names, with no adapter tensors, and loads as the same policy.
#[tokio::test]
async fn a_lora_model_is_published_merged() {
    use candle_core::{DType, Device};
    let tmp = tempfile::tempdir().unwrap();
    let base = tiny_model(4);
    let cfg = base.config().clone();
    let model = crate::common::adapted(&base, Default::default(), 0.05);
    let publisher = WeightPublisher::new(tmp.path().join("w"), 2, cfg.clone(), None).unwrap();
    let dir = publisher.publish(&model, PolicyVersion(1)).await.unwrap();
    let loaded = rollflash_model::hf::load_weights(&dir, &Device::Cpu).unwrap();
    let merged = model.merged_weights().unwrap();
    assert_eq!(loaded.max_abs_diff(&merged).unwrap(), 0.0);
    assert!(loaded.max_abs_diff(&base.weights()).unwrap() > 1e-3);
    let served =
        rollflash_model::model::Transformer::from_weights(&cfg, &loaded, DType::F32, &Device::Cpu)
            .unwrap();
    let tokens = [1u32, 7, 3, 9, 2];
    let a = model.forward_logits(&tokens).unwrap();
    let b = served.forward_logits(&tokens).unwrap();
    let max_abs = |t: &candle_core::Tensor| {
        t.abs()
            .and_then(|t| t.max_all())
            .and_then(|t| t.to_scalar::<f32>())
            .unwrap()
    };
    let scale = max_abs(&a);
    let diff = max_abs(&(a - b).unwrap());
    // Merging rounds W + ΔW once in f32; the unmerged forward rounds differently.
    assert!(
        diff <= 1e-4 * scale + 1e-4,
        "served logits differ by {diff} (scale {scale})"
    );
}
