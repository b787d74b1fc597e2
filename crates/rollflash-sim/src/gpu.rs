//! A cost model of one GPU serving and training a 7–8 B dense model, for the cluster-scale
//! scenarios (8 → 64 → 512 GPUs). Every number is derived from a hardware figure and a
//! stated efficiency, then checked against a published measurement.
//!
//! ## Hardware (NVIDIA H800 SXM, the paper's GPU; H100 SXM has the same compute and memory)
//! - 989 TFLOP/s dense BF16, 3.35 TB/s HBM3, 80 GB (NVIDIA H100 datasheet; the H800 differs
//!   only in NVLink bandwidth, 400 vs 900 GB/s).
//!
//! ## Model (Qwen2.5-7B shape, `config.json` on Hugging Face)
//! - 7.6 B parameters → 15.2 GB of BF16 weights; 28 layers, 4 KV heads of dimension 128 →
//!   KV cache 28·2·4·128·2 B = 57 KiB per token.
//!
//! ## Decode (memory-bound; see `InferenceCost`)
//! - `step_s` = weights read once per step at 70% of peak bandwidth: 15.2 GB / 2.35 TB/s =
//!   6.5 ms, plus ~1 ms of scheduling and kernel launches per step → **7.5 ms**.
//! - `context_token_s` = one token's KV read at the same 70%: 57 KiB / 2.35 TB/s →
//!   **25 ns** per context token per step.
//! - `seq_s` = the per-sequence matmul work that is not hidden under the weight reads:
//!   2·7.6 GFLOP per token at ~50% of peak is 31 µs; part of it overlaps the memory
//!   traffic, so **20 µs**.
//! - `prefill_token_s` = 2·7.6 GFLOP per prompt token at 60% of peak → **26 µs**.
//! - Check: 256 sequences at ~1.1 k tokens of context cost 7.5 + 5.1 + 7.0 ≈ 19.6 ms per
//!   step, i.e. ~13 k output tokens/s per GPU. Published: ~12.5 k tok/s for Llama 3.1 8B
//!   BF16 on one H100 with vLLM at high concurrency (vLLM v0.6.0 release blog, "2.7x
//!   Throughput Improvement", blog.vllm.ai, 2024-09-05, and third-party reproductions of
//!   its 1024-in / 128-out benchmark). At batch 1 the model gives ~130 tok/s, the
//!   memory-roofline figure for an 8 B model on H100.
//!
//! ## Training
//! - A step re-scores the batch (forward, 2·N FLOP per token) and trains on it (forward +
//!   backward, 6·N): 8 × 7.6 G = 61 GFLOP per token.
//! - At 40% model-FLOPs utilisation — Meta reports 38–43% BF16 MFU training Llama 3 on
//!   H100s (The Llama 3 Herd of Models, arXiv 2407.21783, Table 4) — one GPU processes a
//!   token in 61 G / (0.40 · 989 T) = **154 µs**.
//! - Data-parallel efficiency **0.9** beyond one GPU (gradient all-reduce of 15 GB per step
//!   over NVLink / InfiniBand, partly overlapped with the backward pass); **2 s** fixed per
//!   step (optimizer, all-reduce tail, gathering the weights for publication).
//!
//! ## Weight sync
//! - Broadcast 15.2 GB from the trainer to every inference worker, pipelined (NCCL), at an
//!   assumed **20 GB/s** effective per link (a 400 Gb/s InfiniBand NIC is 50 GB/s raw;
//!   cross-node broadcast rarely keeps more than half): 0.76 s, plus **0.5 s** to pause,
//!   load and resume, plus **2 ms** per worker for the tree's extra hops and per-engine
//!   bookkeeping.
//!
//! ## Assumptions, stated
//! - One inference worker = one GPU (a 7 B model fits; data parallel beats tensor parallel
//!   for throughput at this size).
//! - `max_running` 128 per worker: KV memory bounds it. About 60 GB stay free after the
//!   weights, 60 GB / 57 KiB ≈ 1 M tokens of cache, and RLVR responses run to 8 k tokens,
//!   so 128 sequences fit at their longest (vLLM's default `max_num_seqs` is 256).
//! - No prefix caching, no speculative decoding, no chunked-prefill interference.

use crate::config::{Batching, ClusterConfig, InferenceCost, SyncCost, TrainCost};

/// The decode/prefill cost of one H800 (or H100) GPU serving a 7–8 B model. See the module
/// docs for the derivation.
pub fn h800_7b_inference() -> InferenceCost {
    InferenceCost {
        step_s: 7.5e-3,
        seq_s: 20e-6,
        context_token_s: 25e-9,
        prefill_token_s: 26e-6,
    }
}

/// The training cost of a 7–8 B model per H800 GPU.
pub fn h800_7b_training() -> TrainCost {
    TrainCost {
        step_s: 2.0,
        token_s: 154e-6,
        parallel_efficiency: 0.9,
        first_step_s: 0.0,
    }
}

/// The weight broadcast of a 7–8 B model in BF16.
pub fn h800_7b_sync() -> SyncCost {
    SyncCost {
        fixed_s: 0.5 + 15.2 / 20.0,
        worker_s: 2e-3,
    }
}

/// A cluster of `rollout_gpus` one-GPU inference workers and `train_gpus` training GPUs.
pub fn cluster(rollout_gpus: usize, train_gpus: usize) -> ClusterConfig {
    ClusterConfig {
        inference_workers: rollout_gpus.max(1),
        max_running: 128,
        batching: Batching::Continuous,
        routing: rollflash_core::proxy::Routing::LeastLoaded,
        train_workers: train_gpus.max(1),
        contention: Default::default(),
    }
}
