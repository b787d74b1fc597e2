//! `rollflash bench` on a tiny setting: every mode of both workloads runs on the real stack,
//! and the table keeps its invariants — accounting balanced, the trained-sample count equal
//! across modes, staleness within α (0 for the synchronous baseline). No timing is checked.

use rollflash_bench::rl::{self as bench_rl, BenchOptions, Workload};

/// Every switch on its own, α beyond 1, and everything together.
const MODES: &[&str] = &[
    "sync",
    "queue",
    "replicate",
    "env-async",
    "redundant",
    "alpha2",
    "all",
];

#[test]
fn workload_names_parse_once() {
    for w in Workload::ALL {
        assert_eq!(Workload::parse_list(w.name()), Some(vec![w]));
    }
    assert_eq!(
        Workload::parse_list("both"),
        Some(vec![Workload::Rlvr, Workload::Agentic])
    );
    assert_eq!(Workload::parse_list("all"), Some(Workload::ALL.to_vec()));
    assert_eq!(Workload::parse_list("agentic_gen"), None);
    // The real-model workload is named, not in `all`: it reads the user's model and data,
    // and says how to make them where they are missing (tests run in the crate's folder).
    assert_eq!(
        Workload::parse_list("smollm2"),
        Some(vec![Workload::Smollm2])
    );
    assert!(!Workload::ALL.contains(&Workload::Smollm2));
    let e = Workload::Smollm2
        .data(std::path::Path::new("."))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("models/smollm2-hf") && e.contains("scripts/fetch_smollm2.sh"),
        "{e}"
    );
    // Each workload's settings, with its data, load as a `rollflash train` config.
    let dir = tempfile::tempdir().unwrap();
    for w in Workload::ALL {
        let mut sets = w.sets();
        sets.extend(w.data(dir.path()).unwrap());
        rollflash_run::config::TrainConfig::load(None, &sets)
            .unwrap_or_else(|e| panic!("{}: {e}", w.name()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_every_mode_and_keeps_its_invariants() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 3;
    let opts = BenchOptions {
        workloads: vec![Workload::Rlvr, Workload::Agentic],
        modes: Some(MODES.iter().map(|s| (*s).to_string()).collect()),
        repeats: 1,
        steps: Some(steps),
        sets: [
            "warmup.steps=0",
            "rollout.max_new_tokens=6",
            "rollout.max_total_tokens=300",
            "rollout.max_running_requests=2",
            "rollout.engine_threads=1",
            "train.threads=1",
            "buffer.groups_per_batch=2",
            "buffer.group_size=2",
            "rollout.group_size_redundancy=1",
            "env.latency={ kind = \"uniform\", low = 0.0, high = 0.01 }",
            "env.failure={ rate = 0.05 }",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect(),
        out: dir.path().to_path_buf(),
        verbose: false,
    };
    let report = bench_rl::run(&opts).await.unwrap();

    for w in [Workload::Rlvr, Workload::Agentic] {
        for name in MODES {
            let r = report
                .get(w, name)
                .unwrap_or_else(|| panic!("{} {name} missing", w.name()));
            assert_eq!(r.runs.len(), 1, "{} {name}", w.name());
            for m in &r.runs {
                let what = format!("{} {name}", w.name());
                assert!(m.accounting.balanced(), "{what}: {:?}", m.accounting);
                assert_eq!(m.steps, steps, "{what}");
                assert_eq!(m.trained, (steps * 2 * 2) as u64, "{what}");
                assert_eq!(m.accounting.trained, m.trained, "{what}");
                assert!(
                    m.staleness_max <= r.mode.alpha.ceil() as u64,
                    "{what}: staleness {} above α {}",
                    m.staleness_max,
                    r.mode.alpha
                );
                assert!(m.staleness_mean <= m.staleness_max as f64 + 1e-9, "{what}");
                assert!(
                    m.samples_per_s > 0.0 && m.samples_per_s.is_finite(),
                    "{what}"
                );
                assert!((0.0..=1.0).contains(&m.rollout_busy), "{what}");
                assert!((0.0..=1.0).contains(&m.trainer_busy), "{what}");
                assert!((0.0..=1.0).contains(&m.gen_share), "{what}");
            }
        }
        let sync = report.get(w, "sync").unwrap();
        assert_eq!(sync.mode.alpha, 0.0);
        assert!(sync.runs.iter().all(|m| m.staleness_max == 0));
        let s = report.speedup(sync).unwrap();
        assert!((s.median - 1.0).abs() < 1e-9);
    }

    // The table: a header per workload and one row per mode; the CSV one row per run.
    let md = report.markdown();
    assert_eq!(md.matches("| mode | α |").count(), 2);
    for name in MODES {
        assert_eq!(md.matches(&format!("\n| {name} |")).count(), 2, "{name}");
    }
    assert!(!md.contains("NOT balanced"));
    let csv = report.csv();
    assert_eq!(csv.lines().count(), 1 + 2 * MODES.len());
    let written = report.write(dir.path()).unwrap();
    assert!(written.iter().any(|p| p.ends_with("bench.md")));
    assert!(written.iter().any(|p| p.ends_with("bench.csv")));
}

/// The code workload (the multi-turn coding environment, each turn run in the code sandbox)
/// on a tiny setting: the baseline and every mechanism together keep the invariants. Skips,
/// saying why, where the sandbox cannot start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_the_code_workload() {
    if let Err(e) = rollflash_sandbox::Sandbox::new(Default::default()).await {
        eprintln!("skipped: {e}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let steps = 3;
    let opts = BenchOptions {
        workloads: vec![Workload::Code],
        modes: Some(vec!["sync".into(), "all".into()]),
        repeats: 1,
        steps: Some(steps),
        sets: [
            "rollout.max_new_tokens=12",
            "rollout.engine_threads=1",
            "train.threads=1",
            "buffer.group_size=2",
            "rollout.group_size_redundancy=1",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect(),
        out: dir.path().to_path_buf(),
        verbose: false,
    };
    let report = bench_rl::run(&opts).await.unwrap();
    for name in ["sync", "all"] {
        let r = report.get(Workload::Code, name).unwrap();
        for m in &r.runs {
            assert!(m.accounting.balanced(), "{name}: {:?}", m.accounting);
            assert_eq!(m.steps, steps, "{name}");
            assert_eq!(m.trained, (steps * 2 * 2) as u64, "{name}");
            assert!(m.staleness_max <= r.mode.alpha.ceil() as u64, "{name}");
            assert!((0.0..=1.0).contains(&m.gen_share), "{name}");
        }
    }
}
