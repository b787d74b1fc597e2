//! Training checkpoints: every `[checkpoint] every` steps, `output_dir/checkpoints/step-N/`
//! holds the weights in Hugging Face layout (`config.json`, `model.safetensors`, the
//! tokenizer), the AdamW state (`optimizer.safetensors`: first and second moments), and
//! `state.json` (the [`Cursor`]: steps done, policy version, next task seed; the sample
//! accounting; the optimizer's step count, i.e. the learning-rate schedule's position;
//! the evaluation before RL; for a dataset task, the data cursor: files, shuffle seed, epoch,
//! next row; with `running` reward normalisation, ROLL's running reward statistics), plus `metrics.jsonl` up to that step, and last `checksums.json`: the size and
//! SHA-256 of every other file. A checkpoint is written to a temporary directory, flushed to
//! disk (`fsync` of each file and of the directory) and renamed into place, so a crash or a
//! `kill -9` never leaves a half-written `step-N`; only the newest `keep` are kept. Reading
//! one checks every file against `checksums.json` first: a truncated or altered file is
//! refused by name, and [`load_latest`] falls back to the newest checkpoint that is intact.
//!
//! A LoRA run's checkpoint holds the frozen base as its weights and the adapter beside them
//! in PEFT's layout (`adapter_config.json`, naming the checkpoint directory itself as the
//! base, and `adapter_model.safetensors`): the directory is a Hugging Face model plus a PEFT
//! adapter, `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(d), d)`, and the
//! AdamW moments cover the adapters only.
//!
//! A run whose learner is a Tinker server holds no weights of its own: its checkpoint has the
//! same `state.json`, `metrics.jsonl` and `checksums.json`, and `tinker.json` instead of the
//! tensors — the server, the trained model's id and the `tinker://` path of the state (LoRA
//! weights and Adam moments) that the learner saved there at that step ([`TinkerSaved`]); a
//! resumed run loads it into a fresh model on the server (`load_state`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::Device;
use rollflash_core::buffer::Accounting;
use rollflash_env::envs::dataset_task::DataCursor;
use rollflash_model::config::ModelConfig;
use rollflash_model::lora::Adapters;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::{AdamW, OptimizerConfig};
use rollflash_model::weights::Weights;
use rollflash_train::RunningMoments;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::eval::EvalResult;
use rollflash_core::IoError;
use rollflash_trainer::learner::PolicyLearner;
use rollflash_trainer::Cursor;

/// A checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("checkpoint {path}")]
    Model {
        path: PathBuf,
        #[source]
        source: rollflash_model::ModelError,
    },
    #[error("checkpoint {path}: state.json")]
    State {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("no checkpoint under {0} (write some with `--set checkpoint.every=K`)")]
    NoneFound(PathBuf),
    /// A file of the checkpoint is not what was written: missing, truncated, altered.
    #[error("checkpoint file {}: {reason}", file.display())]
    Corrupt { file: PathBuf, reason: String },
    /// Every checkpoint under the root was refused; each reason is listed.
    #[error("no usable checkpoint under {}: {}", root.display(), refused.join("; "))]
    NoneUsable { root: PathBuf, refused: Vec<String> },
    /// The checkpoint was written by another kind of learner than the run's.
    #[error("checkpoint {}: {reason}", dir.display())]
    OtherLearner { dir: PathBuf, reason: String },
}

/// `state.json`: everything besides tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Bumped when the layout changes.
    pub format: u32,
    pub cursor: Cursor,
    pub accounting: Accounting,
    /// AdamW steps taken: the bias corrections and the learning-rate schedule continue
    /// from here.
    pub optimizer_step: usize,
    /// The run's seed (resuming under a different seed would not continue the same run).
    pub seed: u64,
    /// Wall time of the run up to this checkpoint, so resumed metrics continue its axis.
    pub elapsed_s: f64,
    /// The held-out evaluation after the warm-up, for the final report.
    pub eval_before: Option<EvalResult>,
    /// Where a dataset task is in its data (files, shuffle seed, epoch, next row); absent for
    /// generated tasks and in checkpoints written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataCursor>,
    /// The learner's running reward statistics (ROLL's `RunningMoments`) when
    /// `train.shaping` normalises by `running`, so a resumed run normalises its next batch
    /// exactly as the uninterrupted run would. Absent otherwise and in checkpoints written
    /// before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_running: Option<SavedRunning>,
}

/// Running reward statistics as `state.json` keeps them. What is read back are the IEEE-754
/// bits of each f64: serde_json's default parser turns a decimal into the nearest f64 only
/// approximately (one ULP off at times), and a resumed run must continue bit-identically.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SavedRunning {
    /// Readable copies of the running mean and count (not read back).
    pub mean: f64,
    pub count: f64,
    /// Batches merged so far.
    pub batches: u64,
    /// `mean`, `var` (biased) and `count`, as `f64::to_bits`.
    pub bits: [u64; 3],
}

impl From<RunningMoments> for SavedRunning {
    fn from(r: RunningMoments) -> Self {
        SavedRunning {
            mean: r.mean,
            count: r.count,
            batches: r.batches,
            bits: [r.mean.to_bits(), r.var.to_bits(), r.count.to_bits()],
        }
    }
}

impl SavedRunning {
    /// The statistics, exactly as they were saved.
    pub fn moments(&self) -> RunningMoments {
        let [mean, var, count] = self.bits.map(f64::from_bits);
        RunningMoments {
            mean,
            var,
            count,
            batches: self.batches,
        }
    }
}

impl CheckpointState {
    /// This state with the dataset's cursor.
    pub fn with_data(mut self, data: Option<DataCursor>) -> Self {
        self.data = data;
        self
    }

    /// This state with the learner's running reward statistics.
    pub fn with_running(mut self, running: Option<RunningMoments>) -> Self {
        self.reward_running = running.map(SavedRunning::from);
        self
    }
}

/// 2: `checksums.json` is written and required. Format 1 checkpoints (before checksums) are
/// still read, unverified.
const FORMAT: u32 = 2;
const STATE: &str = "state.json";
const CHECKSUMS: &str = "checksums.json";
const TMP_PREFIX: &str = ".tmp-step-";
const OPTIMIZER: &str = "optimizer.safetensors";
const TINKER: &str = "tinker.json";
const METRICS: &str = "metrics.jsonl";

/// The directory of step `n` under `root`. Zero-padded so names sort by step.
pub fn step_dir(root: &Path, n: usize) -> PathBuf {
    root.join(format!("step-{n:08}"))
}

/// Where a run keeps its checkpoints.
pub fn root(output_dir: &Path) -> PathBuf {
    output_dir.join("checkpoints")
}

/// The newest complete checkpoint under `root`.
pub fn latest(root: &Path) -> Result<PathBuf, CheckpointError> {
    list(root)?
        .pop()
        .map(|(_, p)| p)
        .ok_or_else(|| CheckpointError::NoneFound(root.to_path_buf()))
}

/// Complete checkpoints under `root`, oldest first.
fn list(root: &Path) -> Result<Vec<(usize, PathBuf)>, CheckpointError> {
    let rd = match std::fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CheckpointError::Io(IoError::new(
                "cannot list checkpoints in",
                root.to_path_buf(),
                source,
            )))
        }
    };
    let mut out: Vec<(usize, PathBuf)> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let n = name.strip_prefix("step-")?.parse().ok()?;
            // `state.json` is the last file written before the rename; its presence marks
            // a complete checkpoint.
            e.path().join(STATE).exists().then(|| (n, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// `tinker.json`: where a Tinker learner's state lives on its server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TinkerSaved {
    /// The server's URL when the state was saved.
    pub server: String,
    /// The trained model's id on that server.
    pub model_id: String,
    /// What `load_state` takes: `tinker://MODEL/weights/NAME`.
    pub state_path: String,
    /// Optimiser steps taken (the learning-rate schedule's position).
    pub optimizer_steps: usize,
}

/// What a checkpoint saves of the learner besides `state.json`.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// The embedded learner: weights (and adapters) in Hugging Face/PEFT layout, and its
    /// AdamW moments.
    Embedded(&'a PolicyLearner),
    /// A Tinker learner: where its state was saved on the server.
    Tinker(&'a TinkerSaved),
}

/// Writes checkpoints of one run.
#[derive(Debug)]
pub struct Checkpointer {
    root: PathBuf,
    keep: usize,
    model_cfg: ModelConfig,
    tokenizer: std::sync::Arc<Tokenizer>,
}

impl Checkpointer {
    /// Checkpoints under `root`, keeping the newest `keep`.
    pub fn new(
        root: PathBuf,
        keep: usize,
        model_cfg: ModelConfig,
        tokenizer: std::sync::Arc<Tokenizer>,
    ) -> Self {
        Checkpointer {
            root,
            keep: keep.max(1),
            model_cfg,
            tokenizer,
        }
    }

    /// The folder checkpoints are written under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes the checkpoint of `state.cursor.steps_done` atomically (temporary directory,
    /// then rename), copies `metrics` into it, and prunes old ones. Returns its path.
    pub fn save(
        &self,
        learner: Payload<'_>,
        state: &CheckpointState,
        metrics: &Path,
    ) -> Result<PathBuf, CheckpointError> {
        let n = state.cursor.steps_done;
        let dir = step_dir(&self.root, n);
        let tmp = self.root.join(format!("{TMP_PREFIX}{n:08}"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(IoError::at("cannot clear", &tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(IoError::at("cannot create", &tmp))?;
        // A failed write (a full disk) leaves no temporary directory behind; what exists is
        // untouched.
        if let Err(e) = self.write_files(&tmp, &dir, learner, state, metrics) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(IoError::at("cannot replace", &dir))?;
        }
        std::fs::rename(&tmp, &dir).map_err(IoError::at("cannot rename into", &dir))?;
        // The rename itself reaches the disk only with the parent directory.
        sync_dir(&self.root).map_err(IoError::at("cannot flush", &self.root))?;
        let all = list(&self.root)?;
        for (_, old) in all.iter().take(all.len().saturating_sub(self.keep)) {
            std::fs::remove_dir_all(old).map_err(IoError::at("cannot prune", old))?;
        }
        Ok(dir)
    }

    /// Every file of a checkpoint into `tmp`, `checksums.json` last, all flushed to disk.
    fn write_files(
        &self,
        tmp: &Path,
        dir: &Path,
        learner: Payload<'_>,
        state: &CheckpointState,
        metrics: &Path,
    ) -> Result<(), CheckpointError> {
        let model = |source| CheckpointError::Model {
            path: tmp.to_path_buf(),
            source,
        };
        match learner {
            Payload::Embedded(learner) => {
                rollflash_model::hf::save_dir(
                    tmp,
                    &self.model_cfg,
                    &learner.model().weights(),
                    Some(&self.tokenizer),
                )
                .map_err(model)?;
                if let Some(adapters) = learner.model().adapters() {
                    // The base is this directory's own weights, under the name it will have.
                    let base =
                        std::path::absolute(dir).map_err(IoError::at("cannot resolve", dir))?;
                    rollflash_model::lora::save_peft(tmp, adapters, &base.to_string_lossy())
                        .map_err(model)?;
                }
                let (_, moments) = learner.optimizer().state().map_err(model)?;
                moments
                    .save_safetensors(&tmp.join(OPTIMIZER))
                    .map_err(model)?;
            }
            Payload::Tinker(saved) => {
                let text = serde_json::to_string_pretty(saved).map_err(|source| {
                    CheckpointError::State {
                        path: tmp.to_path_buf(),
                        source,
                    }
                })?;
                std::fs::write(tmp.join(TINKER), text).map_err(IoError::at("cannot write", tmp))?;
            }
        }
        std::fs::copy(metrics, tmp.join(METRICS)).map_err(IoError::at("cannot copy", metrics))?;
        let text =
            serde_json::to_string_pretty(state).map_err(|source| CheckpointError::State {
                path: tmp.to_path_buf(),
                source,
            })?;
        std::fs::write(tmp.join(STATE), text).map_err(IoError::at("cannot write", tmp))?;
        let sums = Checksums::of_dir(tmp, true)?;
        let text =
            serde_json::to_string_pretty(&sums).map_err(|source| CheckpointError::State {
                path: tmp.to_path_buf(),
                source,
            })?;
        let path = tmp.join(CHECKSUMS);
        write_synced(&path, text.as_bytes()).map_err(IoError::at("cannot write", &path))?;
        sync_dir(tmp).map_err(IoError::at("cannot flush", tmp))?;
        Ok(())
    }
}

/// `checksums.json`: the size and SHA-256 (lower-case hex) of every other file of a
/// checkpoint, by file name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checksums {
    /// Always `sha256`.
    pub algorithm: String,
    pub files: BTreeMap<String, FileSum>,
}

/// One file's size and digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSum {
    pub bytes: u64,
    pub sha256: String,
}

impl Checksums {
    /// The sums of every file in `dir` except `checksums.json`; with `flush`, each file is
    /// also flushed to disk through the handle that read it.
    pub fn of_dir(dir: &Path, flush: bool) -> Result<Checksums, CheckpointError> {
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(dir).map_err(IoError::at("cannot list", dir))? {
            let entry = entry.map_err(IoError::at("cannot list", dir))?;
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if name == CHECKSUMS || !path.is_file() {
                continue;
            }
            let sum = file_sum(&path, flush).map_err(IoError::at("cannot read", &path))?;
            files.insert(name, sum);
        }
        Ok(Checksums {
            algorithm: "sha256".into(),
            files,
        })
    }
}

/// Size and SHA-256 of one file, read in 1 MiB pieces.
fn file_sum(path: &Path, flush: bool) -> std::io::Result<FileSum> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    if flush {
        f.sync_all()?;
    }
    let digest = hasher.finalize();
    let sha256 = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(FileSum { bytes, sha256 })
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Flushes a directory's entries (a rename or a new file in it) to disk.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Checks every file of the checkpoint in `dir` against its `checksums.json`. Returns
/// whether it was verified: `false` only for a format-1 checkpoint, written before
/// checksums existed. A missing, truncated or altered file is refused by name.
pub fn verify(dir: &Path) -> Result<bool, CheckpointError> {
    let sums_path = dir.join(CHECKSUMS);
    let corrupt = |file: PathBuf, reason: String| CheckpointError::Corrupt { file, reason };
    let text = match std::fs::read_to_string(&sums_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Only a checkpoint from before checksums may lack them.
            let state = read_state(dir)?;
            if state.format >= 2 {
                return Err(corrupt(
                    sums_path,
                    "missing (every checkpoint of this format has one)".into(),
                ));
            }
            return Ok(false);
        }
        Err(source) => {
            return Err(CheckpointError::Io(IoError::new(
                "cannot read",
                sums_path,
                source,
            )))
        }
    };
    let sums: Checksums = serde_json::from_str(&text)
        .map_err(|e| corrupt(sums_path.clone(), format!("unreadable: {e}")))?;
    if sums.algorithm != "sha256" {
        return Err(corrupt(
            sums_path,
            format!("algorithm `{}` (this build checks sha256)", sums.algorithm),
        ));
    }
    for (name, want) in &sums.files {
        let path = dir.join(name);
        let got = match file_sum(&path, false) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt(path, "missing".into()))
            }
            Err(source) => {
                return Err(CheckpointError::Io(IoError::new(
                    "cannot read",
                    path,
                    source,
                )))
            }
        };
        if got.bytes != want.bytes {
            return Err(corrupt(
                path,
                format!(
                    "{} bytes, {} when written (truncated or overwritten)",
                    got.bytes, want.bytes
                ),
            ));
        }
        if got.sha256 != want.sha256 {
            return Err(corrupt(
                path,
                format!(
                    "contents differ from when written (sha256 {}, recorded {})",
                    got.sha256, want.sha256
                ),
            ));
        }
    }
    Ok(true)
}

/// A checkpoint [`load_latest`] passed over, and why.
#[derive(Debug)]
pub struct Refused {
    pub dir: PathBuf,
    pub error: CheckpointError,
}

/// The newest checkpoint under `root` that reads back intact, and the newer ones it passed
/// over (newest first), each with its error; the caller says so.
pub fn load_latest(
    root: &Path,
    device: &Device,
) -> Result<(Loaded, Vec<Refused>), CheckpointError> {
    let all = list(root)?;
    if all.is_empty() {
        return Err(CheckpointError::NoneFound(root.to_path_buf()));
    }
    let mut refused = Vec::new();
    for (_, dir) in all.into_iter().rev() {
        match load(&dir, device) {
            Ok(l) => return Ok((l, refused)),
            Err(error) => refused.push(Refused { dir, error }),
        }
    }
    Err(CheckpointError::NoneUsable {
        root: root.to_path_buf(),
        refused: refused
            .iter()
            .map(|r| format!("{}: {}", r.dir.display(), r.error))
            .collect(),
    })
}

/// Moves a refused checkpoint aside to `refused-step-N` (kept for inspection, no longer
/// listed), so a resumed run neither falls back to it again nor counts it when pruning.
pub fn set_aside(dir: &Path) -> Result<PathBuf, CheckpointError> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("step")
        .to_string();
    let parent = dir.parent().unwrap_or(Path::new("."));
    let mut to = parent.join(format!("refused-{name}"));
    let mut k = 1;
    while to.exists() {
        to = parent.join(format!("refused-{name}.{k}"));
        k += 1;
    }
    std::fs::rename(dir, &to).map_err(IoError::at("cannot set aside", dir))?;
    Ok(to)
}

/// Removes the temporary directories of checkpoints whose writing was cut short (a process
/// killed mid-write) and returns them.
pub fn clear_partial(root: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.filter_map(Result::ok) {
        let is_tmp = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(TMP_PREFIX));
        if is_tmp && std::fs::remove_dir_all(e.path()).is_ok() {
            out.push(e.path());
        }
    }
    out.sort();
    out
}

fn read_state(dir: &Path) -> Result<CheckpointState, CheckpointError> {
    let text = std::fs::read_to_string(dir.join(STATE))
        .map_err(IoError::at("cannot read", dir.join(STATE)))?;
    serde_json::from_str(&text).map_err(|source| CheckpointError::State {
        path: dir.to_path_buf(),
        source,
    })
}

/// A checkpoint read back.
#[derive(Debug)]
pub struct Loaded {
    pub dir: PathBuf,
    /// Every file matched `checksums.json` (false only for a checkpoint written before them).
    pub verified: bool,
    pub state: CheckpointState,
    /// What the learner saved.
    pub learner: LoadedLearner,
    /// `metrics.jsonl` up to the checkpoint.
    pub metrics: Vec<serde_json::Value>,
}

/// The learner's part of a checkpoint read back.
#[derive(Debug)]
pub enum LoadedLearner {
    /// The embedded learner's weights and optimizer.
    Embedded(Box<EmbeddedSaved>),
    /// Where a Tinker learner's state is on its server.
    Tinker(TinkerSaved),
}

/// The embedded learner's weights and optimizer moments, read back.
#[derive(Debug)]
pub struct EmbeddedSaved {
    pub model_cfg: ModelConfig,
    /// With adapters, the frozen base.
    pub weights: Weights,
    /// The LoRA adapters of a LoRA run's checkpoint.
    pub adapters: Option<Adapters>,
    /// Optimizer moments (see [`AdamW::state`]).
    pub moments: Weights,
}

impl Loaded {
    /// The embedded learner's part, or an error saying the checkpoint is a Tinker run's.
    pub fn embedded(&self) -> Result<&EmbeddedSaved, CheckpointError> {
        match &self.learner {
            LoadedLearner::Embedded(e) => Ok(e),
            LoadedLearner::Tinker(t) => Err(CheckpointError::OtherLearner {
                dir: self.dir.clone(),
                reason: format!(
                    "it is a Tinker run's (its state is on {}); resume it with [learner] \
                     kind = \"tinker\"",
                    t.server
                ),
            }),
        }
    }

    /// The Tinker learner's part, or an error saying the checkpoint holds local weights.
    pub fn tinker(&self) -> Result<&TinkerSaved, CheckpointError> {
        match &self.learner {
            LoadedLearner::Tinker(t) => Ok(t),
            LoadedLearner::Embedded(_) => Err(CheckpointError::OtherLearner {
                dir: self.dir.clone(),
                reason: "it holds the embedded learner's weights, which a Tinker server \
                         cannot load; resume it with [learner] kind = \"embedded\""
                    .into(),
            }),
        }
    }

    /// The optimizer continuing where the checkpoint stopped.
    pub fn optimizer(&self, cfg: OptimizerConfig) -> Result<AdamW, CheckpointError> {
        let e = self.embedded()?;
        AdamW::from_state(cfg, self.state.optimizer_step, &e.moments).map_err(|source| {
            CheckpointError::Model {
                path: self.dir.join(OPTIMIZER),
                source,
            }
        })
    }
}

/// Reads the checkpoint in `dir`, after [`verify`]ing its files.
pub fn load(dir: &Path, device: &Device) -> Result<Loaded, CheckpointError> {
    let model = |source| CheckpointError::Model {
        path: dir.to_path_buf(),
        source,
    };
    let verified = verify(dir)?;
    let state = read_state(dir)?;
    if !(1..=FORMAT).contains(&state.format) {
        return Err(CheckpointError::State {
            path: dir.to_path_buf(),
            source: serde::de::Error::custom(format!(
                "format {} (this build reads 1 to {FORMAT})",
                state.format
            )),
        });
    }
    let tinker = dir.join(TINKER);
    let learner = if tinker.exists() {
        let text =
            std::fs::read_to_string(&tinker).map_err(IoError::at("cannot read", tinker.clone()))?;
        LoadedLearner::Tinker(serde_json::from_str(&text).map_err(|e| {
            CheckpointError::Corrupt {
                file: tinker.clone(),
                reason: format!("unreadable: {e}"),
            }
        })?)
    } else {
        let model_cfg = rollflash_model::hf::load_config(dir).map_err(model)?;
        let weights = rollflash_model::hf::load_weights(dir, device).map_err(model)?;
        let adapters = if rollflash_model::lora::has_peft(dir) {
            Some(rollflash_model::lora::load_peft(dir, device).map_err(model)?)
        } else {
            None
        };
        let moments = Weights::load_safetensors(&[dir.join(OPTIMIZER)], device).map_err(model)?;
        LoadedLearner::Embedded(Box::new(EmbeddedSaved {
            model_cfg,
            weights,
            adapters,
            moments,
        }))
    };
    let metrics = crate::metrics::read(&dir.join(METRICS))?;
    Ok(Loaded {
        dir: dir.to_path_buf(),
        verified,
        state,
        learner,
        metrics,
    })
}

/// A fresh [`CheckpointState`] (the format field filled in).
pub fn state(
    cursor: Cursor,
    accounting: Accounting,
    optimizer_step: usize,
    seed: u64,
    elapsed_s: f64,
    eval_before: Option<EvalResult>,
) -> CheckpointState {
    CheckpointState {
        format: FORMAT,
        cursor,
        accounting,
        optimizer_step,
        seed,
        elapsed_s,
        eval_before,
        data: None,
        reward_running: None,
    }
}
