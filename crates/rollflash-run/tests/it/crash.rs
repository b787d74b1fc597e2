//! Crash safety through the run API: checkpoints carry checksums and a damaged one is refused
//! by name, with a resume falling back to the newest intact one; a run stopped after its last
//! step's checkpoint resumes to its final weights; a full disk while a checkpoint or the logs
//! are written leaves what exists intact, and the resume after it loses nothing.
//! (`rollflash train` killed with SIGKILL and resumed is the binary's test, in
//! `crates/rollflash/tests/it/crash.rs`.)

use std::path::{Path, PathBuf};

use rollflash_run::checkpoint::{self, CheckpointError};
use rollflash_run::pipeline::{self, Resume, RunOptions};
use serde_json::Value;

use crate::tiny_run::{cfg, check_metrics, max_weight_diff, metrics, tmp_dirs};
use crate::ChainText;

fn step(root: &Path, n: usize) -> PathBuf {
    checkpoint::step_dir(root, n)
}

/// `--resume` of the newest checkpoint, as the binary does it.
async fn resume_latest(
    c: rollflash_run::config::TrainConfig,
) -> Result<pipeline::TrainSummary, pipeline::PipelineError> {
    pipeline::run_with(
        c,
        RunOptions {
            resume: Some(Resume::Latest),
            ..Default::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_checkpoint_is_refused_by_name_and_resume_falls_back_to_an_intact_one() {
    const N: usize = 4;
    let full = tempfile::tempdir().unwrap();
    let part = tempfile::tempdir().unwrap();
    let a = pipeline::run(cfg(full.path(), N, 0)).await.unwrap();

    let mut c = cfg(part.path(), 3, 1);
    c.checkpoint.keep = 3;
    pipeline::run(c).await.unwrap();
    let root = checkpoint::root(part.path());
    for n in 1..=3 {
        assert!(checkpoint::verify(&step(&root, n)).unwrap(), "step {n}");
    }
    let sums: checkpoint::Checksums = serde_json::from_str(
        &std::fs::read_to_string(step(&root, 3).join("checksums.json")).unwrap(),
    )
    .unwrap();
    for f in [
        "model.safetensors",
        "optimizer.safetensors",
        "state.json",
        "metrics.jsonl",
        "config.json",
    ] {
        assert!(sums.files.contains_key(f), "checksums.json lacks {f}");
    }

    // Step 3: model truncated. Step 2: one byte of the optimizer state flipped.
    let model = step(&root, 3).join("model.safetensors");
    let len = std::fs::metadata(&model).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let opt = step(&root, 2).join("optimizer.safetensors");
    let mut bytes = std::fs::read(&opt).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&opt, bytes).unwrap();
    match checkpoint::verify(&step(&root, 3)) {
        Err(CheckpointError::Corrupt { file, reason }) => {
            assert_eq!(file, model);
            assert!(reason.contains("truncated"), "{reason}");
        }
        other => panic!("truncated model accepted: {other:?}"),
    }
    let err = checkpoint::load(&step(&root, 2), &candle_core::Device::Cpu).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("optimizer.safetensors") && msg.contains("contents differ"),
        "{msg}"
    );
    // A temporary directory of a write cut short.
    std::fs::create_dir_all(root.join(".tmp-step-00000004")).unwrap();

    // Resumed to N: from step 1, the two damaged ones set aside.
    let b = resume_latest(cfg(part.path(), N, 1)).await.unwrap();
    assert_eq!(b.resumed_from.as_deref(), Some(step(&root, 1).as_path()));
    assert_eq!(b.report.steps.len(), N - 1);
    assert!(root.join("refused-step-00000003").is_dir());
    assert!(root.join("refused-step-00000002").is_dir());
    assert!(tmp_dirs(&root).is_empty(), "{:?}", tmp_dirs(&root));
    let diff = max_weight_diff(
        a.checkpoint.as_deref().unwrap(),
        b.checkpoint.as_deref().unwrap(),
    );
    assert_eq!(diff, 0.0, "resumed weights differ by {diff}");
    check_metrics(part.path(), N);
    // The checkpoints written after the resume are intact, and keep=2 pruned only those.
    assert!(checkpoint::verify(&step(&root, N)).unwrap());

    // Nothing intact left: the error lists every refusal.
    let only = tempfile::tempdir().unwrap();
    pipeline::run(cfg(only.path(), 1, 1)).await.unwrap();
    let oroot = checkpoint::root(only.path());
    std::fs::write(step(&oroot, 1).join("state.json"), "{").unwrap();
    let err = checkpoint::load_latest(&oroot, &candle_core::Device::Cpu).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("no usable checkpoint") && msg.contains("state.json"),
        "{msg}"
    );
}

/// Killed after the last step's checkpoint (in the evaluation or the final save): the resume
/// has no step left to run and still ends with the final weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_after_its_last_checkpoint_resumes_to_its_final_weights() {
    const N: usize = 2;
    let dir = tempfile::tempdir().unwrap();
    let a = pipeline::run(cfg(dir.path(), N, 1)).await.unwrap();
    let keep = tempfile::tempdir().unwrap();
    let first = keep.path().join("final");
    std::fs::rename(a.checkpoint.as_deref().unwrap(), &first).unwrap();
    let b = resume_latest(cfg(dir.path(), N, 1)).await.unwrap();
    assert_eq!(b.report.steps.len(), 0);
    assert_eq!(
        max_weight_diff(&first, b.checkpoint.as_deref().unwrap()),
        0.0
    );
    check_metrics(dir.path(), N);
}

/// Mounts a tmpfs of `bytes` at `at`; unmounted on drop. `None` (the test skips) where this
/// process may not mount.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, bytes: u64) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(at)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_while_checkpointing_stops_the_run_or_skips_and_keeps_what_exists() {
    // The size of one checkpoint, from a run on the ordinary disk.
    let probe = tempfile::tempdir().unwrap();
    pipeline::run(cfg(probe.path(), 1, 1)).await.unwrap();
    let one: u64 = std::fs::read_dir(step(&checkpoint::root(probe.path()), 1))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();

    for on_error in ["stop", "continue"] {
        let dir = tempfile::tempdir().unwrap();
        let root = checkpoint::root(dir.path());
        // Room for one checkpoint and a half: the second one cannot be written.
        let Some(_fs) = Tmpfs::mount(&root, one * 3 / 2 + 64 * 1024) else {
            eprintln!(
                "SKIP a_full_disk_while_checkpointing: cannot mount a tmpfs here (needs root \
                 and mount rights)"
            );
            return;
        };
        let mut c = cfg(dir.path(), 3, 1);
        c.checkpoint.keep = 3;
        c.checkpoint.on_error = serde_json::from_value(Value::from(on_error)).unwrap();
        let out = pipeline::run(c).await;
        match on_error {
            "stop" => {
                let msg = out.unwrap_err().chain_text();
                assert!(
                    msg.contains("checkpoint") && msg.to_lowercase().contains("no space"),
                    "{msg}"
                );
            }
            _ => {
                let s = out.unwrap();
                assert_eq!(s.report.steps.len(), 3, "the run went on");
                assert!(dir.path().join("final/model.safetensors").exists());
            }
        }
        // What was written before is intact, and no partial checkpoint is left.
        assert!(checkpoint::verify(&step(&root, 1)).unwrap(), "{on_error}");
        assert!(!step(&root, 2).exists(), "{on_error}");
        assert!(
            tmp_dirs(&root).is_empty(),
            "{on_error}: {:?}",
            tmp_dirs(&root)
        );
    }
}

/// The run directory's disk fills while the run appends its logs (`metrics.jsonl`,
/// `trajectories.jsonl`, `timeline.jsonl`; checkpoints on a disk of their own): the run
/// stops with `No space left on device` naming the log, what exists stays intact, and once
/// space is freed `--resume` continues from the last checkpoint to exactly the weights of an
/// uninterrupted run, with every step's metrics once and logs every reader still parses
/// (the torn lines the full disk left are dropped, not glued to the next record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_while_writing_the_logs_stops_the_run_and_resume_loses_nothing() {
    const N: usize = 6;
    const PAGE: u64 = 4096;
    const DISK: u64 = 8 << 20;
    let full = tempfile::tempdir().unwrap();
    let a = pipeline::run(cfg(full.path(), N, 0)).await.unwrap();
    // What the logs of the whole run take.
    let logs: u64 = ["metrics.jsonl", "trajectories.jsonl", "timeline.jsonl"]
        .iter()
        .map(|f| std::fs::metadata(full.path().join(f)).map_or(0, |m| m.len()))
        .sum();

    let dir = tempfile::tempdir().unwrap();
    let root = checkpoint::root(dir.path());
    let Some(_disk) = Tmpfs::mount(dir.path(), DISK) else {
        eprintln!(
            "SKIP a_full_disk_while_writing_the_logs: cannot mount a tmpfs here (needs root \
             and mount rights)"
        );
        return;
    };
    let Some(_ckpts) = Tmpfs::mount(&root, 64 << 20) else {
        eprintln!("SKIP a_full_disk_while_writing_the_logs: cannot mount the checkpoints' tmpfs");
        return;
    };
    // Room for about half the run's logs: the disk fills mid-run.
    let room = (logs / 2 / PAGE).max(1) * PAGE;
    let ballast = dir.path().join("ballast");
    std::fs::write(&ballast, vec![0u8; (DISK - room) as usize]).unwrap();

    let out = pipeline::run(cfg(dir.path(), N, 1)).await;
    let msg = out.unwrap_err().chain_text();
    assert!(
        msg.to_lowercase().contains("no space") && msg.contains(".jsonl"),
        "the error names the log and the cause: {msg}"
    );
    let done = metrics(dir.path()).len();
    assert!(
        (1..N).contains(&done),
        "stopped mid-run: {done} steps logged"
    );
    assert!(tmp_dirs(&root).is_empty(), "{:?}", tmp_dirs(&root));
    for d in std::fs::read_dir(&root).unwrap().filter_map(Result::ok) {
        assert!(
            checkpoint::verify(&d.path()).unwrap(),
            "{:?}",
            d.file_name()
        );
    }

    // Space is freed; the run resumes to the end.
    std::fs::remove_file(&ballast).unwrap();
    let b = resume_latest(cfg(dir.path(), N, 1)).await.unwrap();
    assert_eq!(
        max_weight_diff(
            a.checkpoint.as_deref().unwrap(),
            b.checkpoint.as_deref().unwrap()
        ),
        0.0
    );
    check_metrics(dir.path(), N);
    let run = rollflash_dashboard::RunDir::new(dir.path());
    run.timeline().unwrap();
    run.trajectories().unwrap();
    eprintln!("disk full after {done} logged steps ({room} bytes of room; {msg})");
}
