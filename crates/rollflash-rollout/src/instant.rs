//! `InstantBackend`: a backend that does no compute. It measures the control plane (proxy
//! overhead without model time) and lets tests script backend behaviour exactly: hold
//! requests until released, fail on demand, answer after a delay.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use rollflash_core::{FinishReason, GenOutput, GenRequest, Generated, PolicyVersion, RequestId};
use tokio::sync::watch;

use crate::backend::{Backend, BackendError, BackendLoad, PauseMode, WeightUpdate};

/// A no-compute backend. Each request "generates" `max_new_tokens` tokens (token `i` is
/// `(prompt length + i) % 50 + 5`, log-prob −1) — minus any resumed part — and stops with
/// `Length`.
pub struct InstantBackend {
    name: String,
    /// Sleep this long per request before answering (None: answer at once).
    delay: Option<Duration>,
    state: Mutex<State>,
    /// When true, requests wait (holding their slot) until `release` or an abort.
    held: watch::Sender<bool>,
    failing: AtomicBool,
    /// When true, only `update_weights` fails (a sync that breaks on one server).
    failing_updates: AtomicBool,
}

#[derive(Default)]
struct State {
    version: PolicyVersion,
    paused: bool,
    running: usize,
    /// Abort signals of requests in flight.
    aborts: HashMap<RequestId, watch::Sender<bool>>,
    served: u64,
}

impl std::fmt::Debug for InstantBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstantBackend")
            .field("name", &self.name)
            .finish()
    }
}

impl InstantBackend {
    /// A backend that answers at once.
    pub fn new(name: impl Into<String>) -> Self {
        InstantBackend {
            name: name.into(),
            delay: None,
            state: Mutex::new(State::default()),
            held: watch::Sender::new(false),
            failing: AtomicBool::new(false),
            failing_updates: AtomicBool::new(false),
        }
    }

    /// A backend that answers each request after `delay`.
    pub fn with_delay(name: impl Into<String>, delay: Duration) -> Self {
        InstantBackend {
            delay: Some(delay),
            ..InstantBackend::new(name)
        }
    }

    /// From now on, requests wait until [`InstantBackend::release`] (or an abort).
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Lets held requests (and later ones) finish.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// Makes every call fail as unavailable (as a dead server would), or heals it.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Makes `update_weights` fail (everything else keeps working), or heals it.
    pub fn set_failing_updates(&self, failing: bool) {
        self.failing_updates.store(failing, Ordering::SeqCst);
    }

    /// Forgets its weights as a restarted server would: back to version 0, without telling
    /// anyone.
    pub fn lose_weights(&self) {
        self.lock().version = PolicyVersion::default();
    }

    /// The version of the weights it holds.
    pub fn version(&self) -> PolicyVersion {
        self.lock().version
    }

    /// Requests answered successfully so far.
    pub fn served(&self) -> u64 {
        self.lock().served
    }

    /// Requests in flight now.
    pub fn running(&self) -> usize {
        self.lock().running
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn check_up(&self) -> Result<(), BackendError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(BackendError::Unavailable {
                backend: self.name.clone(),
                reason: "injected failure".into(),
                source: None,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Backend for InstantBackend {
    fn name(&self) -> &str {
        &self.name
    }

    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        self.check_up()?;
        if req.prompt.is_empty() {
            return Err(BackendError::InvalidRequest {
                reason: format!("{}: empty prompt", req.id),
                source: None,
            });
        }
        let (abort_tx, mut abort_rx) = watch::channel(false);
        {
            let mut st = self.lock();
            st.running += 1;
            st.aborts.insert(req.id, abort_tx);
        }
        let mut held = self.held.subscribe();
        let aborted = async {
            let _ = abort_rx.wait_for(|a| *a).await;
        };
        let work = async {
            if let Some(d) = self.delay {
                tokio::time::sleep(d).await;
            }
            let _ = held.wait_for(|h| !*h).await;
        };
        let was_aborted = tokio::select! {
            _ = aborted => true,
            _ = work => false,
        };
        let mut st = self.lock();
        st.running -= 1;
        st.aborts.remove(&req.id);
        if self.failing.load(Ordering::SeqCst) {
            return Err(BackendError::Unavailable {
                backend: self.name.clone(),
                reason: "injected failure".into(),
                source: None,
            });
        }
        let mut output = req.resume.clone().unwrap_or_default();
        let finish_reason = if was_aborted {
            FinishReason::Aborted
        } else {
            let base = req.prompt.len();
            while output.len() < req.params.max_new_tokens {
                let i = output.len();
                output.tokens.push(((base + i) % 50 + 5) as u32);
                output.logprobs.push(-1.0);
                output.versions.push(st.version);
            }
            st.served += 1;
            FinishReason::Length
        };
        Ok(GenOutput {
            id: req.id,
            prompt_len: req.prompt.len(),
            output: Generated { ..output },
            finish_reason,
            start_version: req.start_version,
            served_by: Vec::new(),
        })
    }

    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        if let Some(tx) = self.lock().aborts.get(&id) {
            tx.send_replace(true);
        }
        Ok(())
    }

    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        self.check_up()?;
        let mut st = self.lock();
        st.paused = true;
        if mode == PauseMode::Abort {
            for tx in st.aborts.values() {
                tx.send_replace(true);
            }
        }
        Ok(())
    }

    async fn resume(&self) -> Result<(), BackendError> {
        self.check_up()?;
        self.lock().paused = false;
        Ok(())
    }

    async fn update_weights(&self, update: &WeightUpdate) -> Result<(), BackendError> {
        self.check_up()?;
        if self.failing_updates.load(Ordering::SeqCst) {
            return Err(BackendError::Unavailable {
                backend: self.name.clone(),
                reason: "injected weight update failure".into(),
                source: None,
            });
        }
        self.lock().version = update.version();
        Ok(())
    }

    async fn load(&self) -> Result<BackendLoad, BackendError> {
        self.check_up()?;
        let st = self.lock();
        Ok(BackendLoad {
            running: st.running,
            waiting: 0,
            version: st.version,
        })
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.check_up()
    }
}
