//! Shared test fixtures: tiny random models, adapted models, engine backends, and a backend
//! that hangs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use candle_core::{DType, Device};
use rollflash_core::{GenOutput, GenRequest, PolicyVersion, RequestId};
use rollflash_model::config::{Arch, ModelConfig};
use rollflash_model::engine::EngineConfig;
use rollflash_model::lora::{init_adapters, Adapters, LoraConfig};
use rollflash_model::model::Transformer;
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    Backend, BackendError, BackendLoad, EngineBackend, EngineBackendConfig, PauseMode, WeightUpdate,
};

/// `base` with adapters of `lora`'s shape in PEFT's initialisation, but `B` set to `b`
/// everywhere (a fresh `B` is zero: the adapter would change nothing, and neither a merge nor
/// a probe could tell it from the base).
pub fn adapted(base: &Transformer, lora: LoraConfig, b: f64) -> Arc<Transformer> {
    let cfg = base.config().clone();
    let init = init_adapters(&cfg, &lora, 1, DType::F32, &Device::Cpu).unwrap();
    let mut weights = Weights::default();
    for name in init.names() {
        let t = &init.tensors()[name];
        let t = if name.ends_with("lora_B.weight") {
            (t.ones_like().unwrap() * b).unwrap()
        } else {
            t.clone()
        };
        weights.insert(name, t);
    }
    let adapters = Adapters {
        config: lora,
        weights,
    };
    Arc::new(
        Transformer::with_adapters(&cfg, &base.weights(), &adapters, DType::F32, &Device::Cpu)
            .unwrap(),
    )
}

/// Vocabulary of the tiny test models.
pub const VOCAB: usize = 64;

/// A tiny Qwen3-shaped model with random weights scaled up so greedy outputs vary.
pub fn tiny_model(seed: u64) -> Arc<Transformer> {
    tiny_model_with_vocab(seed, VOCAB)
}

/// As [`tiny_model`], with the given vocabulary (100 covers the built-in tokenizer).
pub fn tiny_model_with_vocab(seed: u64, vocab: usize) -> Arc<Transformer> {
    let cfg = ModelConfig::tiny(Arch::Qwen3, vocab);
    let w = Weights::random(&cfg, seed, DType::F32, &Device::Cpu).unwrap();
    let mut sharp = Weights::default();
    for name in w.names() {
        let t = &w.tensors()[name];
        let t = if name.ends_with("norm.weight") {
            t.clone()
        } else {
            (t * 20.0).unwrap()
        };
        sharp.insert(name, t);
    }
    Arc::new(Transformer::from_weights(&cfg, &sharp, DType::F32, &Device::Cpu).unwrap())
}

/// An engine worker over `tiny_model(seed)`.
pub fn engine_backend(name: &str, seed: u64, max_running: usize) -> Arc<EngineBackend> {
    engine_backend_over(name, tiny_model(seed), max_running)
}

/// An engine worker over `model`.
pub fn engine_backend_over(
    name: &str,
    model: Arc<Transformer>,
    max_running: usize,
) -> Arc<EngineBackend> {
    Arc::new(
        EngineBackend::start(
            model,
            PolicyVersion(0),
            EngineBackendConfig {
                name: name.into(),
                engine: EngineConfig {
                    max_running_requests: max_running,
                    max_prefill_tokens: 4096,
                    threads: 1,
                },
            },
        )
        .unwrap(),
    )
}

/// A backend that accepts every request and never answers it — a wedged server whose
/// connection stays open — and ignores aborts (it only counts them). Everything else
/// succeeds, health checks included: nothing but a deadline can tell it is stuck.
#[derive(Debug, Default)]
pub struct Hanging {
    calls: AtomicUsize,
    aborts: AtomicUsize,
}

impl Hanging {
    /// `generate` calls received.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// `abort` calls received.
    pub fn aborts(&self) -> usize {
        self.aborts.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Backend for Hanging {
    fn name(&self) -> &str {
        "hanging"
    }

    async fn generate(&self, _req: GenRequest) -> Result<GenOutput, BackendError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }

    async fn abort(&self, _id: RequestId) -> Result<(), BackendError> {
        self.aborts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn pause(&self, _mode: PauseMode) -> Result<(), BackendError> {
        Ok(())
    }

    async fn resume(&self) -> Result<(), BackendError> {
        Ok(())
    }

    async fn update_weights(&self, _update: &WeightUpdate) -> Result<(), BackendError> {
        Ok(())
    }

    async fn load(&self) -> Result<BackendLoad, BackendError> {
        Ok(BackendLoad::default())
    }

    async fn health(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// A backend and its weight route, as the proxy's entry holds them: calls go to the backend
/// (through `Deref`), weight updates through the route with [`Routed::update`].
pub struct Routed {
    pub backend: Arc<dyn rollflash_rollout::Backend>,
    pub route: rollflash_rollout::WeightRoute,
}

impl Routed {
    pub async fn update(
        &self,
        update: &rollflash_rollout::WeightUpdate,
    ) -> Result<(), rollflash_rollout::BackendError> {
        self.route.send(self.backend.as_ref(), update).await
    }

    pub fn layout(&self) -> Option<rollflash_rollout::Layout> {
        self.route.layout()
    }
}

impl std::ops::Deref for Routed {
    type Target = dyn rollflash_rollout::Backend;
    fn deref(&self) -> &Self::Target {
        self.backend.as_ref()
    }
}
