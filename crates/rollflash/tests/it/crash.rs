//! Crash safety of the real process: `rollflash train` killed with SIGKILL at moments drawn at
//! random and resumed ends with the weights of an uninterrupted run. The crash tests through
//! the run API (damaged checkpoints, a full disk) are `rollflash-run`'s, in
//! `crates/rollflash-run/tests/it/crash.rs`.

use std::path::Path;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rollflash_run::checkpoint;
use rollflash_run::pipeline;

use crate::tiny_run::{cfg, check_metrics, max_weight_diff, sync_sets, tmp_dirs};

/// Starts `rollflash train` on [`sync_sets`], resuming if asked.
fn spawn_train(dir: &Path, steps: usize, resume: bool) -> std::process::Child {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rollflash"));
    cmd.arg("train");
    for s in sync_sets(dir, steps, 1) {
        cmd.args(["--set", &s]);
    }
    if resume {
        cmd.arg("--resume");
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (bounded) until `pred` holds, polling every millisecond.
fn wait_for(what: &str, limit: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if pred() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!("crash: {what} not seen within {limit:?}");
    false
}

/// SIGKILLs a child and reaps it; says whether it had already exited by itself, and what it
/// said about resuming (which checkpoint, what it dropped or removed).
fn kill_9(mut child: std::process::Child) -> String {
    use std::io::Read;
    let exited = child.try_wait().unwrap().is_some();
    let _ = child.kill();
    let _ = child.wait();
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    let said: Vec<&str> = out
        .lines()
        .filter(|l| {
            ["resuming", "dropped", "removed", "refused"]
                .iter()
                .any(|k| l.contains(k))
        })
        .collect();
    format!("exited first = {exited}; said {said:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_then_resume_ends_with_the_uninterrupted_weights() {
    const N: usize = 6;
    let full = tempfile::tempdir().unwrap();
    let a = pipeline::run(cfg(full.path(), N, 0)).await.unwrap();

    let part = tempfile::tempdir().unwrap();
    let root = checkpoint::root(part.path());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(18);
    let mut kills = Vec::new();

    // 1: at a random moment after the first checkpoint (a step, a sync, a metrics line).
    let child = spawn_train(part.path(), N, false);
    assert!(wait_for("step-1", Duration::from_secs(300), || {
        checkpoint::step_dir(&root, 1).join("state.json").exists()
    }));
    let delay = Duration::from_millis(rng.random_range(0..400));
    std::thread::sleep(delay);
    kills.push(format!("after step-1 + {delay:?}: {}", kill_9(child)));

    // 2: while a checkpoint is being written (its temporary directory exists).
    let child = spawn_train(part.path(), N, true);
    let caught = wait_for(
        "a checkpoint being written",
        Duration::from_secs(300),
        || !tmp_dirs(&root).is_empty(),
    );
    kills.push(format!(
        "mid-checkpoint (caught = {caught}): {}",
        kill_9(child)
    ));

    // 3: at a random moment of a resumed run.
    let child = spawn_train(part.path(), N, true);
    let delay = Duration::from_millis(rng.random_range(800..2500));
    std::thread::sleep(delay);
    kills.push(format!("resumed + {delay:?}: {}", kill_9(child)));

    // Then to the end.
    let child = spawn_train(part.path(), N, true);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "final resume failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            ["resuming", "dropped", "removed", "refused"]
                .iter()
                .any(|k| l.contains(k))
        })
        .collect();
    eprintln!("crash: kills {kills:#?}; final resume said {said:?}");
    let diff = max_weight_diff(a.checkpoint.as_deref().unwrap(), &part.path().join("final"));
    assert_eq!(
        diff, 0.0,
        "weights after kill -9 and resume differ by {diff}"
    );
    check_metrics(part.path(), N);
    assert!(tmp_dirs(&root).is_empty(), "{:?}", tmp_dirs(&root));
    for (n, d) in std::fs::read_dir(&root)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| (e.file_name(), e.path()))
    {
        assert!(checkpoint::verify(&d).unwrap(), "{n:?} left unverifiable");
    }
}
