//! The simulated run: a `SimConfig` from the run's [`Plan`], the costs calibrated on this
//! machine and the workload measured from the run's starting policy. Pure, so tests can
//! build one from given episodes.

use rollflash_env::latency::{FailureKind, LatencyConfig};
use rollflash_sim::{
    Contention, Episode, InferenceCost, LatencyDist, LengthDist, SimConfig, TrainCost,
};

use super::plan::Plan;

/// The costs calibrated on this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Costs {
    pub inference: InferenceCost,
    pub training: TrainCost,
    pub contention: Contention,
}

/// The workload measured from the run's starting policy.
#[derive(Debug, Clone, PartialEq)]
pub enum Tasks {
    /// Single-turn: every sample's prompt and response length.
    SingleTurn {
        prompt_tokens: Vec<u64>,
        response_tokens: Vec<u64>,
    },
    /// Multi-turn: whole measured groups of episodes, replayed by the simulator, and the
    /// mean time the environment itself took per step (without injected latency).
    Episodes {
        groups: Vec<Vec<Episode>>,
        env_step_s: f64,
    },
}

/// A latency of `rollflash-env`'s `Flaky` as the simulator's distribution.
pub fn latency_dist(l: &LatencyConfig) -> LatencyDist {
    match *l {
        LatencyConfig::Fixed { secs } => LatencyDist::Fixed { secs },
        LatencyConfig::Uniform { low, high } => LatencyDist::Uniform {
            min: low,
            max: high,
        },
        LatencyConfig::LogNormal {
            mean,
            sigma,
            cap_secs,
        } => LatencyDist::LogNormal {
            mean,
            sigma,
            cap_secs,
        },
    }
}

/// The simulation of `steps` steps of the run `plan` describes, with `costs` and `tasks`.
pub fn sim_config(plan: &Plan, steps: usize, costs: &Costs, tasks: &Tasks) -> SimConfig {
    let mut sim = SimConfig {
        seed: plan.seed,
        steps,
        ..Default::default()
    };
    sim.cluster.inference_workers = plan.engines;
    sim.cluster.max_running = plan.max_running;
    sim.cluster.routing = plan.routing;
    sim.cluster.train_workers = 1;
    sim.cluster.contention = costs.contention.clone();
    sim.inference = costs.inference.clone();
    sim.training = costs.training.clone();
    let w = &mut sim.workload;
    w.max_new_tokens = plan.max_new_tokens as u64;
    w.max_total_tokens = plan.max_total_tokens as u64;
    w.max_turns = plan.max_turns.max(1) as u32;
    w.step_timeout_s = plan.step_timeout.as_secs_f64();
    match tasks {
        Tasks::SingleTurn {
            prompt_tokens,
            response_tokens,
        } => {
            w.prompt_tokens = LengthDist::Empirical {
                tokens: prompt_tokens.clone(),
            };
            w.response_tokens = LengthDist::Empirical {
                tokens: response_tokens.clone(),
            };
            w.step_latency = LatencyDist::Fixed { secs: 0.0 };
        }
        Tasks::Episodes { groups, env_step_s } => {
            // The per-turn distributions describe the same episodes (they are what an
            // independent-draw model would use); the replay is what the simulation runs.
            let all = || groups.iter().flatten();
            w.prompt_tokens = LengthDist::Empirical {
                tokens: all().map(|e| e.prompt_tokens).collect(),
            };
            w.response_tokens = LengthDist::Empirical {
                tokens: all()
                    .flat_map(|e| e.turns.iter().map(|t| t.response_tokens))
                    .collect(),
            };
            w.observation_tokens = LengthDist::Empirical {
                tokens: all()
                    .flat_map(|e| {
                        let n = e.turns.len().saturating_sub(1);
                        e.turns[..n].iter().map(|t| t.observation_tokens)
                    })
                    .collect(),
            };
            if let LengthDist::Empirical { tokens } = &w.observation_tokens {
                if tokens.is_empty() {
                    w.observation_tokens = LengthDist::Fixed { tokens: 0 };
                }
            }
            w.measured_groups = groups.clone();
            w.step_latency = LatencyDist::Fixed { secs: *env_step_s };
        }
    }
    // Injected latency sleeps before every reset and step; injected failures fail a step.
    if let Some(l) = &plan.env.latency {
        w.reset_latency = latency_dist(l);
        w.step_latency = latency_dist(l);
    }
    if let Some(f) = &plan.env.failure {
        w.failure_rate = f.rate;
        w.hang_fraction = match f.kind {
            FailureKind::Hang => 1.0,
            FailureKind::Error | FailureKind::Garbage => 0.0,
        };
    }
    sim.sched.buffer = plan.buffer.clone();
    sim.sched.sync = plan.sync;
    sim.sched.redundancy = plan.redundancy;
    sim.sched.pause_mode = plan.pause_mode;
    sim
}
