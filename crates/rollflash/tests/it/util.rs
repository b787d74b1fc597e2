//! Helpers several of the binary's test modules share (the tiny run and its checks, which
//! `rollflash-run`'s tests share too, are `tiny_run`).

/// The default run's warm-up (the built-in model after its 600 supervised steps), as the
/// Hugging Face directory the warm-up cache holds: made once per test process by a one-step
/// run, in a cache under cargo's per-target temporary folder (so a rerun of the tests finds
/// it, under the cache's own key), and shared by every test that needs a model that already
/// computes sums.
pub fn warmed_up_model() -> std::path::PathBuf {
    static MODEL: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    MODEL
        .get_or_init(|| {
            let root = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("warmed-up");
            let cache = root.join("warmup-cache");
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollflash"))
                .args(["train", "--set", "train.steps=1"])
                .args(["--set", "train.eval_problems=0"])
                .args(["--set", "metrics.progress=false"])
                .args(["--set", "metrics.report=false"])
                .arg("--set")
                .arg(format!(
                    "warmup.cache_dir={:?}",
                    cache.display().to_string()
                ))
                .arg("--set")
                .arg(format!(
                    "output_dir={:?}",
                    root.join("warmup-run").display().to_string()
                ))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "the warm-up run failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // The newest: a cache kept from an older build may hold another key's result.
            std::fs::read_dir(&cache)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter_map(|p| {
                    let m = std::fs::metadata(p.join("model.safetensors")).ok()?;
                    Some((m.modified().ok()?, p))
                })
                .max()
                .expect("a warm-up directory in the cache")
                .1
        })
        .clone()
}
