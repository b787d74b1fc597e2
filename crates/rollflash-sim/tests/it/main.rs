//! Integration tests of `rollflash-sim`: determinism, accounting, the α bound, the
//! synchronous baseline's phases, and the shapes the paper reports; `cpu` checks the core
//! split model. No wall-clock thresholds: everything is in virtual time.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cpu;

use rollflash_core::PauseMode;
use rollflash_sim::scenario::{self, Scale};
use rollflash_sim::{
    simulate, Batching, Episode, EpisodeTurn, LatencyDist, LengthDist, SimConfig, SimError,
    SimReport,
};

/// A small config with a long tail: 4 workers, 4 groups of 4 per step.
fn small(alpha: f64, sync: bool) -> SimConfig {
    let mut c = SimConfig {
        seed: 3,
        steps: 8,
        ..Default::default()
    };
    c.cluster.inference_workers = 4;
    c.cluster.max_running = 8;
    c.sched.buffer.groups_per_batch = 4;
    c.sched.buffer.group_size = 4;
    c.sched.buffer.alpha = alpha;
    c.sched.sync = sync;
    c.workload.response_tokens = LengthDist::LogNormal {
        median: 20.0,
        sigma: 1.0,
    };
    c.workload.max_new_tokens = 200;
    c.workload.max_total_tokens = 256;
    c.training.token_s = 2e-4;
    c
}

fn agentic_small(failure_rate: f64, redundancy: usize) -> SimConfig {
    let mut c = small(1.0, false);
    c.workload.max_turns = 4;
    c.workload.end_prob = 0.2;
    c.workload.observation_tokens = LengthDist::Uniform { min: 2, max: 10 };
    c.workload.step_latency = LatencyDist::LogNormal {
        mean: 0.05,
        sigma: 1.0,
        cap_secs: None,
    };
    c.workload.failure_rate = failure_rate;
    c.workload.hang_fraction = 0.5;
    c.workload.step_timeout_s = 1.0;
    c.sched.redundancy = redundancy;
    c
}

/// Every configuration the checks below run through.
fn variety() -> Vec<(String, SimConfig)> {
    let mut v = Vec::new();
    for (name, alpha, sync) in [
        ("sync", 0.0, true),
        ("a0.5", 0.5, false),
        ("a1", 1.0, false),
        ("a2", 2.0, false),
        ("a4", 4.0, false),
    ] {
        v.push((name.to_string(), small(alpha, sync)));
        let mut keep = small(alpha, sync);
        keep.sched.pause_mode = PauseMode::Keep;
        v.push((format!("{name}-keep"), keep));
    }
    let mut st = small(1.0, false);
    st.cluster.batching = Batching::Static;
    v.push(("static".into(), st));
    let mut lock = agentic_small(0.0, 0);
    lock.sched.lockstep = true;
    lock.sched.sync = true;
    v.push(("lockstep".into(), lock));
    let mut pin = small(2.0, false);
    pin.sched.replication = false;
    v.push(("pinned".into(), pin));
    let mut filt = small(1.0, false);
    filt.sched.buffer.filter = rollflash_core::buffer::GroupFilter::ZeroVariance;
    filt.sched.buffer.extra_groups = 2;
    v.push(("filter".into(), filt));
    v.push(("agentic-fail".into(), agentic_small(0.1, 2)));
    v.push(("agentic-fail-nored".into(), agentic_small(0.1, 0)));
    let mut sticky = agentic_small(0.02, 1);
    sticky.cluster.routing = rollflash_core::proxy::Routing::Sticky;
    v.push(("sticky".into(), sticky));
    v.push(("replay".into(), replayed()));
    v
}

/// An episode of `turns` turns of `response` tokens, 5 observation tokens between them.
fn episode(turns: u64, response: u64, reward: f64) -> Episode {
    Episode {
        prompt_tokens: 12,
        turns: (0..turns)
            .map(|t| EpisodeTurn {
                response_tokens: response,
                observation_tokens: if t + 1 < turns { 5 } else { 0 },
            })
            .collect(),
        reward,
    }
}

/// The agentic config replaying two measured groups: one whose rewards differ, one whose
/// rewards are all 0 (what a zero-variance filter drops).
fn replayed() -> SimConfig {
    let mut c = agentic_small(0.0, 0);
    c.workload.measured_groups = vec![
        (0..4).map(|m| episode(3, 2, (m % 2) as f64)).collect(),
        (0..4).map(|_| episode(2, 2, 0.0)).collect(),
    ];
    c.sched.buffer.filter = rollflash_core::buffer::GroupFilter::ZeroVariance;
    c.sched.buffer.extra_groups = 2;
    c
}

fn run(c: &SimConfig) -> SimReport {
    simulate(c).unwrap_or_else(|e| panic!("simulation failed: {e}"))
}

#[test]
fn same_seed_same_result() {
    for (name, c) in variety() {
        let a = run(&c);
        let b = run(&c);
        assert_eq!(a, b, "{name}: two runs of one config differ");
    }
    // And the seed matters.
    let mut c = small(1.0, false);
    let a = run(&c);
    c.seed += 1;
    let b = run(&c);
    assert_ne!(a.wall_s, b.wall_s);
}

#[test]
fn accounting_balances_in_every_configuration() {
    for (name, c) in variety() {
        let r = run(&c);
        assert_eq!(r.steps.len(), c.steps, "{name}");
        assert!(r.accounting.balanced(), "{name}: {:?}", r.accounting);
        for s in &r.steps {
            assert!(
                s.accounting.balanced(),
                "{name} step {}: {:?}",
                s.step,
                s.accounting
            );
            assert_eq!(
                s.samples,
                c.sched.buffer.groups_per_batch * c.sched.buffer.group_size
            );
        }
        assert_eq!(
            r.trained_samples, r.accounting.trained,
            "{name}: steps and buffer disagree"
        );
        // The run ended: nothing is left generating.
        assert_eq!(r.accounting.running, 0, "{name}");
    }
}

#[test]
fn accounting_balances_in_every_scenario() {
    // The scenario tables run at GPU scale; their configs must balance too.
    let w = scenario::agentic_workload();
    for train in [None, Some(4)] {
        let mut c = scenario::gpu_config(w.clone(), 8, 4, train, 2.0, 3);
        c.workload.failure_rate = 0.05;
        c.sched.redundancy = 2;
        let r = run(&c);
        assert!(r.accounting.balanced(), "{:?}", r.accounting);
        assert!(r.accounting.failed > 0, "failures were injected");
    }
    let c = scenario::gpu_config(scenario::rlvr_workload(), 8, 8, Some(4), 4.0, 3);
    assert!(run(&c).accounting.balanced());
}

#[test]
fn staleness_never_exceeds_alpha() {
    for (name, c) in variety() {
        let r = run(&c);
        let bound = c.sched.effective_buffer().max_staleness();
        assert!(
            r.max_staleness() <= bound,
            "{name}: staleness {} > ⌈α⌉ = {bound}",
            r.max_staleness()
        );
        for (k, _) in &r.staleness {
            assert!(*k <= bound, "{name}");
        }
        if bound > 0 && !name.starts_with("static") {
            assert!(
                r.max_staleness() > 0,
                "{name}: asynchronous run never used an older sample"
            );
        }
    }
}

#[test]
fn sync_never_overlaps_generation_and_training() {
    for mode in [PauseMode::Abort, PauseMode::Keep] {
        let mut c = small(0.0, true);
        c.sched.pause_mode = mode;
        let r = run(&c);
        assert_eq!(r.gen_train_overlap_s, 0.0, "{mode:?}");
        assert!(r.steps.iter().all(|s| s.staleness == 0.0));
    }
    // The asynchronous run does overlap them (the test can fail).
    let r = run(&small(1.0, false));
    assert!(r.gen_train_overlap_s > 0.0);
}

#[test]
fn async_beats_sync_under_a_long_tail() {
    let sync = run(&small(0.0, true));
    let a1 = run(&small(1.0, false));
    let a2 = run(&small(2.0, false));
    assert!(
        a1.samples_per_s() > sync.samples_per_s(),
        "α=1 {} vs sync {}",
        a1.samples_per_s(),
        sync.samples_per_s()
    );
    assert!(a2.samples_per_s() >= a1.samples_per_s() * 0.95);
}

#[test]
fn throughput_grows_with_workers() {
    let mut last = 0.0;
    for workers in [1, 2, 4, 8] {
        let mut c = small(2.0, false);
        c.cluster.inference_workers = workers;
        c.training.token_s = 1e-6;
        let r = run(&c);
        assert!(
            r.samples_per_s() > last,
            "{workers} workers: {} <= {last}",
            r.samples_per_s()
        );
        last = r.samples_per_s();
    }
}

#[test]
fn continuous_batching_beats_static_batches_under_a_tail() {
    let mut st = small(0.0, true);
    st.cluster.max_running = 2;
    st.cluster.batching = Batching::Static;
    let mut cont = st.clone();
    cont.cluster.batching = Batching::Continuous;
    assert!(run(&cont).samples_per_s() > run(&st).samples_per_s());
}

#[test]
fn redundancy_rescues_groups_from_failing_environments() {
    let none = run(&agentic_small(0.1, 0));
    let red = run(&agentic_small(0.1, 3));
    assert!(none.accounting.failed > red.accounting.failed);
    assert!(red.samples_per_s() > none.samples_per_s());
    // Redundancy without failures only costs the surplus: it is aborted and counted.
    let r = run(&agentic_small(0.0, 2));
    assert!(r.accounting.aborted > 0);
    assert_eq!(r.accounting.failed, 0);
}

#[test]
fn abort_mode_preempts_and_resumes_requests() {
    let mut c = small(2.0, false);
    c.training.token_s = 1e-5;
    c.workload.response_tokens = LengthDist::Fixed { tokens: 150 };
    let r = run(&c);
    assert!(r.proxy.preempted > 0, "{:?}", r.proxy);
    c.sched.pause_mode = PauseMode::Keep;
    assert_eq!(run(&c).proxy.preempted, 0);
}

#[test]
fn decode_cost_model_matches_a_hand_computation() {
    // One request of 10 tokens on one worker, nothing else: prefill + 10 decode steps.
    let mut c = SimConfig {
        steps: 1,
        ..Default::default()
    };
    c.sched.buffer.groups_per_batch = 1;
    c.sched.buffer.group_size = 1;
    c.sched.buffer.alpha = 0.0;
    c.workload.prompt_tokens = LengthDist::Fixed { tokens: 5 };
    c.workload.response_tokens = LengthDist::Fixed { tokens: 10 };
    c.inference.step_s = 1e-3;
    c.inference.seq_s = 1e-4;
    c.inference.context_token_s = 1e-5;
    c.inference.prefill_token_s = 1e-3;
    c.training.step_s = 0.5;
    c.training.token_s = 0.01;
    c.sync.fixed_s = 0.25;
    let r = run(&c);
    // Contexts 5, 6, …, 14 over the ten steps.
    let decode: f64 = (0..10).map(|k| 1e-3 + 1e-4 + 1e-5 * (5 + k) as f64).sum();
    let gen = 5.0 * 1e-3 + decode;
    let train = 0.5 + 0.01 * 15.0;
    let expect = gen + train + 0.25;
    assert!((r.wall_s - expect).abs() < 1e-9, "{} vs {expect}", r.wall_s);
    assert_eq!(r.steps[0].response_tokens, 10);
    assert_eq!(r.steps[0].seq_tokens, 15);
}

#[test]
fn invalid_settings_name_their_field() {
    let mut c = SimConfig::default();
    c.workload.failure_rate = 1.5;
    let e = simulate(&c).unwrap_err();
    assert!(matches!(e, SimError::Config { ref field, .. } if field == "workload.failure_rate"));
    // An unknown routing policy cannot be built at all: serde refuses it by name.
    let e = serde_json::from_str::<SimConfig>(r#"{"cluster": {"routing": "random"}}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("random") && e.contains("least_loaded"), "{e}");
    let mut c = SimConfig::default();
    c.workload.response_tokens = LengthDist::LogNormal {
        median: -1.0,
        sigma: 1.0,
    };
    assert!(simulate(&c)
        .unwrap_err()
        .to_string()
        .contains("workload.response_tokens"));
}

#[test]
fn measured_groups_are_replayed_whole() {
    let r = run(&replayed());
    // Only the first group's episodes have reward variance, so only they are trained:
    // 3 turns of 2 tokens each, on a 12-token prompt with two 5-token observations.
    assert!(r.trained_samples > 0);
    assert_eq!(r.trained_response_tokens, 6 * r.trained_samples);
    for s in &r.steps {
        assert_eq!(s.seq_tokens, (12 + 6 + 10) * s.samples as u64);
    }
    // The second group's never are: the filter drops every one of them.
    let a = r.steps.last().map(|s| s.accounting).unwrap();
    assert!(a.filtered > 0);
    assert_eq!(a.filtered % 4, 0);
    // An empty group is refused, naming it.
    let mut c = replayed();
    c.workload.measured_groups.push(Vec::new());
    let e = simulate(&c).unwrap_err().to_string();
    assert!(e.contains("workload.measured_groups[2]"), "{e}");
}

#[test]
fn capped_latency_never_exceeds_its_cap() {
    use rand::SeedableRng;
    let d = LatencyDist::LogNormal {
        mean: 1.0,
        sigma: 2.0,
        cap_secs: Some(1.5),
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let xs: Vec<f64> = (0..2000).map(|_| d.sample(&mut rng)).collect();
    assert!(xs.iter().all(|&x| (0.0..=1.5).contains(&x)));
    assert!(xs.contains(&1.5));
    let json = serde_json::to_string(&d).unwrap();
    assert!(json.contains("cap_secs"), "{json}");
    let uncapped: LatencyDist =
        serde_json::from_str(r#"{"kind": "log_normal", "mean": 1.0, "sigma": 1.0}"#).unwrap();
    assert!(!serde_json::to_string(&uncapped)
        .unwrap()
        .contains("cap_secs"));
}

#[test]
fn config_round_trips_through_serde_with_defaults() {
    let c: SimConfig =
        serde_json::from_str(r#"{"steps": 3, "cluster": {"inference_workers": 2}}"#).unwrap();
    assert_eq!(c.steps, 3);
    assert_eq!(c.cluster.inference_workers, 2);
    assert_eq!(
        c.cluster.max_running,
        SimConfig::default().cluster.max_running
    );
    assert!(serde_json::from_str::<SimConfig>(r#"{"stepz": 3}"#).is_err());
}

#[test]
fn quick_scenarios_produce_full_tables() {
    let tables = scenario::all(Scale::Quick).unwrap();
    assert_eq!(tables.len(), 6);
    for t in &tables {
        assert!(!t.rows.is_empty(), "{}", t.name);
        for r in &t.rows {
            assert_eq!(r.len(), t.columns.len(), "{}", t.name);
        }
        assert!(t.to_markdown().contains(&t.title));
        assert_eq!(t.to_csv().lines().count(), t.rows.len() + 1);
    }
    // The α table's shape: asynchrony helps on a long tail.
    let alpha = &tables[0];
    let speedup = |row: usize| alpha.rows[row][3].value().unwrap();
    assert_eq!(speedup(0), 1.0);
    assert!(speedup(3) > 1.0, "α=2 speed-up {}", speedup(3));
}

#[test]
fn only_the_first_step_pays_the_one_time_cost() {
    let base = small(0.0, true);
    let mut warm = base.clone();
    warm.training.first_step_s = 0.5;
    let (a, b) = (run(&base), run(&warm));
    assert!((b.steps[0].train_s - a.steps[0].train_s - 0.5).abs() < 1e-6);
    for (x, y) in a.steps.iter().zip(&b.steps).skip(1) {
        assert!((x.train_s - y.train_s).abs() < 1e-6);
    }
}

#[test]
fn shared_hardware_slows_only_overlapping_work() {
    let slow = |mut c: SimConfig| {
        c.cluster.contention.gen = 2.0;
        c.cluster.contention.train = 3.0;
        c
    };
    // Sync never overlaps generation and training: contention changes nothing.
    let sync = small(0.0, true);
    assert_eq!(run(&sync).wall_s, run(&slow(sync.clone())).wall_s);
    // Async overlaps them: both slow down, and accounting still balances.
    let a = small(1.0, false);
    let fast = run(&a);
    let shared = run(&slow(a));
    assert!(shared.wall_s > fast.wall_s);
    assert!(shared.accounting.balanced());
    let mean_train = |r: &SimReport| r.steps.iter().map(|s| s.train_s).sum::<f64>();
    assert!(mean_train(&shared) > mean_train(&fast));
}
