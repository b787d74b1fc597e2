//! `rollflash_bench::calibrate`: the least-squares fits on known data, what an episode
//! looks like to the simulator, a multi-turn `SimConfig` built from given episodes, and
//! reading a run's metrics.

use rollflash_bench::calibrate::{
    episode_shape, fit_inference, fit_training, latency_dist, least_squares, read_metrics,
    sim_config, slowdown, turn_requests, CalibrateError, Costs, Plan, StepSample, TaskKind, Tasks,
};
use rollflash_core::{PolicyVersion, SamplingParams, Trajectory};
use rollflash_run::config::TrainConfig;
use rollflash_sim::{
    simulate, Contention, Episode, EpisodeTurn, InferenceCost, LatencyDist, LengthDist, TrainCost,
};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + b.abs())
}

/// Steps of many shapes whose times follow `cost` exactly.
fn steps_of(cost: &InferenceCost) -> Vec<StepSample> {
    let mut v = Vec::new();
    for batch in [1u64, 2, 4, 8, 16, 32] {
        for context in [10u64, 100, 400, 2000] {
            for prefill in [0u64, 12, 200] {
                let context = context * batch;
                v.push(StepSample {
                    batch: batch as f64,
                    context: context as f64,
                    prefill: prefill as f64,
                    secs: cost.step_time(batch, context, prefill),
                });
            }
        }
    }
    v
}

#[test]
fn least_squares_recovers_exact_coefficients() {
    // y = 2 + 3·x1 − 0.5·x2 + 7·x3 on points that determine all four.
    let rows: Vec<([f64; 4], f64)> = (0..20)
        .map(|i| {
            let x = [1.0, i as f64, ((i * 7) % 5) as f64, ((i * i) % 11) as f64];
            (x, 2.0 + 3.0 * x[1] - 0.5 * x[2] + 7.0 * x[3])
        })
        .collect();
    let c = least_squares(&rows, &[true; 4]);
    for (got, want) in c.iter().zip([2.0, 3.0, -0.5, 7.0]) {
        assert!(close(*got, want), "{c:?}");
    }
    // An inactive column gets 0 and the others absorb what they can.
    let c = least_squares(&rows, &[true, true, false, true]);
    assert_eq!(c[2], 0.0);
}

#[test]
fn engine_fit_recovers_the_cost_it_was_made_from() {
    let cost = InferenceCost {
        step_s: 2.0e-3,
        seq_s: 2.5e-4,
        context_token_s: 1.0e-6,
        prefill_token_s: 6.0e-5,
    };
    let fit = fit_inference(&steps_of(&cost));
    assert!(close(fit.step_s, cost.step_s), "{fit:?}");
    assert!(close(fit.seq_s, cost.seq_s), "{fit:?}");
    assert!(close(fit.context_token_s, cost.context_token_s), "{fit:?}");
    assert!(close(fit.prefill_token_s, cost.prefill_token_s), "{fit:?}");
    // Measured 1.5× as long as the fit says: a slow-down of 1.5; faster counts as none.
    let slow: Vec<StepSample> = steps_of(&cost)
        .into_iter()
        .map(|s| StepSample {
            secs: 1.5 * s.secs,
            ..s
        })
        .collect();
    assert!(close(slowdown(&slow, &fit), 1.5));
    let fast: Vec<StepSample> = steps_of(&cost)
        .into_iter()
        .map(|s| StepSample {
            secs: 0.5 * s.secs,
            ..s
        })
        .collect();
    assert_eq!(slowdown(&fast, &fit), 1.0);
}

#[test]
fn engine_fit_drops_a_coefficient_that_comes_out_negative() {
    // Steps get *faster* with context here (no real engine does): the unconstrained fit's
    // context coefficient is negative, so it is dropped and the rest refitted.
    let steps: Vec<StepSample> = steps_of(&InferenceCost::default())
        .into_iter()
        .map(|s| StepSample {
            secs: 1e-3 + 1e-4 * s.batch - 1e-7 * s.context + 5e-5 * s.prefill,
            ..s
        })
        .collect();
    let fit = fit_inference(&steps);
    assert_eq!(fit.context_token_s, 0.0);
    assert!(fit.step_s >= 0.0 && fit.seq_s >= 0.0 && fit.prefill_token_s >= 0.0);
    assert!(close(fit.prefill_token_s, 5e-5), "{fit:?}");
}

#[test]
fn training_fit_is_affine_unless_noise_makes_it_negative() {
    let points: Vec<(f64, f64)> = [3000.0, 6000.0, 3000.0, 6000.0]
        .iter()
        .map(|&t| (t, 0.02 + 4e-4 * t))
        .collect();
    let c = fit_training(&points);
    assert!(close(c.step_s, 0.02) && close(c.token_s, 4e-4), "{c:?}");
    assert_eq!((c.parallel_efficiency, c.first_step_s), (1.0, 0.0));
    // A negative intercept: proportional through the origin instead.
    let c = fit_training(&[(1000.0, 0.5), (2000.0, 1.5)]);
    assert_eq!(c.step_s, 0.0);
    assert!(close(
        c.token_s,
        (0.5 * 1000.0 + 1.5 * 2000.0) / (1000.0f64.powi(2) + 2000.0f64.powi(2))
    ));
}

/// A trajectory as the `EnvManager` writes one: a prompt, then model turns (mask 1) with
/// the observations after them (mask 0).
fn trajectory(prompt: usize, turns: &[(usize, usize)], reward: f64) -> Trajectory {
    let mut t = Trajectory {
        reward,
        ..Default::default()
    };
    let mut tok = 0u32;
    let mut push = |t: &mut Trajectory, n: usize, mask: u8| {
        for _ in 0..n {
            tok += 1;
            t.push(
                tok,
                mask,
                if mask == 1 { -1.0 } else { 0.0 },
                PolicyVersion(0),
            );
        }
    };
    push(&mut t, prompt, 0);
    t.prompt_len = prompt;
    for &(response, observation) in turns {
        push(&mut t, response, 1);
        push(&mut t, observation, 0);
    }
    t
}

#[test]
fn an_episode_is_its_turns_and_the_observations_between_them() {
    let t = trajectory(5, &[(3, 4), (2, 6), (1, 0)], 1.0);
    let e = episode_shape(&t);
    assert_eq!(e.prompt_tokens, 5);
    assert_eq!(e.reward, 1.0);
    let turns: Vec<(u64, u64)> = e
        .turns
        .iter()
        .map(|t| (t.response_tokens, t.observation_tokens))
        .collect();
    assert_eq!(turns, vec![(3, 4), (2, 6), (1, 0)]);
    // Its engine requests: each turn's prompt is everything before it, and it generates
    // exactly the measured length, whatever it samples.
    let sampling = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 8,
        stop_token_ids: vec![2],
        ..Default::default()
    };
    let reqs = turn_requests(&t, &sampling);
    let shape: Vec<(usize, usize)> = reqs
        .iter()
        .map(|r| (r.prompt.len(), r.params.max_new_tokens))
        .collect();
    assert_eq!(shape, vec![(5, 3), (12, 2), (20, 1)]);
    assert!(reqs.iter().all(|r| r.params.stop_token_ids.is_empty()));
    assert_eq!(reqs[1].prompt[..], t.tokens[..12]);
}

/// The FrozenLake config, with injected latency and failures, as a run would have it.
fn lake_plan(sync: bool) -> Plan {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/frozenlake.toml");
    let mut sets = vec![
        "env.latency={ kind = \"log_normal\", mean = 0.3, sigma = 1.0, cap_secs = 3.0 }"
            .to_string(),
        "env.failure={ rate = 0.05, kind = \"hang\" }".to_string(),
        "rollout.group_size_redundancy=1".to_string(),
    ];
    if sync {
        sets.push("controller.sync=true".into());
        sets.push("buffer.alpha=0".into());
    }
    let cfg = TrainConfig::load(Some(std::path::Path::new(path)), &sets).unwrap();
    Plan::from_run(&rollflash_run::plan::RunPlan::new(cfg).unwrap()).unwrap()
}

fn costs() -> Costs {
    Costs {
        inference: InferenceCost {
            step_s: 1e-3,
            seq_s: 1e-5,
            context_token_s: 2e-6,
            prefill_token_s: 6e-5,
        },
        training: TrainCost {
            step_s: 0.0,
            token_s: 6e-4,
            parallel_efficiency: 1.0,
            first_step_s: 1.0,
        },
        contention: Contention {
            gen: 1.5,
            train: 1.2,
        },
    }
}

/// Two measured groups of 9 episodes (8 + 1 redundant): one with mixed rewards, one where
/// every episode fell into the same hole.
fn lake_groups() -> Vec<Vec<Episode>> {
    let ep = |turns: u64, reward: f64| Episode {
        prompt_tokens: 40,
        turns: (0..turns)
            .map(|t| EpisodeTurn {
                response_tokens: 3,
                observation_tokens: if t + 1 < turns { 30 } else { 0 },
            })
            .collect(),
        reward,
    };
    vec![
        (0..9).map(|m| ep(6, (m % 2) as f64)).collect(),
        (0..9).map(|_| ep(2, 0.0)).collect(),
    ]
}

#[test]
fn a_multi_turn_sim_config_replays_the_measured_episodes() {
    let plan = lake_plan(false);
    assert_eq!(plan.kind, TaskKind::Episodes);
    assert_eq!(plan.members(), 9);
    let groups = lake_groups();
    let tasks = Tasks::Episodes {
        groups: groups.clone(),
        env_step_s: 4e-6,
    };
    let c = sim_config(&plan, 6, &costs(), &tasks);
    // The run's scheduler, resources and limits.
    assert_eq!(c.steps, 6);
    assert_eq!(c.sched.buffer, plan.buffer);
    assert_eq!(c.sched.buffer.groups_per_batch, 4);
    assert_eq!(c.sched.redundancy, 1);
    assert!(!c.sched.sync);
    assert_eq!(c.cluster.inference_workers, 1);
    assert_eq!(c.cluster.max_running, plan.max_running);
    assert_eq!(c.cluster.contention, costs().contention);
    assert_eq!(c.inference, costs().inference);
    assert_eq!(c.training, costs().training);
    let w = &c.workload;
    assert_eq!(
        (w.max_turns, w.max_new_tokens, w.max_total_tokens),
        (10, 8, 480)
    );
    // The episodes, whole, and the same lengths as distributions (the last turn has no
    // observation after it).
    assert_eq!(w.measured_groups, groups);
    assert_eq!(
        w.prompt_tokens,
        LengthDist::Empirical {
            tokens: vec![40; 18]
        }
    );
    assert_eq!(
        w.response_tokens,
        LengthDist::Empirical {
            tokens: vec![3; 9 * 6 + 9 * 2]
        }
    );
    assert_eq!(
        w.observation_tokens,
        LengthDist::Empirical {
            tokens: vec![30; 9 * 5 + 9]
        }
    );
    // The injected latency before every reset and step, its cap and the failures.
    let lat = LatencyDist::LogNormal {
        mean: 0.3,
        sigma: 1.0,
        cap_secs: Some(3.0),
    };
    assert_eq!(w.step_latency, lat);
    assert_eq!(w.reset_latency, lat);
    assert_eq!(latency_dist(plan.env.latency.as_ref().unwrap()), lat);
    assert_eq!((w.failure_rate, w.hang_fraction), (0.05, 1.0));
    assert_eq!(w.step_timeout_s, 30.0);

    // It simulates, deterministically, and trains only the group with reward variance
    // (6 turns of 3 tokens per sample); the other is filtered.
    let a = simulate(&c).unwrap();
    assert_eq!(a, simulate(&c).unwrap());
    assert_eq!(a.steps.len(), 6);
    assert_eq!(a.trained_response_tokens, 18 * a.trained_samples);
    let acc = a.steps.last().unwrap().accounting;
    assert!(acc.filtered > 0);

    // Without injected latency the environment's own step time is the latency; sync
    // carries over.
    let mut quiet = lake_plan(true);
    quiet.env.latency = None;
    quiet.env.failure = None;
    let c = sim_config(&quiet, 6, &costs(), &tasks);
    assert!(c.sched.sync);
    assert_eq!(c.workload.step_latency, LatencyDist::Fixed { secs: 4e-6 });
    assert_eq!(c.workload.reset_latency, LatencyDist::Fixed { secs: 0.0 });
    assert_eq!(c.workload.failure_rate, 0.0);
    assert!(simulate(&c).unwrap().accounting.balanced());
}

#[test]
fn a_single_turn_sim_config_draws_the_measured_lengths() {
    let cfg = TrainConfig::load(None, &["train.steps=3".to_string()]).unwrap();
    let plan = Plan::from_run(&rollflash_run::plan::RunPlan::new(cfg).unwrap()).unwrap();
    assert_eq!(plan.kind, TaskKind::SingleTurn);
    let tasks = Tasks::SingleTurn {
        prompt_tokens: vec![12, 14],
        response_tokens: vec![30, 50],
    };
    let c = sim_config(&plan, 3, &costs(), &tasks);
    assert!(c.workload.measured_groups.is_empty());
    assert_eq!(c.workload.max_turns, 1);
    assert_eq!(
        c.workload.response_tokens,
        LengthDist::Empirical {
            tokens: vec![30, 50]
        }
    );
    assert_eq!(c.workload.step_latency, LatencyDist::Fixed { secs: 0.0 });
    let r = simulate(&c).unwrap();
    assert_eq!(r.steps.len(), 3);
}

#[test]
fn metrics_are_summed_with_the_first_step_apart() {
    let dir = std::env::temp_dir().join(format!("rollflash-bench-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("metrics.jsonl");
    let line = |step: u32, wall: f64, filtered: u32| {
        format!(
            r#"{{"step": {step}, "samples": 32, "tokens": 900, "wall_s": {wall}, "train_s": 3.0, "weight_sync_ms": 2.0, "started": {}, "filtered": {filtered}}}"#,
            64 * (step + 1)
        )
    };
    std::fs::write(
        &path,
        [
            line(0, 20.0, 8),
            line(1, 6.0, 16),
            String::new(),
            line(2, 7.0, 24),
        ]
        .join("\n"),
    )
    .unwrap();
    let m = read_metrics(&path).unwrap();
    assert_eq!(m.steps, 3);
    assert_eq!(
        (m.samples, m.tokens, m.wall, m.train),
        (96.0, 2700.0, 33.0, 9.0)
    );
    assert!(close(m.sync, 0.006));
    assert_eq!((m.first_samples, m.first_wall), (32.0, 20.0));
    // The accounting is cumulative: the last step's.
    assert_eq!((m.started, m.filtered), (192.0, 24.0));
    // A line without a step's numbers names the key and the line.
    std::fs::write(&path, r#"{"step": 0, "samples": 32, "wall_s": 1.0}"#).unwrap();
    let e = read_metrics(&path).unwrap_err();
    assert!(
        matches!(e, CalibrateError::MetricsField { line: 1, ref key, .. } if key == "tokens"),
        "{e}"
    );
    std::fs::write(&path, "").unwrap();
    assert!(matches!(
        read_metrics(&path),
        Err(CalibrateError::NoSteps(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}
