//! A client for the Tinker training protocol: the HTTP API that hosted Tinker and open
//! servers over existing trainers (SkyRL, TuFT, VeRL-Tinker) speak. It owns the protocol and
//! nothing else — no learner, no plan: sessions, LoRA models, `forward_backward` with the
//! server's built-in losses, `optim_step`, saved weights and training state, sampling
//! sessions and `asample`, each as a typed async call that waits for its future.
//!
//! The dialect is the tinker SDK 0.25's, as SkyRL 0.4.0 serves it: JSON for most calls, a
//! protobuf `forward_backward` body, protobuf results of forward/forward_backward/sample
//! (`proto.rs`); see `../shared/TINKER.md` for the wire captures.
//!
//! `local.rs` starts a real SkyRL server on this machine for tests (the one part that is not
//! the protocol: it runs the project's scripts).
//!
//! ```no_run
//! # async fn demo() -> Result<(), rollflash_tinker::TinkerError> {
//! use rollflash_tinker::{AdamParams, ClientConfig, Datum, LoraConfig, TinkerClient};
//! let client = TinkerClient::new(ClientConfig::new("http://127.0.0.1:8785"))?;
//! let session = client.create_session(vec![]).await?;
//! let model = client.create_model(&session, 0, "base", LoraConfig::new(8, Some(0))).await?;
//! let datum = Datum::cross_entropy(vec![1, 5, 6], vec![5, 6, 2], vec![0.0, 1.0, 1.0]);
//! let out = client.forward_backward(&model.model_id, 1, &[datum], "cross_entropy", &[]).await?;
//! let metrics = client.optim_step(&model.model_id, 2, AdamParams::with_lr(1e-3)).await?;
//! # let _ = (out, metrics); Ok(()) }
//! ```

pub mod archive;
pub mod client;
pub mod datum;
pub mod heartbeat;
pub mod local;
pub mod proto;
pub mod types;

pub use archive::{unpack_adapter, ArchiveError, SamplerPath};
pub use client::{
    ClientConfig, DecodeError, RetryPolicy, SamplerSource, TinkerClient, TinkerError, Traffic,
};
pub use datum::{Datum, DatumOutput, ForwardOutput, LossInput, SampleOutput, Sequence, StopReason};
pub use heartbeat::{Heartbeat, HeartbeatReport};
pub use local::{LocalServer, LocalServerError};
pub use types::{AdamParams, LoraConfig, SamplingParams};
