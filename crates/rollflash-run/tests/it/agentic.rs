//! The shipped agentic config, `configs/frozenlake.toml`: it parses as a multi-turn FrozenLake
//! run with a warm-up, whose demonstrations (optimal play, or noisy with
//! `random_move_prob`) reach the goal as they should and repeat from their seed.

use rollflash_model::tokenizer::Tokenizer;
use rollflash_run::config::TrainConfig;

use crate::tiny_run::frozenlake_toml;

#[test]
fn the_shipped_frozenlake_config_parses_and_is_multi_turn() {
    let c = TrainConfig::load(Some(&frozenlake_toml()), &[]).unwrap();
    assert_eq!(c.env.name(), "frozen_lake");
    assert!(c.rollout.max_turns > 1);
    assert!(
        c.warmup.steps > 0,
        "the tiny model needs the move format first"
    );
    assert_eq!(
        rollflash_run::eval::success_threshold(&c.env.spec().expect("built-in").env),
        1.0,
        "reaching the goal is a success"
    );
}

/// The agentic warm-up's demonstrations: optimal play always reaches the goal of a solvable
/// lake; with `random_move_prob` some moves are random, so some episodes end elsewhere —
/// the same seeds, so the difference is the noise alone.
#[tokio::test]
async fn noisy_demonstrations_leave_the_optimal_path_some_of_the_time() {
    use rollflash_run::agentic_warmup::demonstration;
    let c = TrainConfig::load(Some(&frozenlake_toml()), &[]).unwrap();
    let Some(rollflash_env::envs::EnvConfig::FrozenLake(lake)) = c.env.spec().map(|s| &s.env)
    else {
        panic!("frozen lake config");
    };
    let tok = Tokenizer::builtin();
    let (mut optimal_ok, mut noisy_ok, mut differ) = (0, 0, 0);
    for seed in 0..40u64 {
        let a = demonstration(lake, &tok, seed, 10, 2000, 0.0)
            .await
            .unwrap();
        let b = demonstration(lake, &tok, seed, 10, 2000, 0.4)
            .await
            .unwrap();
        assert!(a.mask.contains(&1.0), "moves are trained on");
        assert_eq!(a.mask.len(), a.ids.len());
        optimal_ok += usize::from(a.reward == 1.0);
        noisy_ok += usize::from(b.reward == 1.0);
        differ += usize::from(a.ids != b.ids);
        let again = demonstration(lake, &tok, seed, 10, 2000, 0.4)
            .await
            .unwrap();
        assert_eq!(b, again, "reproducible from the seed");
    }
    assert_eq!(
        optimal_ok, 40,
        "random maps are solvable and BFS play solves them"
    );
    assert!(differ >= 20, "{differ} of 40 noisy demonstrations differ");
    assert!(noisy_ok < 40, "some noisy demonstrations fail: {noisy_ok}");
}
