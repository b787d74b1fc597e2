//! The embedded engine as a `Backend`: one worker thread owning one `Engine`, driven by a
//! closed command enum. Several workers (each its own `EngineBackend`, each with its own
//! thread budget) sit behind the proxy like any other backends.

use std::collections::HashMap;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use async_trait::async_trait;
use rollflash_core::{FinishReason, GenOutput, GenRequest, Generated, PolicyVersion, RequestId};
use rollflash_model::engine::{Completion, Engine, EngineConfig, EngineRequest};
use rollflash_model::model::Transformer;
use tokio::sync::oneshot;

use crate::backend::{Backend, BackendError, BackendLoad, PauseMode, TokenScore, WeightUpdate};

/// Settings of one engine worker.
#[derive(Debug, Clone)]
pub struct EngineBackendConfig {
    /// Name in logs and metrics.
    pub name: String,
    /// Batch size, prefill budget and CPU threads of this worker.
    pub engine: EngineConfig,
}

type Reply = oneshot::Sender<Result<GenOutput, BackendError>>;
/// Where a streamed request's new tokens go.
type Stream = tokio::sync::mpsc::UnboundedSender<Generated>;

/// Messages to the worker thread. Each state change is acknowledged so callers know when it
/// took effect (a pause that returned has stopped generation).
enum Command {
    Submit(Box<GenRequest>, Reply, Option<Stream>),
    Abort(RequestId),
    Pause(PauseMode, oneshot::Sender<()>),
    Resume(oneshot::Sender<()>),
    SetWeights(Arc<Transformer>, PolicyVersion, oneshot::Sender<()>),
    Load(oneshot::Sender<BackendLoad>),
}

/// One embedded engine worker.
pub struct EngineBackend {
    name: String,
    tx: std_mpsc::Sender<Command>,
    /// The model now served, to load disk checkpoints onto the same device and dtype.
    current: std::sync::Mutex<Arc<Transformer>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for EngineBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBackend")
            .field("name", &self.name)
            .finish()
    }
}

impl EngineBackend {
    /// Starts a worker serving `model` as `version`.
    pub fn start(
        model: Arc<Transformer>,
        version: PolicyVersion,
        cfg: EngineBackendConfig,
    ) -> Result<Self, BackendError> {
        let engine = Engine::new(Arc::clone(&model), version, cfg.engine.clone())?;
        let (tx, rx) = std_mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("{}-worker", cfg.name))
            .spawn(move || Worker::new(engine).run(rx))
            .map_err(|e| BackendError::Unavailable {
                backend: cfg.name.clone(),
                reason: "cannot spawn worker thread".into(),
                source: Some(Box::new(e)),
            })?;
        Ok(EngineBackend {
            name: cfg.name,
            tx,
            current: std::sync::Mutex::new(model),
            thread: Some(thread),
        })
    }

    /// The model now served (shared, not copied).
    pub fn model(&self) -> Arc<Transformer> {
        match self.current.lock() {
            Ok(g) => Arc::clone(&g),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    fn send(&self, cmd: Command) -> Result<(), BackendError> {
        self.tx
            .send(cmd)
            .map_err(|_| BackendError::Shutdown(self.name.clone()))
    }

    async fn ack<T>(&self, rx: oneshot::Receiver<T>) -> Result<T, BackendError> {
        rx.await
            .map_err(|_| BackendError::Shutdown(self.name.clone()))
    }
}

impl Drop for EngineBackend {
    fn drop(&mut self) {
        // Closing the channel stops the worker after its current step; joining would block
        // an async caller, so the thread is detached and exits on its own.
        drop(self.thread.take());
    }
}

#[async_trait]
impl Backend for EngineBackend {
    fn name(&self) -> &str {
        &self.name
    }

    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Submit(Box::new(req), tx, None))?;
        self.ack(rx).await?
    }

    async fn generate_stream(
        &self,
        req: GenRequest,
        tokens: Stream,
    ) -> Result<GenOutput, BackendError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Submit(Box::new(req), tx, Some(tokens)))?;
        self.ack(rx).await?
    }

    async fn score(
        &self,
        tokens: &[u32],
        temperature: f64,
        top: usize,
    ) -> Result<Vec<TokenScore>, BackendError> {
        if !(temperature > 0.0) || tokens.is_empty() {
            return Err(BackendError::InvalidRequest {
                reason: format!(
                    "scoring needs tokens and a positive temperature, got {} tokens at {temperature}",
                    tokens.len()
                ),
                source: None,
            });
        }
        let model = match self.current.lock() {
            Ok(g) => Arc::clone(&g),
            Err(p) => Arc::clone(&p.into_inner()),
        };
        let tokens = tokens.to_vec();
        // A full forward: off the async runtime and off the worker.
        tokio::task::spawn_blocking(move || score_rows(&model, &tokens, temperature, top))
            .await
            .map_err(|e| BackendError::Unavailable {
                backend: self.name.clone(),
                reason: "scoring task failed".into(),
                source: Some(Box::new(e)),
            })?
    }

    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        self.send(Command::Abort(id))
    }

    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Pause(mode, tx))?;
        self.ack(rx).await
    }

    async fn resume(&self) -> Result<(), BackendError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Resume(tx))?;
        self.ack(rx).await
    }

    async fn update_weights(&self, update: &WeightUpdate) -> Result<(), BackendError> {
        let (model, version) = match update {
            WeightUpdate::InProcess { model, version } => (Arc::clone(model), *version),
            WeightUpdate::Disk { path, version } => {
                let current = match self.current.lock() {
                    Ok(g) => Arc::clone(&g),
                    Err(p) => Arc::clone(&p.into_inner()),
                };
                let path = path.clone();
                // Loading reads and converts every tensor: keep it off the async runtime
                // and off the worker, which goes on generating meanwhile.
                let loaded = tokio::task::spawn_blocking(move || {
                    rollflash_model::hf::load_dir(&path, current.dtype(), current.device())
                })
                .await
                .map_err(|e| BackendError::Unavailable {
                    backend: self.name.clone(),
                    reason: "weight loading task failed".into(),
                    source: Some(Box::new(e)),
                })??;
                (Arc::new(loaded.model), *version)
            }
            WeightUpdate::Adapter { dir, version, .. } => {
                let current = match self.current.lock() {
                    Ok(g) => Arc::clone(&g),
                    Err(p) => Arc::clone(&p.into_inner()),
                };
                let dir = dir.clone();
                // The adapter replaces any the engine has: it applies to the frozen base.
                let adapted = tokio::task::spawn_blocking(move || adapted_model(&current, &dir))
                    .await
                    .map_err(|e| BackendError::Unavailable {
                        backend: self.name.clone(),
                        reason: "adapter loading task failed".into(),
                        source: Some(Box::new(e)),
                    })??;
                (Arc::new(adapted), *version)
            }
            WeightUpdate::Remote { uri, .. } => {
                return Err(BackendError::InvalidRequest {
                    reason: format!(
                        "weights {uri} live on a remote trainer; an embedded engine loads \
                         weights in process or from a directory"
                    ),
                    source: None,
                })
            }
        };
        match self.current.lock() {
            Ok(mut g) => *g = Arc::clone(&model),
            Err(p) => *p.into_inner() = Arc::clone(&model),
        }
        let (tx, rx) = oneshot::channel();
        self.send(Command::SetWeights(model, version, tx))?;
        self.ack(rx).await
    }

    async fn load(&self) -> Result<BackendLoad, BackendError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Load(tx))?;
        self.ack(rx).await
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.load().await.map(|_| ())
    }
}

/// `log_softmax(logits / temperature)` of `model` over `tokens`: the token's log-prob and the
/// `top` best alternatives for every position after the first.
fn score_rows(
    model: &Transformer,
    tokens: &[u32],
    temperature: f64,
    top: usize,
) -> Result<Vec<TokenScore>, BackendError> {
    let logits = model.forward_logits(tokens)?;
    let rows: Vec<Vec<f32>> = logits
        .to_dtype(candle_core::DType::F32)
        .and_then(|t| t.to_vec2())
        .map_err(rollflash_model::ModelError::from)?;
    let mut out = Vec::with_capacity(tokens.len().saturating_sub(1));
    for (row, &next) in rows.iter().zip(&tokens[1..]) {
        let scaled: Vec<f64> = row.iter().map(|&x| f64::from(x) / temperature).collect();
        let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + scaled.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        let lp = |i: usize| (scaled[i] - lse) as f32;
        let mut best: Vec<usize> = (0..scaled.len()).collect();
        let k = top.min(best.len());
        if k > 0 {
            best.select_nth_unstable_by(k - 1, |&a, &b| scaled[b].total_cmp(&scaled[a]));
            best.truncate(k);
            best.sort_by(|&a, &b| scaled[b].total_cmp(&scaled[a]).then(a.cmp(&b)));
        } else {
            best.clear();
        }
        out.push(TokenScore {
            logprob: scaled
                .get(next as usize)
                .map_or(f32::NEG_INFINITY, |_| lp(next as usize)),
            top: best.into_iter().map(|i| (i as u32, lp(i))).collect(),
        });
    }
    Ok(out)
}

/// The worker thread's state: the engine and who is waiting for which request.
struct Worker {
    engine: Engine,
    replies: HashMap<RequestId, (Reply, PolicyVersion)>,
    /// Streamed requests: where their tokens go and how many were sent (resumed ones count).
    streams: HashMap<RequestId, (Stream, usize)>,
    paused: bool,
}

impl Worker {
    fn new(engine: Engine) -> Self {
        Worker {
            engine,
            replies: HashMap::new(),
            streams: HashMap::new(),
            paused: false,
        }
    }

    /// Sends streamed requests the tokens sampled since the last send.
    fn stream_tokens(&mut self, sampled: &[(RequestId, u32)]) {
        for (id, _) in sampled {
            let Some((tx, sent)) = self.streams.get_mut(id) else {
                continue;
            };
            let Some(out) = self.engine.partial_output(*id) else {
                continue;
            };
            if out.len() > *sent {
                let chunk = Generated {
                    tokens: out.tokens[*sent..].to_vec(),
                    logprobs: out.logprobs[*sent..].to_vec(),
                    versions: out.versions[*sent..].to_vec(),
                };
                *sent = out.len();
                // A receiver that went away only stops the stream, not the generation.
                let _ = tx.send(chunk);
            }
        }
    }

    fn run(mut self, rx: std_mpsc::Receiver<Command>) {
        loop {
            // Block for a command only when there is nothing to generate; otherwise take
            // what has arrived and go on stepping.
            let busy = !self.paused && !self.engine.is_idle();
            if busy {
                loop {
                    match rx.try_recv() {
                        Ok(cmd) => self.handle(cmd),
                        Err(std_mpsc::TryRecvError::Empty) => break,
                        Err(std_mpsc::TryRecvError::Disconnected) => return self.shutdown(),
                    }
                }
            } else {
                match rx.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => return self.shutdown(),
                }
                continue;
            }
            if self.paused || self.engine.is_idle() {
                continue;
            }
            match self.engine.step() {
                Ok(out) => {
                    if !self.streams.is_empty() {
                        self.stream_tokens(&out.new_tokens);
                    }
                    for c in out.finished {
                        self.finish(c);
                    }
                }
                Err(e) => {
                    // The step failed as a whole: every request in it fails, the worker stays.
                    // They share the one error.
                    let e = Arc::new(e);
                    for c in self.engine.abort_all() {
                        self.streams.remove(&c.id);
                        if let Some((reply, _)) = self.replies.remove(&c.id) {
                            let _ = reply.send(Err(BackendError::InvalidRequest {
                                reason: "engine step failed".into(),
                                source: Some(Box::new(Arc::clone(&e))),
                            }));
                        }
                    }
                }
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(req, reply, stream) => {
                let req = *req;
                let id = req.id;
                if self.replies.contains_key(&id) {
                    let _ = reply.send(Err(BackendError::InvalidRequest {
                        reason: format!("{id} is already running on this backend"),
                        source: None,
                    }));
                    return;
                }
                let start = req.start_version;
                let resumed = req.resumed_len();
                let er = EngineRequest {
                    id,
                    prompt: req.prompt,
                    params: req.params,
                    resume: req.resume,
                };
                match self.engine.submit(er) {
                    Ok(()) => {
                        self.replies.insert(id, (reply, start));
                        if let Some(tx) = stream {
                            self.streams.insert(id, (tx, resumed));
                        }
                    }
                    Err(e) => {
                        let _ = reply.send(Err(BackendError::InvalidRequest {
                            reason: "the engine refused it".into(),
                            source: Some(Box::new(e)),
                        }));
                    }
                }
            }
            Command::Abort(id) => {
                if let Some(c) = self.engine.abort(id) {
                    self.finish(c);
                }
            }
            Command::Pause(mode, ack) => {
                self.paused = true;
                if mode == PauseMode::Abort {
                    for c in self.engine.abort_all() {
                        self.finish(c);
                    }
                }
                let _ = ack.send(());
            }
            Command::Resume(ack) => {
                self.paused = false;
                let _ = ack.send(());
            }
            Command::SetWeights(model, version, ack) => {
                self.engine.set_weights(model, version);
                let _ = ack.send(());
            }
            Command::Load(reply) => {
                let _ = reply.send(BackendLoad {
                    running: self.engine.num_running(),
                    waiting: self.engine.num_waiting(),
                    version: self.engine.version(),
                });
            }
        }
    }

    fn finish(&mut self, c: Completion) {
        self.streams.remove(&c.id);
        if let Some((reply, start_version)) = self.replies.remove(&c.id) {
            let _ = reply.send(Ok(GenOutput {
                id: c.id,
                prompt_len: c.prompt_len,
                output: c.output,
                finish_reason: c.finish_reason,
                start_version,
                served_by: Vec::new(),
            }));
        }
    }

    fn shutdown(mut self) {
        for c in self.engine.abort_all() {
            debug_assert_eq!(c.finish_reason, FinishReason::Aborted);
            self.finish(c);
        }
    }
}

/// The [`AdapterHost`](crate::server::AdapterHost) of `rollflash serve`: each adapter gets
/// an engine of its own on [`adapted_model`] of the base engine's current weights (the base
/// tensors are shared, not copied).
pub struct EngineAdapterHost {
    base: Arc<EngineBackend>,
    cfg: EngineBackendConfig,
    /// Serves the base model and ignores the adapter: a server that drops adapters
    /// silently, for the tests of the adapter probe. Never set otherwise.
    pub ignore_adapters: bool,
}

impl EngineAdapterHost {
    /// Adapter engines configured as `cfg` (each named `<name>-lora`).
    pub fn new(base: Arc<EngineBackend>, cfg: EngineBackendConfig) -> Self {
        EngineAdapterHost {
            base,
            cfg,
            ignore_adapters: false,
        }
    }
}

#[async_trait]
impl crate::server::AdapterHost for EngineAdapterHost {
    async fn open(
        &self,
        dir: &std::path::Path,
        version: PolicyVersion,
    ) -> Result<Arc<dyn Backend>, BackendError> {
        let base = self.base.model();
        let (dir, ignore) = (dir.to_path_buf(), self.ignore_adapters);
        let model = tokio::task::spawn_blocking(move || {
            let adapted = adapted_model(&base, &dir)?;
            // The stand-in still reads the adapter (so a bad one fails alike), then drops it.
            Ok::<_, rollflash_model::ModelError>(if ignore {
                Transformer::from_weights(
                    base.config(),
                    &base.weights(),
                    base.dtype(),
                    base.device(),
                )?
            } else {
                adapted
            })
        })
        .await
        .map_err(|e| BackendError::Unavailable {
            backend: self.cfg.name.clone(),
            reason: "adapter loading task failed".into(),
            source: Some(Box::new(e)),
        })??;
        let cfg = EngineBackendConfig {
            name: format!("{}-lora", self.cfg.name),
            engine: self.cfg.engine.clone(),
        };
        Ok(Arc::new(EngineBackend::start(
            Arc::new(model),
            version,
            cfg,
        )?))
    }
}

/// `model`'s base weights (without any adapters it has) with the PEFT LoRA adapter in `dir`
/// applied unmerged, in `model`'s dtype and on its device: what a server serving that
/// adapter computes.
pub fn adapted_model(
    model: &Transformer,
    dir: &std::path::Path,
) -> Result<Transformer, rollflash_model::ModelError> {
    let adapters = rollflash_model::lora::load_peft(dir, model.device())?;
    Transformer::with_adapters(
        model.config(),
        &model.weights(),
        &adapters,
        model.dtype(),
        model.device(),
    )
}
