//! Tests of `envs`: the conformance suite every `Env` must pass, then each environment's
//! dynamics, then the registry.

use proptest::prelude::*;
use rollflash_env::envs::frozen_lake::{
    self, generate_random_map, transition_table, transitions, Dynamics, Lake, MapChoice,
    Transition, MAP_4X4, MAP_8X8,
};
use rollflash_env::envs::sokoban::{self, generate_room, solve_bfs, MoveOutcome, Room};
use rollflash_env::envs::tool_use::{self, calc, parse_action, CalcError, ToolAction};
use rollflash_env::envs::{
    make_env, parse_direction, Direction, EnvConfig, EnvSpec, FrozenLake, FrozenLakeConfig,
    Sokoban, SokobanConfig, ToolUse, ToolUseConfig, ENV_NAMES,
};
use rollflash_env::math_task::{MathEnv, MathTaskConfig};
use rollflash_env::{Env, EnvError, Step};

// ---------------------------------------------------------------------------------------------
// Conformance: the contract of `Env`, run against every implementation (also from `remote`).
// ---------------------------------------------------------------------------------------------

/// Steps cycled through by the conformance episodes: valid moves for the grid worlds, a tool
/// call and a wrong answer for tool use, and junk everyone must survive.
pub(crate) const CONFORMANCE_ACTIONS: [&str; 6] = [
    "Left",
    "<tool>calc: 2*3</tool>",
    "Down",
    "nonsense \u{1F600}",
    "Right <answer>12</answer>",
    "Up",
];

/// Most steps a conformance episode may take before the environment must have ended it.
const MAX_CONFORMANCE_STEPS: usize = 1_000;

/// Runs one episode with the conformance actions; returns every step.
async fn episode(env: &mut dyn Env, seed: u64) -> Result<Vec<Step>, EnvError> {
    env.reset(seed).await?;
    let mut steps = Vec::new();
    for action in CONFORMANCE_ACTIONS
        .iter()
        .cycle()
        .take(MAX_CONFORMANCE_STEPS)
    {
        let s = env.step(action).await?;
        let done = s.done();
        steps.push(s);
        if done {
            return Ok(steps);
        }
    }
    panic!("episode did not end within {MAX_CONFORMANCE_STEPS} steps");
}

/// The `Env` contract: step before reset is `OutOfOrder`; the same seed gives the same
/// observation and the same episode, on the same and on a fresh instance; every episode ends;
/// a step after the end is `OutOfOrder`; reset after the end starts again; rewards are finite.
pub(crate) async fn check_conformance(make: impl Fn() -> Box<dyn Env>) {
    let mut env = make();
    assert!(
        matches!(env.step("Left").await, Err(EnvError::OutOfOrder(_))),
        "step before reset must be OutOfOrder"
    );
    for seed in [0u64, 1, 42, u64::MAX] {
        let a = env.reset(seed).await.expect("reset");
        let b = env.reset(seed).await.expect("reset again");
        assert_eq!(
            a.observation, b.observation,
            "seed {seed}: same seed, same start"
        );
        assert!(!a.observation.is_empty());
        assert!(
            a.observation.is_ascii(),
            "observations are ASCII: {:?}",
            a.observation
        );
        let c = make().reset(seed).await.expect("reset fresh");
        assert_eq!(
            a.observation, c.observation,
            "seed {seed}: fresh instance differs"
        );

        let run1 = episode(env.as_mut(), seed).await.expect("episode");
        let last = run1.last().expect("at least one step");
        assert!(last.done());
        assert!(run1[..run1.len() - 1].iter().all(|s| !s.done()));
        assert!(run1.iter().all(|s| s.reward.is_finite()));
        assert!(
            matches!(env.step("Left").await, Err(EnvError::OutOfOrder(_))),
            "step after the end must be OutOfOrder"
        );
        let run2 = episode(make().as_mut(), seed).await.expect("episode 2");
        assert_eq!(
            run1, run2,
            "seed {seed}: same seed and actions, same episode"
        );
    }
}

fn frozen_lake_env() -> Box<dyn Env> {
    Box::new(FrozenLake::new(FrozenLakeConfig::default()).expect("frozen lake"))
}

/// Builds a fresh environment for the conformance suite.
type MakeEnv = fn() -> Box<dyn Env>;

fn every_builtin() -> Vec<(&'static str, MakeEnv)> {
    vec![
        ("frozen_lake", frozen_lake_env),
        ("frozen_lake_random_8x8", || {
            Box::new(
                FrozenLake::new(FrozenLakeConfig {
                    map: MapChoice::Random {
                        size: 8,
                        p: 0.8,
                        seed: None,
                    },
                    ..Default::default()
                })
                .expect("frozen lake"),
            )
        }),
        ("sokoban", || {
            Box::new(Sokoban::new(SokobanConfig::default()).expect("sokoban"))
        }),
        ("tool_use", || {
            Box::new(ToolUse::new(ToolUseConfig::default()).expect("tool use"))
        }),
        ("math", || {
            Box::new(MathEnv::new(MathTaskConfig::default()).expect("math"))
        }),
        ("registry_defaults", || {
            let spec: EnvSpec =
                serde_json::from_str(r#"{"name": "sokoban", "num_boxes": 1}"#).expect("spec");
            make_env(&spec).expect("make_env")
        }),
    ]
}

#[tokio::test]
async fn every_builtin_env_conforms() {
    for (name, make) in every_builtin() {
        eprintln!("conformance: {name}");
        check_conformance(make).await;
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Arbitrary action text never panics and never errors during an episode: unparsable text
    /// is an invalid move, not a failure.
    #[test]
    fn random_actions_never_panic(
        seed in any::<u64>(),
        actions in proptest::collection::vec(
            prop_oneof![
                ".*",
                "(Left|Right|Up|Down|[0-3]| |<tool>|</tool>|<answer>|</answer>|calc:|[-+*/()0-9])*",
            ],
            1..30,
        ),
    ) {
        let rt = rt();
        for (name, make) in every_builtin() {
            rt.block_on(async {
                let mut env = make();
                env.reset(seed).await.expect("reset");
                for a in &actions {
                    match env.step(a).await {
                        Ok(s) => {
                            assert!(s.reward.is_finite(), "{name}: reward {}", s.reward);
                            if s.done() {
                                break;
                            }
                        }
                        Err(e) => panic!("{name}: step({a:?}) failed: {e}"),
                    }
                }
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// FrozenLake
// ---------------------------------------------------------------------------------------------

const THIRD: f64 = 1.0 / 3.0;
/// A perpendicular slip, computed as Gymnasium computes it: `(1 - success_rate) / 2`, which in
/// floating point is not exactly `THIRD`.
const SIDE: f64 = (1.0 - THIRD) / 2.0;

fn t(prob: f64, next_state: usize, reward: f64, terminated: bool) -> Transition {
    Transition {
        prob,
        next_state,
        reward,
        terminated,
    }
}

fn lake4() -> Lake {
    Lake::parse(&MAP_4X4).expect("4x4")
}

/// Entries of Gymnasium's `P[s][a]` for the 4x4 map, derived by hand from the rules: slippery
/// order is a-1, a, a+1 (mod 4) with 0 Left, 1 Down, 2 Right, 3 Up.
#[test]
fn transitions_match_hand_derived_gymnasium_entries() {
    let lake = lake4();
    let slip = Dynamics::default();
    // Corner, Left: Up (stay), Left (stay), Down (to 4).
    assert_eq!(
        transitions(&lake, 0, Direction::Left, &slip),
        vec![
            t(SIDE, 0, 0.0, false),
            t(THIRD, 0, 0.0, false),
            t(SIDE, 4, 0.0, false)
        ]
    );
    // Corner, Down: Left (stay), Down (4), Right (1).
    assert_eq!(
        transitions(&lake, 0, Direction::Down, &slip),
        vec![
            t(SIDE, 0, 0.0, false),
            t(THIRD, 4, 0.0, false),
            t(SIDE, 1, 0.0, false)
        ]
    );
    // Corner, Up: Right (1), Up (stay), Left (stay).
    assert_eq!(
        transitions(&lake, 0, Direction::Up, &slip),
        vec![
            t(SIDE, 1, 0.0, false),
            t(THIRD, 0, 0.0, false),
            t(SIDE, 0, 0.0, false)
        ]
    );
    // Next to the goal, Right: Down (stay, bottom edge), Right (goal), Up (10).
    assert_eq!(
        transitions(&lake, 14, Direction::Right, &slip),
        vec![
            t(SIDE, 14, 0.0, false),
            t(THIRD, 15, 1.0, true),
            t(SIDE, 10, 0.0, false)
        ]
    );
    // State 1, Down: Left (0), Down (hole 5), Right (2).
    assert_eq!(
        transitions(&lake, 1, Direction::Down, &slip),
        vec![
            t(SIDE, 0, 0.0, false),
            t(THIRD, 5, 0.0, true),
            t(SIDE, 2, 0.0, false)
        ]
    );
    // Holes and the goal absorb.
    for s in [5, 7, 11, 12, 15] {
        for a in Direction::ALL {
            assert_eq!(transitions(&lake, s, a, &slip), vec![t(1.0, s, 0.0, true)]);
        }
    }
    // Not slippery: one certain entry.
    let det = Dynamics {
        is_slippery: false,
        ..Dynamics::default()
    };
    assert_eq!(
        transitions(&lake, 0, Direction::Right, &det),
        vec![t(1.0, 1, 0.0, false)]
    );
    assert_eq!(
        transitions(&lake, 0, Direction::Up, &det),
        vec![t(1.0, 0, 0.0, false)]
    );
    assert_eq!(
        transitions(&lake, 14, Direction::Right, &det),
        vec![t(1.0, 15, 1.0, true)]
    );
    // success_rate splits the rest evenly between the perpendicular moves.
    let half = Dynamics {
        success_rate: 0.5,
        ..Dynamics::default()
    };
    let probs: Vec<f64> = transitions(&lake, 6, Direction::Down, &half)
        .iter()
        .map(|t| t.prob)
        .collect();
    assert_eq!(probs, vec![0.25, 0.5, 0.25]);
    // reward_schedule applies to goal, hole, frozen.
    let sched = Dynamics {
        reward_schedule: (5.0, -1.0, -0.01),
        ..det
    };
    assert_eq!(
        transitions(&lake, 1, Direction::Down, &sched),
        vec![t(1.0, 5, -1.0, true)]
    );
    assert_eq!(
        transitions(&lake, 0, Direction::Down, &sched),
        vec![t(1.0, 4, -0.01, false)]
    );
}

#[test]
fn transition_table_is_a_distribution_everywhere() {
    let lake = Lake::parse(&MAP_8X8).expect("8x8");
    let table = transition_table(&lake, &Dynamics::default());
    assert_eq!(table.len(), 64);
    for (s, row) in table.iter().enumerate() {
        for ts in row {
            let total: f64 = ts.iter().map(|t| t.prob).sum();
            assert!((total - 1.0).abs() < 1e-12, "state {s}: {total}");
            for t in ts {
                assert!(t.next_state < 64);
                let (r, c, nr, nc) = (s / 8, s % 8, t.next_state / 8, t.next_state % 8);
                assert!(
                    r.abs_diff(nr) + c.abs_diff(nc) <= 1,
                    "moves are one cell at most"
                );
            }
        }
    }
}

fn lake_env(slippery: bool) -> FrozenLake {
    FrozenLake::new(FrozenLakeConfig {
        is_slippery: slippery,
        ..Default::default()
    })
    .expect("frozen lake")
}

fn state(s: &Step) -> u64 {
    s.info["state"].as_u64().expect("state in info")
}

#[tokio::test]
async fn slippery_moves_go_each_way_a_third_of_the_time() {
    let mut env = lake_env(true);
    let mut counts = [0usize; 16];
    let n = 6_000;
    for seed in 0..n {
        env.reset(seed).await.expect("reset");
        let s = env.step("Down").await.expect("step");
        counts[state(&s) as usize] += 1;
    }
    // From the corner, Down slips Left (stay at 0) or Right (1), or goes Down (4).
    for s in [0, 1, 4] {
        let f = counts[s] as f64 / n as f64;
        assert!((f - THIRD).abs() < 0.025, "state {s}: frequency {f}");
    }
    assert_eq!(counts[0] + counts[1] + counts[4], n as usize);
}

#[tokio::test]
async fn not_slippery_walks_the_shortest_path_to_the_goal() {
    let mut env = lake_env(false);
    let r = env.reset(0).await.expect("reset");
    assert!(
        r.observation.contains("PFFF\nFHFH\nFFFH\nHFFG"),
        "{}",
        r.observation
    );
    assert!(r.observation.contains("Left, Down, Right or Up"));
    let path = ["Down", "Down", "Right", "Right", "Down", "Right"];
    let states = [4, 8, 9, 10, 14, 15];
    for (i, (a, want)) in path.iter().zip(states).enumerate() {
        let s = env.step(a).await.expect("step");
        assert_eq!(state(&s), want);
        let last = i == path.len() - 1;
        assert_eq!(s.terminated, last);
        assert_eq!(s.reward, if last { 1.0 } else { 0.0 });
        assert!(!s.truncated);
    }
}

#[tokio::test]
async fn hole_terminates_with_zero_reward() {
    let mut env = lake_env(false);
    env.reset(3).await.expect("reset");
    env.step("Right").await.expect("step");
    let s = env.step("Down").await.expect("step");
    assert_eq!(state(&s), 5);
    assert!(s.terminated && !s.truncated);
    assert_eq!(s.reward, 0.0);
    assert!(s.observation.contains("hole"));
}

#[tokio::test]
async fn edges_keep_the_player_in_place() {
    let mut env = lake_env(false);
    env.reset(0).await.expect("reset");
    for a in ["Left", "Up", "0", "3"] {
        let s = env.step(a).await.expect("step");
        assert_eq!(state(&s), 0, "{a}");
        assert_eq!(s.info["invalid_action"], false);
    }
}

#[tokio::test]
async fn truncation_follows_gymnasium_time_limits() {
    for (map, limit) in [(MapChoice::Map4x4, 100), (MapChoice::Map8x8, 200)] {
        let mut env = FrozenLake::new(FrozenLakeConfig {
            map,
            is_slippery: false,
            ..Default::default()
        })
        .expect("env");
        env.reset(0).await.expect("reset");
        for i in 1..=limit {
            let s = env.step("Left").await.expect("step");
            assert_eq!(s.truncated, i == limit, "step {i}");
            assert!(!s.terminated);
        }
        assert!(matches!(
            env.step("Left").await,
            Err(EnvError::OutOfOrder(_))
        ));
    }
}

#[tokio::test]
async fn invalid_actions_are_penalised_no_ops() {
    let mut env = FrozenLake::new(FrozenLakeConfig {
        is_slippery: false,
        invalid_action_penalty: 0.5,
        ..Default::default()
    })
    .expect("env");
    env.reset(0).await.expect("reset");
    env.step("Right").await.expect("step");
    let s = env.step("jump!").await.expect("step");
    assert_eq!(state(&s), 1);
    assert_eq!(s.reward, -0.5);
    assert!(!s.done());
    assert_eq!(s.info["invalid_action"], true);
    assert!(s.observation.contains("Invalid move"));
}

#[test]
fn direction_parsing_takes_the_last_direction_word() {
    assert_eq!(parse_direction("Right", false), Some(Direction::Right));
    assert_eq!(parse_direction("  dOwN. ", false), Some(Direction::Down));
    assert_eq!(
        parse_direction("not Up... Left!", false),
        Some(Direction::Left)
    );
    assert_eq!(parse_direction("2", true), Some(Direction::Right));
    assert_eq!(parse_direction("2", false), None);
    assert_eq!(parse_direction("move 3", true), Some(Direction::Up));
    assert_eq!(parse_direction("4 upward leftist", true), None);
    assert_eq!(parse_direction("", true), None);
}

#[test]
fn random_maps_are_solvable_and_deterministic() {
    for seed in 0..200 {
        let rows = generate_random_map(8, 0.8, seed).expect("map");
        assert_eq!(rows, generate_random_map(8, 0.8, seed).expect("map"));
        assert_eq!(rows.len(), 8);
        assert!(rows[0].starts_with('S') && rows[7].ends_with('G'));
        let lake = Lake::parse(&rows).expect("parse");
        assert!(lake.has_path(), "seed {seed}: {rows:?}");
    }
    // Low p forces many rejected boards; the result must still be solvable.
    let lake = Lake::parse(&generate_random_map(6, 0.55, 9).expect("map")).expect("parse");
    assert!(lake.has_path());
    // The 8x8 built-in map is solvable, a walled-in goal is not.
    assert!(Lake::parse(&MAP_8X8).expect("8x8").has_path());
    assert!(!Lake::parse(&["SFH", "FHG"]).expect("parse").has_path());
}

#[test]
fn frozen_lake_config_errors_name_the_field() {
    let err = |cfg: FrozenLakeConfig| match FrozenLake::new(cfg) {
        Err(EnvError::Config { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    };
    assert_eq!(
        err(FrozenLakeConfig {
            success_rate: 1.5,
            ..Default::default()
        }),
        "success_rate"
    );
    assert_eq!(
        err(FrozenLakeConfig {
            map: MapChoice::Random {
                size: 8,
                p: 0.0,
                seed: None
            },
            ..Default::default()
        }),
        "map.random.p"
    );
    assert_eq!(
        err(FrozenLakeConfig {
            map: MapChoice::Custom(vec!["SFX".into()]),
            ..Default::default()
        }),
        "map"
    );
    assert_eq!(
        err(FrozenLakeConfig {
            max_steps: Some(0),
            ..Default::default()
        }),
        "max_steps"
    );
}

#[tokio::test]
async fn random_lake_changes_with_the_seed_unless_fixed() {
    let random = |seed| FrozenLakeConfig {
        map: MapChoice::Random {
            size: 6,
            p: 0.7,
            seed,
        },
        ..Default::default()
    };
    let mut per_episode = FrozenLake::new(random(None)).expect("env");
    let mut observations = std::collections::HashSet::new();
    for seed in 0..20 {
        observations.insert(per_episode.reset(seed).await.expect("reset").observation);
    }
    assert!(
        observations.len() > 10,
        "random maps should vary with the seed"
    );
    let mut fixed = FrozenLake::new(random(Some(5))).expect("env");
    let a = fixed.reset(1).await.expect("reset").observation;
    let b = fixed.reset(2).await.expect("reset").observation;
    assert_eq!(a, b);
    let (lake, _) = fixed.position().expect("started");
    assert_eq!(lake.rows(), generate_random_map(6, 0.7, 5).expect("map"));
    assert!(frozen_lake::render(lake, 0).starts_with('P'));
}

// ---------------------------------------------------------------------------------------------
// Sokoban
// ---------------------------------------------------------------------------------------------

fn room(text: &str) -> Room {
    Room::parse(text).expect("room")
}

#[test]
fn push_rules() {
    // A push onto the target solves the room.
    let mut r = room("#####\n#@$.#\n#####");
    assert!(!r.is_solved());
    assert_eq!(r.apply(Direction::Right), MoveOutcome::Pushed);
    assert!(r.is_solved());
    assert_eq!(r.render(), "#####\n#_@*#\n#####\n");
    // A box against a wall does not move, nor does the player.
    let mut r = room("######\n#.@$##\n######");
    assert_eq!(r.apply(Direction::Right), MoveOutcome::Blocked);
    assert_eq!(r.render(), "######\n#.@$##\n######\n");
    // Two boxes in a row do not move.
    let mut r = room("#######\n#@$$..#\n#######");
    assert_eq!(r.apply(Direction::Right), MoveOutcome::Blocked);
    // Walls block walking; floor does not.
    let mut r = room("#####\n#@_.#\n#_$_#\n#####");
    assert_eq!(r.apply(Direction::Up), MoveOutcome::Blocked);
    assert_eq!(r.apply(Direction::Left), MoveOutcome::Blocked);
    assert_eq!(r.apply(Direction::Right), MoveOutcome::Walked);
    // Pushing the box up from below needs the player under it: walk around.
    assert_eq!(r.apply(Direction::Right), MoveOutcome::Walked);
    assert_eq!(r.render(), "#####\n#__+#\n#_$_#\n#####\n");
    // Parse errors.
    assert!(Room::parse("#@$#").is_err(), "box without target");
    assert!(Room::parse("#$.#").is_err(), "no player");
    assert!(Room::parse("#@$.x#").is_err(), "unknown symbol");
}

#[tokio::test]
async fn sokoban_rewards_follow_gym_sokoban() {
    let mut env = Sokoban::new(SokobanConfig::default()).expect("env");
    // Walk into a wall: only the step penalty.
    env.reset_to(room("#######\n#@*_.$#\n#######"));
    let s = env.step("Left").await.expect("step");
    assert!((s.reward - -0.1).abs() < 1e-12);
    assert!(s.observation.contains("blocked"));
    // Push a box off its target: -0.1 - 1.
    let s = env.step("Right").await.expect("step");
    assert!((s.reward - -1.1).abs() < 1e-12, "{}", s.reward);
    assert_eq!(s.info["pushed"], true);
    assert_eq!(s.observation.lines().nth(2), Some("#_+$.$#"));
    // Push it onto the other target: -0.1 + 1; the last box then solves for +10 more.
    let s = env.step("Right").await.expect("step");
    assert!((s.reward - 0.9).abs() < 1e-12, "{}", s.reward);
    assert!(!s.done());
    // Unparsable: a no-op with the step penalty.
    let s = env.step("???").await.expect("step");
    assert!((s.reward - -0.1).abs() < 1e-12);
    assert_eq!(s.info["invalid_action"], true);

    env.reset_to(room("#####\n#@$.#\n#####"));
    let s = env.step("right").await.expect("step");
    assert!((s.reward - 10.9).abs() < 1e-12, "{}", s.reward);
    assert!(s.terminated && !s.truncated);
    assert!(s.observation.contains("Solved"));
    assert!(matches!(
        env.step("Left").await,
        Err(EnvError::OutOfOrder(_))
    ));
}

#[tokio::test]
async fn sokoban_truncates_at_max_steps() {
    let mut env = Sokoban::new(SokobanConfig {
        max_steps: 3,
        ..Default::default()
    })
    .expect("env");
    env.reset(11).await.expect("reset");
    let flags: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(env.step("wait").await.expect("step").truncated);
        }
        v
    };
    assert_eq!(flags, vec![false, false, true]);
}

#[test]
fn generated_rooms_are_solved_by_their_recorded_solution() {
    let cfg = SokobanConfig::default();
    for seed in 0..200 {
        let g = generate_room(&cfg, seed).expect("room");
        assert_eq!(g, generate_room(&cfg, seed).expect("room"), "deterministic");
        assert_eq!(g.room.num_boxes(), cfg.num_boxes);
        assert_eq!((g.room.width(), g.room.height()), (cfg.width, cfg.height));
        assert!(!g.room.is_solved(), "seed {seed}: starts solved");
        assert!(
            g.solution.len() <= cfg.max_steps as usize,
            "solvable within the episode"
        );
        let mut r = g.room.clone();
        for d in &g.solution {
            assert_ne!(
                r.apply(*d),
                MoveOutcome::Blocked,
                "seed {seed}: replay blocked"
            );
        }
        assert!(r.is_solved(), "seed {seed}:\n{}", g.room.render());
    }
}

#[test]
fn small_generated_rooms_are_solved_by_bfs() {
    for boxes in [1, 2] {
        let cfg = SokobanConfig {
            width: 6,
            height: 6,
            num_boxes: boxes,
            ..Default::default()
        };
        for seed in 0..100 {
            let g = generate_room(&cfg, seed).expect("room");
            let path = solve_bfs(&g.room, 200_000).expect("bfs finds a solution");
            // Both searches are exhaustive breadth-first: both solutions are optimal.
            assert_eq!(path.len(), g.solution.len(), "seed {seed}");
            let mut r = g.room.clone();
            for d in path {
                r.apply(d);
            }
            assert!(r.is_solved());
        }
    }
    // A box in a corner off its target is a dead end.
    assert_eq!(solve_bfs(&room("#####\n#$_.#\n#@__#\n#####"), 10_000), None);
}

#[test]
fn generated_room_difficulty_is_capped() {
    for (cap, max_steps) in [(Some(3), 30), (None, 5)] {
        let cfg = SokobanConfig {
            width: 7,
            height: 7,
            num_boxes: 2,
            max_solution_moves: cap,
            max_steps,
            ..Default::default()
        };
        let want = cap.unwrap_or(max_steps) as usize;
        let mut exact = 0;
        for seed in 0..50 {
            let g = generate_room(&cfg, seed).expect("room");
            assert!(
                g.solution.len() <= want,
                "seed {seed}: {}",
                g.solution.len()
            );
            exact += usize::from(g.solution.len() == want);
        }
        assert!(
            exact > 40,
            "most layouts allow the full {want} moves: {exact}"
        );
    }
    // Bigger rooms, more boxes: the search cap keeps generation bounded and rooms solvable.
    let cfg = SokobanConfig {
        width: 10,
        height: 10,
        num_boxes: 4,
        max_steps: 120,
        ..Default::default()
    };
    for seed in 0..5 {
        let g = generate_room(&cfg, seed).expect("room");
        let mut r = g.room.clone();
        for d in &g.solution {
            r.apply(*d);
        }
        assert!(r.is_solved() && !g.room.is_solved());
    }
}

#[tokio::test]
async fn sokoban_episode_solved_by_playing_the_generator_solution() {
    let mut env = Sokoban::new(SokobanConfig::default()).expect("env");
    for seed in 0..20 {
        let r = env.reset(seed).await.expect("reset");
        assert!(r.observation.contains("Up, Down, Left or Right"));
        let moves: Vec<Direction> = env.generator_solution().to_vec();
        let mut total = 0.0;
        let mut last = None;
        for d in &moves {
            let s = env.step(d.word()).await.expect("step");
            total += s.reward;
            if s.done() {
                last = Some(s);
                break;
            }
        }
        let last = last.expect("the solution ends the episode");
        assert!(last.terminated, "seed {seed}");
        assert!(env.room().expect("room").is_solved());
        // Every box ends on a target: at least the step penalties plus the solve bonus.
        assert!(
            total > 10.0 - 0.1 * moves.len() as f64 - 1e-9,
            "seed {seed}: {total}"
        );
    }
}

#[test]
fn sokoban_config_errors_name_the_field() {
    let field = |cfg: SokobanConfig| match Sokoban::new(cfg) {
        Err(EnvError::Config { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    };
    assert_eq!(
        field(SokobanConfig {
            width: 3,
            ..Default::default()
        }),
        "width"
    );
    assert_eq!(
        field(SokobanConfig {
            width: 5,
            height: 5,
            num_boxes: 5,
            ..Default::default()
        }),
        "num_boxes"
    );
    assert_eq!(
        field(SokobanConfig {
            step_reward: f64::NAN,
            ..Default::default()
        }),
        "step_reward"
    );
    let _ = sokoban::MAX_SIDE;
}

// ---------------------------------------------------------------------------------------------
// Tool use
// ---------------------------------------------------------------------------------------------

#[test]
fn calculator_evaluates_safely() {
    assert_eq!(calc("7321*48"), Ok(351_408));
    assert_eq!(calc(" 2 + 3 * 4 "), Ok(14));
    assert_eq!(calc("(2+3)*4"), Ok(20));
    assert_eq!(calc("-(3-10)"), Ok(7));
    assert_eq!(calc("--4"), Ok(4));
    assert_eq!(calc("7/2"), Ok(3));
    assert_eq!(calc("-7/2"), Ok(-3));
    assert_eq!(calc("10-2-3"), Ok(5), "left associative");
    assert_eq!(calc("1/0"), Err(CalcError::DivisionByZero));
    assert_eq!(calc("1/(2-2)"), Err(CalcError::DivisionByZero));
    let big = "99999999999999999999";
    assert_eq!(calc(&format!("{big}*{big}")), Err(CalcError::Overflow));
    assert_eq!(calc(&"9".repeat(60)), Err(CalcError::Overflow));
    assert_eq!(calc(&"1+".repeat(200)), Err(CalcError::TooLong));
    let deep = format!("{}1{}", "(".repeat(40), ")".repeat(40));
    assert_eq!(calc(&deep), Err(CalcError::TooDeep));
    assert_eq!(calc(&"-".repeat(100)), Err(CalcError::TooDeep));
    for bad in ["", "2+", "abc", "(1", "1)", "2**3", "1 2"] {
        assert!(
            matches!(calc(bad), Err(CalcError::Syntax { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn tool_actions_parse_first_tag() {
    assert_eq!(
        parse_action("I'll compute. <tool>calc: 12*3</tool> <answer>36</answer>"),
        ToolAction::Tool {
            name: "calc".into(),
            input: "12*3".into()
        }
    );
    assert_eq!(
        parse_action("<answer> 1,234 </answer><tool>calc: 1</tool>"),
        ToolAction::Answer("1,234".into())
    );
    assert_eq!(parse_action("<answer>42"), ToolAction::Answer("42".into()));
    assert_eq!(
        parse_action("<tool>5+5</tool>"),
        ToolAction::Tool {
            name: String::new(),
            input: "5+5".into()
        }
    );
    assert_eq!(parse_action("the answer is 42"), ToolAction::Invalid);
    assert_eq!(tool_use::run_tool("calc", "1/0"), "error: division by zero");
    assert!(tool_use::run_tool("search", "x").contains("unknown tool `search`"));
}

/// The question inside a first observation `What is Q?\n...`.
fn question_of(observation: &str) -> String {
    observation
        .strip_prefix("What is ")
        .and_then(|r| r.split_once("?\n"))
        .map(|(q, _)| q.to_string())
        .expect("question")
}

#[tokio::test]
async fn tool_call_then_answer_earns_the_reward() {
    let mut env = ToolUse::new(ToolUseConfig::default()).expect("env");
    for seed in 0..20 {
        let r = env.reset(seed).await.expect("reset");
        let q = question_of(&r.observation);
        assert_eq!(q, tool_use::question(env.config(), seed));
        let s = env
            .step(&format!("<tool>calc: {q}</tool>"))
            .await
            .expect("tool");
        let value = calc(&q).expect("value");
        assert_eq!(s.observation, format!("<result>{value}</result>"));
        assert!(!s.done());
        assert_eq!(s.reward, 0.0);
        let s = env
            .step(&format!("So: <answer>{value}</answer>"))
            .await
            .expect("answer");
        assert!(s.terminated);
        assert_eq!(s.reward, 1.0);
        assert_eq!(s.info["correct"], true);
        assert_eq!(s.info["tool_calls"], 1);
    }
}

#[tokio::test]
async fn wrong_answers_and_tool_requirements() {
    let mut env = ToolUse::new(ToolUseConfig::default()).expect("env");
    env.reset(1).await.expect("reset");
    let s = env.step("<answer>-1</answer>").await.expect("answer");
    assert!(s.terminated);
    assert_eq!(s.reward, 0.0);
    assert_eq!(s.info["correct"], false);

    let mut strict = ToolUse::new(ToolUseConfig {
        require_tool: true,
        ..Default::default()
    })
    .expect("env");
    let r = strict.reset(2).await.expect("reset");
    let value = calc(&question_of(&r.observation)).expect("value");
    let s = strict
        .step(&format!("<answer>{value}</answer>"))
        .await
        .expect("answer");
    assert_eq!(s.info["correct"], true);
    assert_eq!(s.reward, 0.0, "right but without the tool");
}

#[tokio::test]
async fn bad_tool_input_is_error_text_and_turns_run_out() {
    let mut env = ToolUse::new(ToolUseConfig {
        max_turns: 3,
        invalid_action_penalty: 0.25,
        ..Default::default()
    })
    .expect("env");
    env.reset(5).await.expect("reset");
    let s = env.step("<tool>calc: 1/0</tool>").await.expect("step");
    assert_eq!(s.observation, "<result>error: division by zero</result>");
    let s = env.step("<tool>calc: (((</tool>").await.expect("step");
    assert!(s.observation.starts_with("<result>error: syntax error"));
    let s = env.step("hmm").await.expect("step");
    assert_eq!(s.reward, -0.25);
    assert!(s.truncated && !s.terminated);
    assert!(matches!(
        env.step("<answer>1</answer>").await,
        Err(EnvError::OutOfOrder(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Registry
// ---------------------------------------------------------------------------------------------

#[test]
fn specs_parse_with_defaults_and_round_trip() {
    let spec: EnvSpec =
        serde_json::from_str(r#"{"name": "frozen_lake", "map": "8x8", "is_slippery": false}"#)
            .expect("spec");
    let EnvConfig::FrozenLake(c) = &spec.env else {
        panic!("wrong variant: {spec:?}")
    };
    assert_eq!(c.map, MapChoice::Map8x8);
    assert!(!c.is_slippery);
    assert_eq!(c.effective_max_steps(), 200);
    assert_eq!(spec.latency, None);
    let json = serde_json::to_string(&spec).expect("serialise");
    assert_eq!(serde_json::from_str::<EnvSpec>(&json).expect("parse"), spec);

    let spec: EnvSpec = serde_json::from_str(
        r#"{"name": "tool_use", "max_turns": 2,
            "latency": {"kind": "log_normal", "mean": 0.5, "sigma": 1.0},
            "failure": {"rate": 0.1, "kind": "hang"}, "noise_seed": 3}"#,
    )
    .expect("spec");
    assert_eq!(spec.name(), "tool_use");
    assert!(spec.latency.is_some() && spec.failure.is_some());
    let json = serde_json::to_string(&spec).expect("serialise");
    assert_eq!(serde_json::from_str::<EnvSpec>(&json).expect("parse"), spec);

    let spec: EnvSpec =
        serde_json::from_str(r#"{"name": "frozen_lake", "map": {"random": {"size": 5}}}"#)
            .expect("spec");
    assert!(make_env(&spec).is_ok());
}

#[test]
fn spec_errors_name_the_field() {
    let parse_err = |s: &str| {
        serde_json::from_str::<EnvSpec>(s)
            .expect_err("should not parse")
            .to_string()
    };
    assert!(parse_err(r#"{"name": "frozen_lake", "slippery": true}"#).contains("slippery"));
    assert!(parse_err(r#"{"name": "chess"}"#).contains("chess"));
    assert!(parse_err(r#"{"map": "4x4"}"#).contains("name"));
    assert!(
        parse_err(r#"{"name": "sokoban", "latency": {"kind": "fixed", "sec": 1}}"#).contains("sec")
    );

    let make_err = |s: &str| match make_env(&serde_json::from_str(s).expect("spec")) {
        Err(EnvError::Config { field, .. }) => field,
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("expected a config error"),
    };
    assert_eq!(
        make_err(r#"{"name": "frozen_lake", "success_rate": 2.0}"#),
        "frozen_lake.success_rate"
    );
    assert_eq!(
        make_err(r#"{"name": "sokoban", "width": 99}"#),
        "sokoban.width"
    );
    assert_eq!(
        make_err(r#"{"name": "tool_use", "max_turns": 0}"#),
        "tool_use.max_turns"
    );
    assert_eq!(
        make_err(r#"{"name": "tool_use", "latency": {"kind": "uniform", "low": 2, "high": 1}}"#),
        "latency.high"
    );
    assert_eq!(
        make_err(r#"{"name": "tool_use", "failure": {"rate": 1.5}}"#),
        "failure.rate"
    );
}

#[tokio::test]
async fn every_registered_name_builds_with_defaults() {
    // `dataset` has no default files; its own tests build it.
    for name in ENV_NAMES.into_iter().filter(|n| *n != "dataset") {
        let spec: EnvSpec =
            serde_json::from_value(serde_json::json!({ "name": name })).expect("spec");
        assert_eq!(spec.name(), name);
        let mut env = make_env(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        let r = env.reset(7).await.expect("reset");
        assert!(!r.observation.is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn make_env_wraps_latency_around_the_env() {
    let spec: EnvSpec = serde_json::from_str(
        r#"{"name": "frozen_lake", "latency": {"kind": "fixed", "secs": 2.5}}"#,
    )
    .expect("spec");
    let mut env = make_env(&spec).expect("env");
    let start = tokio::time::Instant::now();
    env.reset(0).await.expect("reset");
    env.step("Left").await.expect("step");
    assert_eq!(start.elapsed(), std::time::Duration::from_secs(5));
}
