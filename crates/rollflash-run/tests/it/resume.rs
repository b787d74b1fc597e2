//! Checkpoints and resuming through the run API (`pipeline::run_with` with `Resume::Latest`,
//! what `--resume` runs): a synchronous run stopped after K steps and resumed to N ends with
//! the same weights and the same per-step rewards as a run of N steps (with running reward
//! statistics too, and on a dataset, continuing with the next unseen row), and repeats byte
//! for byte at any thread count; an asynchronous run resumes with balanced accounting;
//! metrics are written per step with the fields the issue asks for, and the report is built
//! from them.

use std::path::Path;

use candle_core::{DType, Device};
use rollflash_run::config::TrainConfig;
use rollflash_run::pipeline::{self, Resume, RunOptions};
use serde_json::Value;

use crate::tiny_run::{assert_balanced, cfg, max_weight_diff, metrics, sync_sets};

fn column(rows: &[Value], key: &str) -> Vec<f64> {
    rows.iter().map(|r| r[key].as_f64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_ends_where_the_uninterrupted_one_does() {
    const N: usize = 4;
    const K: usize = 2;
    let full = tempfile::tempdir().unwrap();
    let part = tempfile::tempdir().unwrap();

    let a = pipeline::run(cfg(full.path(), N, 0)).await.unwrap();
    assert_eq!(a.report.steps.len(), N);

    // Stopped after K steps (its config says K), with a checkpoint at K.
    let b1 = pipeline::run(cfg(part.path(), K, K)).await.unwrap();
    assert_eq!(b1.report.steps.len(), K);
    let ckpt = rollflash_run::checkpoint::latest(&part.path().join("checkpoints")).unwrap();
    assert!(ckpt.ends_with(format!("step-{K:08}")), "{}", ckpt.display());
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "optimizer.safetensors",
        "state.json",
        "metrics.jsonl",
    ] {
        assert!(ckpt.join(f).exists(), "checkpoint lacks {f}");
    }
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("state.json")).unwrap()).unwrap();
    assert_eq!(state["cursor"]["version"], K as u64);
    assert_eq!(state["cursor"]["steps_done"], K as u64);
    assert_eq!(state["optimizer_step"], K as u64);

    // Resumed to N.
    let b2 = pipeline::run_with(
        cfg(part.path(), N, K),
        RunOptions {
            resume: Some(Resume::Latest),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(b2.resumed_from.as_deref(), Some(ckpt.as_path()));
    assert_eq!(b2.report.steps.len(), N - K, "only the remaining steps run");
    assert_eq!(b2.report.steps[0].step, K);
    assert_eq!(b2.report.steps[0].version.0, K as u64);

    let (ma, mb) = (metrics(full.path()), metrics(part.path()));
    assert_eq!(ma.len(), N);
    assert_eq!(
        mb.len(),
        N,
        "the resumed metrics file holds every step once"
    );
    assert_eq!(
        column(&mb, "step"),
        (0..N).map(|s| s as f64).collect::<Vec<_>>()
    );
    let (ra, rb) = (column(&ma, "reward"), column(&mb, "reward"));
    assert_eq!(ra, rb, "per-step rewards");
    assert_eq!(column(&ma, "tokens"), column(&mb, "tokens"));
    // The gradient was not zero: the weights moved.
    let start = tempfile::tempdir().unwrap();
    let c = cfg(start.path(), 1, 0);
    let tok = rollflash_model::tokenizer::Tokenizer::builtin();
    let mc = rollflash_model::config::ModelConfig::builtin_default(
        tok.vocab_size(),
        tok.eos_token_id().unwrap(),
    );
    let w0 =
        rollflash_model::weights::Weights::random(&mc, c.seed, DType::F32, &Device::Cpu).unwrap();
    rollflash_model::hf::save_dir(start.path(), &mc, &w0, Some(&tok)).unwrap();
    assert!(
        max_weight_diff(start.path(), a.checkpoint.as_deref().unwrap()) > 1e-4,
        "training moved nothing"
    );

    let diff = max_weight_diff(
        a.checkpoint.as_deref().unwrap(),
        b2.checkpoint.as_deref().unwrap(),
    );
    eprintln!("resume: max |Δw| = {diff:e}; rewards {ra:?}");
    assert_eq!(diff, 0.0, "resumed weights differ by {diff}");

    // The accounting continues across the resume and adds up.
    let last = mb.last().unwrap();
    let n = |k: &str| last[k].as_u64().unwrap();
    assert_eq!(n("trained"), (N * 8) as u64);
    assert_balanced(last, "last step");
}

/// The synchronous baseline repeats bit for bit for a seed, whatever its thread counts (issue
/// 35): runs with 1 engine + 1 trainer thread and, twice, with 2 + 2 write the same
/// `final/model.safetensors` byte for byte and log the same per-step rewards.
///
/// Under [`cfg`]'s PPO loss, as README's "Determinism" says: the trainer's numbers do not
/// depend on its thread count (every reduction is chunked by size, not by threads; gemm splits
/// the output, not the sum), but the engine's log-probs do depend on which requests share its
/// forward passes, which is timing; decoupled PPO (the default loss) weighs each token by
/// them, so its weights agree to about 1e-6, not exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_synchronous_baseline_repeats_byte_for_byte_at_any_thread_count() {
    const N: usize = 3;
    let mut runs = Vec::new();
    for threads in [1, 2, 2] {
        let dir = tempfile::tempdir().unwrap();
        let mut sets = sync_sets(dir.path(), N, 0);
        sets.extend([
            format!("rollout.engine_threads={threads}"),
            format!("train.threads={threads}"),
        ]);
        let s = pipeline::run(TrainConfig::load(None, &sets).unwrap())
            .await
            .unwrap();
        assert_eq!(s.report.steps.len(), N);
        let weights = std::fs::read(dir.path().join("final/model.safetensors")).unwrap();
        runs.push((threads, weights, column(&metrics(dir.path()), "reward")));
    }
    let (_, w0, r0) = &runs[0];
    for (threads, w, r) in &runs[1..] {
        assert_eq!(r, r0, "{threads} thread(s): per-step rewards");
        assert!(
            w == w0,
            "{threads} thread(s): final weights differ from the 1-thread run's"
        );
    }
}

/// ROLL's running reward statistics live in the learner from step to step; a resume must
/// restore them from the checkpoint, or the first resumed batch is normalised by fresh
/// statistics and the run diverges. With GiGPO (multi-turn FrozenLake, step-level groups) as
/// the estimator, so its turns are cut from real trajectories too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_continues_the_running_reward_statistics_exactly() {
    const N: usize = 4;
    const K: usize = 2;
    let sets = |dir: &Path, steps: usize, every: usize| {
        let mut s = sync_sets(dir, steps, every);
        s.extend([
            "train.advantage.name=gigpo".to_string(),
            "train.shaping.norm_mean_type=running".to_string(),
            "train.shaping.norm_std_type=running".to_string(),
        ]);
        TrainConfig::load(None, &s).unwrap()
    };
    let full = tempfile::tempdir().unwrap();
    let part = tempfile::tempdir().unwrap();
    let a = pipeline::run(sets(full.path(), N, 0)).await.unwrap();
    assert_eq!(a.report.steps.len(), N);
    pipeline::run(sets(part.path(), K, K)).await.unwrap();
    let ckpt = rollflash_run::checkpoint::latest(&part.path().join("checkpoints")).unwrap();
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("state.json")).unwrap()).unwrap();
    let saved: rollflash_run::checkpoint::SavedRunning =
        serde_json::from_value(state["reward_running"].clone()).unwrap();
    assert_eq!(saved.batches, K as u64, "{state}");
    // Two batches of 2 groups × 4 samples, plus ROLL's 1e-24 prior (lost in the sum).
    assert_eq!(saved.moments().count, (K * 8) as f64, "{state}");

    let b2 = pipeline::run_with(
        sets(part.path(), N, K),
        RunOptions {
            resume: Some(Resume::Latest),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(b2.report.steps.len(), N - K);
    let (ma, mb) = (metrics(full.path()), metrics(part.path()));
    for key in [
        "reward_running_mean",
        "reward_running_std",
        "gigpo_step_group_size",
        "reward",
    ] {
        assert_eq!(column(&ma, key), column(&mb, key), "{key}");
    }
    // The statistics moved from step to step (they are running, not per batch).
    let means = column(&ma, "reward_running_mean");
    assert!(means.windows(2).any(|w| w[0] != w[1]), "{means:?}");
    let diff = max_weight_diff(
        a.checkpoint.as_deref().unwrap(),
        b2.checkpoint.as_deref().unwrap(),
    );
    assert_eq!(diff, 0.0, "resumed weights differ by {diff}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_every_field_and_the_report_is_built_from_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 2, 0);
    c.controller.sync = false;
    c.buffer.alpha = 1.0;
    let s = pipeline::run(c).await.unwrap();
    let rows = metrics(dir.path());
    assert_eq!(rows.len(), 2);
    for r in &rows {
        for key in [
            "reward",
            "accuracy",
            "approx_kl",
            "entropy",
            "clip_frac",
            "staleness_hist",
            "staleness_max",
            "samples_per_s",
            "tokens_per_s",
            "rollout_idle",
            "trainer_idle",
            "weight_sync_ms",
            "started",
            "trained",
            "filtered",
            "dropped_stale",
            "aborted",
            "failed",
        ] {
            assert!(r.get(key).is_some(), "metrics lack {key}: {r}");
        }
        assert!(
            r["staleness_max"].as_u64().unwrap() <= 1,
            "staleness above α"
        );
        let hist: u64 = r["staleness_hist"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(hist, r["samples"].as_u64().unwrap());
        for k in ["rollout_idle", "trainer_idle", "accuracy"] {
            let v = r[k].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{k} = {v}");
        }
    }
    let report = s.report_path.unwrap();
    let md = std::fs::read_to_string(&report).unwrap();
    assert!(md.contains("balanced: true"), "{md}");
    for png in [
        "reward_vs_step.png",
        "reward_vs_time.png",
        "staleness.png",
        "throughput.png",
        "response_length.png",
        "timeline.png",
    ] {
        let bytes = std::fs::read(dir.path().join("report").join(png)).unwrap();
        assert_eq!(&bytes[..4], b"\x89PNG", "{png}");
    }
    // `rollflash report` rebuilds it from the files alone.
    std::fs::remove_dir_all(dir.path().join("report")).unwrap();
    let again = rollflash_run::report::write(dir.path()).unwrap();
    assert_eq!(std::fs::read_to_string(again).unwrap(), md);
}

/// `checkpoint.final = false` (issue 35): a completed run writes no `final/` and says so, and
/// `--dry-run`'s plan says it; its metrics and summary are written as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_checkpoint_final_false_writes_no_final_dir() {
    let dir = tempfile::tempdir().unwrap();
    let mut sets = sync_sets(dir.path(), 1, 0);
    sets.push("checkpoint.final=false".into());
    let c = TrainConfig::load(None, &sets).unwrap();
    assert!(!c.checkpoint.save_final);
    let plan = rollflash_run::plan::RunPlan::new(c.clone()).unwrap();
    let text = plan.describe().join("\n");
    assert!(
        text.contains("no final/ at the end (checkpoint.final = false)"),
        "{text}"
    );
    assert!(c.to_toml().unwrap().contains("final = false"));

    let s = pipeline::run(c).await.unwrap();
    assert_eq!(s.report.steps.len(), 1);
    assert_eq!(s.checkpoint, None);
    assert!(!dir.path().join("final").exists(), "final/ was written");
    assert!(!dir.path().join("checkpoints").exists());
    assert_eq!(metrics(dir.path()).len(), 1);
    assert!(dir.path().join("summary.json").is_file());

    // The default writes it.
    let on = tempfile::tempdir().unwrap();
    let plan = rollflash_run::plan::RunPlan::new(cfg(on.path(), 1, 0)).unwrap();
    assert!(plan
        .describe()
        .iter()
        .any(|l| l.contains("the trained model to")));
}

/// An asynchronous run resumes at its version and task seed; the groups that were in
/// flight at the checkpoint are not replayed and count as aborted, so the totals still add
/// up and staleness stays within α.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_run_resumes_with_balanced_accounting() {
    let dir = tempfile::tempdir().unwrap();
    let asynchronous = |steps| {
        let mut c = cfg(dir.path(), steps, 2);
        c.controller.sync = false;
        c.buffer.alpha = 1.0;
        c
    };
    pipeline::run(asynchronous(2)).await.unwrap();
    let s = pipeline::run_with(
        asynchronous(3),
        RunOptions {
            resume: Some(Resume::Latest),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(s.report.steps.len(), 1);
    assert_eq!(s.report.steps[0].version.0, 2);
    let a = s.report.accounting;
    assert!(a.balanced(), "{a:?}");
    assert_eq!(a.trained, 3 * 8);
    let rows = metrics(dir.path());
    assert_eq!(column(&rows, "step"), vec![0.0, 1.0, 2.0]);
    assert!(rows
        .iter()
        .all(|r| r["staleness_max"].as_u64().unwrap() <= 1));
}

/// 12 rows `{"q", "a"}` whose answers are single digits, so the tiny random model's last
/// number is right often enough for a gradient; `extra` rows appended (an edited file).
fn digit_rows(dir: &Path, extra: usize) -> String {
    let path = dir.join("digits.jsonl");
    let text: String = (0..12 + extra)
        .map(|i| {
            format!(
                "{}\n",
                serde_json::json!({"q": format!("say {}", i % 10), "a": i % 10})
            )
        })
        .collect();
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The synchronous dataset run of [`cfg`]'s shape on [`digit_rows`]: 6 training rows an
/// epoch (half of the 12 held out by a seeded fraction), so 4 steps of 2 groups cross an
/// epoch boundary and a resume at step 2 lands mid-epoch.
fn data_cfg(dir: &Path, data: &str, steps: usize, every: usize, more: &[&str]) -> TrainConfig {
    let mut sets: Vec<String> = vec![
        format!("output_dir={:?}", dir.display().to_string()),
        "env.name=dataset".into(),
        format!("env.files=[{{path={data:?}, weight=1.0}}]"),
        "env.heldout_fraction=0.5".into(),
        "env.prompt=q".into(),
        "env.answer=a".into(),
        "env.extract=[\"last_number\"]".into(),
        "rollout.max_new_tokens=6".into(),
        "buffer.groups_per_batch=2".into(),
        "buffer.group_size=4".into(),
        "train.eval_problems=0".into(),
        "metrics.progress=false".into(),
        "seed=3".into(),
        "warmup.steps=0".into(),
        "rollout.temperature=1.0".into(),
        "buffer.alpha=0".into(),
        "controller.sync=true".into(),
        format!("train.steps={steps}"),
        "train.lr=1e-3".into(),
        "train.loss.pg_variant=ppo".into(),
        format!("checkpoint.every={every}"),
    ];
    sets.extend(more.iter().map(|s| s.to_string()));
    TrainConfig::load(None, &sets).unwrap()
}

/// A dataset run resumed at step K ends where the uninterrupted run does (same rewards, same
/// weights); the checkpoint's data cursor says where it was (epoch, offset, next row); and a
/// resume under another shuffle seed, with an edited file, or with another task is refused
/// naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_dataset_run_continues_with_the_next_unseen_row_exactly() {
    const N: usize = 4;
    const K: usize = 2;
    let data_dir = tempfile::tempdir().unwrap();
    let data = digit_rows(data_dir.path(), 0);
    let full = tempfile::tempdir().unwrap();
    let part = tempfile::tempdir().unwrap();
    let a = pipeline::run(data_cfg(full.path(), &data, N, 0, &[]))
        .await
        .unwrap();
    pipeline::run(data_cfg(part.path(), &data, K, K, &[]))
        .await
        .unwrap();
    let ckpt = rollflash_run::checkpoint::latest(&part.path().join("checkpoints")).unwrap();
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("state.json")).unwrap()).unwrap();
    let d = &state["data"];
    assert_eq!(d["epoch_len"], 6, "{d}");
    assert_eq!(
        (d["epoch"].as_u64(), d["offset"].as_u64()),
        (Some(0), Some(4)),
        "{d}"
    );
    assert_eq!(d["files"][0]["rows"], 12, "{d}");
    assert!(d["next_file"].as_str().unwrap().ends_with("digits.jsonl"));
    assert!(d["next_row"].as_str().unwrap().starts_with("line "));

    let resume = || RunOptions {
        resume: Some(Resume::Latest),
        ..Default::default()
    };
    // Refused: another shuffle seed, another task.
    let refused = |c: TrainConfig| async move {
        rollflash_core::error_chain(&pipeline::run_with(c, resume()).await.unwrap_err())
    };
    let e = refused(data_cfg(part.path(), &data, N, K, &["env.shuffle_seed=1"])).await;
    assert!(e.contains("shuffle_seed is 0, the config's 1"), "{e}");
    let mut lake = cfg(part.path(), N, K);
    lake.output_dir = part.path().to_path_buf();
    let e = refused(lake).await;
    assert!(
        e.contains("dataset run") && e.contains("frozen_lake"),
        "{e}"
    );
    // Refused: the file was edited (a row appended), even at the same path.
    let edited_dir = tempfile::tempdir().unwrap();
    let edited = digit_rows(edited_dir.path(), 1);
    let e = refused(data_cfg(part.path(), &edited, N, K, &[])).await;
    assert!(
        e.contains("trained on") && e.contains("12 rows") && e.contains("13 rows"),
        "{e}"
    );
    // The refusals wrote nothing; the real resume continues exactly.
    let b = pipeline::run_with(data_cfg(part.path(), &data, N, K, &[]), resume())
        .await
        .unwrap();
    assert_eq!(b.report.steps.len(), N - K);
    let (ma, mb) = (metrics(full.path()), metrics(part.path()));
    assert_eq!(
        column(&ma, "reward"),
        column(&mb, "reward"),
        "per-step rewards"
    );
    assert!(
        column(&ma, "reward").iter().any(|r| *r > 0.0),
        "some reward, so the weights move: {:?}",
        column(&ma, "reward")
    );
    let diff = max_weight_diff(
        a.checkpoint.as_deref().unwrap(),
        b.checkpoint.as_deref().unwrap(),
    );
    assert_eq!(diff, 0.0, "resumed weights differ by {diff}");
    let last = rollflash_run::checkpoint::latest(&part.path().join("checkpoints")).unwrap();
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(last.join("state.json")).unwrap()).unwrap();
    assert_eq!(
        (
            state["data"]["epoch"].as_u64(),
            state["data"]["offset"].as_u64()
        ),
        (Some(1), Some(2)),
        "8 rows given out of 6-row epochs: {}",
        state["data"]
    );
}
