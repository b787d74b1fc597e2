//! FrozenLake: Gymnasium's `FrozenLake-v1` dynamics behind a text interface.
//!
//! The dynamics follow Gymnasium's documentation of `FrozenLake-v1`: the player starts on `S`
//! and walks to `G` over frozen tiles `F` without falling into a hole `H`. Actions are
//! 0 Left, 1 Down, 2 Right, 3 Up; a move off the edge leaves the player in place. On slippery
//! ice the player moves in the intended direction with probability `success_rate` (default
//! 1/3) and in each of the two perpendicular directions with probability
//! `(1 - success_rate) / 2`. Reward follows `reward_schedule` = (goal, hole, frozen), default
//! (1, 0, 0); the episode terminates on `H` or `G` and is truncated after `max_steps` steps
//! (Gymnasium's `TimeLimit`: 100 for the 4x4 map, 200 for the 8x8 one).
//!
//! [`transitions`] is the pure transition model, Gymnasium's `P[s][a]`, in the same order
//! (for slippery ice: action − 1, action, action + 1, modulo 4), so it can be compared with
//! Gymnasium entry by entry. Sampling draws one uniform number per step, as Gymnasium's
//! `categorical_sample` does, from a ChaCha8 RNG seeded by the reset seed; the numbers differ
//! from NumPy's, the distribution does not.
//!
//! Text interface: the first observation explains the task and lists the moves; every
//! observation renders the grid with the player as `P`. The action is the last direction word
//! (`Left`/`Down`/`Right`/`Up`, any case) or action digit `0`-`3` in the text
//! ([`super::parse_direction`]); anything else is an invalid move: no movement, reward
//! `-invalid_action_penalty`, and the step still counts towards `max_steps`.

use async_trait::async_trait;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{check_finite, config_error, out_of_order, parse_direction, Direction};
use crate::env::{Env, EnvError, Info, Reset, Step};

/// Gymnasium's built-in `"4x4"` map.
pub const MAP_4X4: [&str; 4] = ["SFFF", "FHFH", "FFFH", "HFFG"];

/// Gymnasium's built-in `"8x8"` map.
pub const MAP_8X8: [&str; 8] = [
    "SFFFFFFF", "FFFFFFFF", "FFFHFFFF", "FFFFFHFF", "FFFHFFFF", "FHHFFFHF", "FHFFHFHF", "FFFHFFFG",
];

/// Largest side accepted for random and custom maps: observations must stay small enough for
/// a 512-token context.
pub const MAX_SIZE: usize = 16;

/// How many random boards [`generate_random_map`] tries before giving up; with `p` near 1
/// the first one almost always works, with tiny `p` no board ever does.
const MAX_MAP_ATTEMPTS: usize = 10_000;

/// One cell of the lake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tile {
    /// `S`: the start (frozen).
    Start,
    /// `F`: frozen, safe.
    Frozen,
    /// `H`: a hole; the episode ends with `reward_schedule.1`.
    Hole,
    /// `G`: the goal; the episode ends with `reward_schedule.0`.
    Goal,
}

impl Tile {
    fn from_char(c: char) -> Option<Tile> {
        match c {
            'S' => Some(Tile::Start),
            'F' => Some(Tile::Frozen),
            'H' => Some(Tile::Hole),
            'G' => Some(Tile::Goal),
            _ => None,
        }
    }

    fn to_char(self) -> char {
        match self {
            Tile::Start => 'S',
            Tile::Frozen => 'F',
            Tile::Hole => 'H',
            Tile::Goal => 'G',
        }
    }

    /// Holes and the goal end the episode.
    pub fn is_terminal(self) -> bool {
        matches!(self, Tile::Hole | Tile::Goal)
    }
}

/// A parsed map: a rectangle of tiles, with exactly one start. States are numbered
/// `row * ncol + col`, as in Gymnasium.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lake {
    nrow: usize,
    ncol: usize,
    tiles: Vec<Tile>,
    start: usize,
}

impl Lake {
    /// Parses rows of `S`/`F`/`H`/`G`. The map must be a non-empty rectangle of at most
    /// [`MAX_SIZE`] per side with exactly one `S` (Gymnasium allows several starts; we keep
    /// episodes a function of the seed alone).
    pub fn parse<R: AsRef<str>>(rows: &[R]) -> Result<Lake, EnvError> {
        let nrow = rows.len();
        let ncol = rows.first().map(|r| r.as_ref().len()).unwrap_or(0);
        if nrow == 0 || ncol == 0 {
            return Err(config_error("map", "the map is empty"));
        }
        if nrow > MAX_SIZE || ncol > MAX_SIZE {
            return Err(config_error(
                "map",
                format!("{nrow}x{ncol} exceeds the {MAX_SIZE}x{MAX_SIZE} limit"),
            ));
        }
        let mut tiles = Vec::with_capacity(nrow * ncol);
        for (r, row) in rows.iter().enumerate() {
            let row = row.as_ref();
            if row.chars().count() != ncol {
                return Err(config_error(
                    "map",
                    format!(
                        "row {r} has {} tiles, row 0 has {ncol}",
                        row.chars().count()
                    ),
                ));
            }
            for c in row.chars() {
                tiles.push(Tile::from_char(c).ok_or_else(|| {
                    config_error("map", format!("row {r}: unknown tile {c:?} (use S F H G)"))
                })?);
            }
        }
        let starts: Vec<usize> = (0..tiles.len())
            .filter(|&i| tiles[i] == Tile::Start)
            .collect();
        let [start] = starts[..] else {
            return Err(config_error(
                "map",
                format!("needs exactly one S, found {}", starts.len()),
            ));
        };
        Ok(Lake {
            nrow,
            ncol,
            tiles,
            start,
        })
    }

    /// Number of rows.
    pub fn nrow(&self) -> usize {
        self.nrow
    }

    /// Number of columns.
    pub fn ncol(&self) -> usize {
        self.ncol
    }

    /// Number of states (`nrow * ncol`).
    pub fn num_states(&self) -> usize {
        self.tiles.len()
    }

    /// The start state.
    pub fn start(&self) -> usize {
        self.start
    }

    /// The tile of state `s`, or `None` when out of range.
    pub fn tile(&self, s: usize) -> Option<Tile> {
        self.tiles.get(s).copied()
    }

    /// The map as rows of `S`/`F`/`H`/`G`.
    pub fn rows(&self) -> Vec<String> {
        self.tiles
            .chunks(self.ncol)
            .map(|r| r.iter().map(|t| t.to_char()).collect())
            .collect()
    }

    /// The state one move from `s` in direction `d`, staying in place at the edge.
    pub fn moved(&self, s: usize, d: Direction) -> usize {
        let (row, col) = (s / self.ncol, s % self.ncol);
        let (dr, dc) = d.delta();
        let nr = row.checked_add_signed(dr).filter(|&r| r < self.nrow);
        let nc = col.checked_add_signed(dc).filter(|&c| c < self.ncol);
        match (nr, nc) {
            (Some(r), Some(c)) => r * self.ncol + c,
            _ => s,
        }
    }

    /// Whether a path of non-hole tiles joins the start to a goal (4-neighbourhood), as
    /// Gymnasium's `is_valid` checks for random maps.
    pub fn has_path(&self) -> bool {
        let mut seen = vec![false; self.tiles.len()];
        let mut stack = vec![self.start];
        seen[self.start] = true;
        while let Some(s) = stack.pop() {
            if self.tiles[s] == Tile::Goal {
                return true;
            }
            for d in Direction::ALL {
                let n = self.moved(s, d);
                if !seen[n] && self.tiles[n] != Tile::Hole {
                    seen[n] = true;
                    stack.push(n);
                }
            }
        }
        false
    }
}

/// One entry of Gymnasium's `P[s][a]`: `(prob, next_state, reward, terminated)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    pub prob: f64,
    pub next_state: usize,
    pub reward: f64,
    pub terminated: bool,
}

/// The physics knobs of the transition model, Gymnasium's constructor arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dynamics {
    /// Whether moves can slip sideways.
    pub is_slippery: bool,
    /// Probability of moving as intended on slippery ice.
    pub success_rate: f64,
    /// Rewards for entering (goal, hole, frozen) tiles.
    pub reward_schedule: (f64, f64, f64),
}

impl Default for Dynamics {
    fn default() -> Self {
        Dynamics {
            is_slippery: true,
            success_rate: 1.0 / 3.0,
            reward_schedule: (1.0, 0.0, 0.0),
        }
    }
}

/// Gymnasium's `P[s][a]`: where action `a` from state `s` leads, with what probability.
///
/// From a terminal tile (hole or goal) every action gives `[(1.0, s, 0.0, true)]`. Otherwise,
/// non-slippery gives one entry for the intended direction; slippery gives three, for
/// directions `a-1`, `a`, `a+1` (mod 4), with probability `success_rate` for `a` and
/// `(1 - success_rate) / 2` for each other. Entries are not merged when two directions lead
/// to the same state (e.g. against a corner), as in Gymnasium.
pub fn transitions(lake: &Lake, s: usize, a: Direction, dynamics: &Dynamics) -> Vec<Transition> {
    if lake.tile(s).is_none_or(Tile::is_terminal) {
        return vec![Transition {
            prob: 1.0,
            next_state: s,
            reward: 0.0,
            terminated: true,
        }];
    }
    let outcome = |prob: f64, d: Direction| {
        let next_state = lake.moved(s, d);
        let tile = lake.tiles[next_state];
        let (goal, hole, frozen) = dynamics.reward_schedule;
        let reward = match tile {
            Tile::Goal => goal,
            Tile::Hole => hole,
            Tile::Start | Tile::Frozen => frozen,
        };
        Transition {
            prob,
            next_state,
            reward,
            terminated: tile.is_terminal(),
        }
    };
    if !dynamics.is_slippery {
        return vec![outcome(1.0, a)];
    }
    let i = a.index();
    let side = (1.0 - dynamics.success_rate) / 2.0;
    [(i + 3) % 4, i, (i + 1) % 4]
        .into_iter()
        .filter_map(Direction::from_index)
        .map(|d| outcome(if d == a { dynamics.success_rate } else { side }, d))
        .collect()
}

/// The whole table `P[s][a]` for every state and action (index `[s][a.index()]`).
pub fn transition_table(lake: &Lake, dynamics: &Dynamics) -> Vec<[Vec<Transition>; 4]> {
    (0..lake.num_states())
        .map(|s| Direction::ALL.map(|a| transitions(lake, s, a, dynamics)))
        .collect()
}

/// A random `size`×`size` map in the manner of Gymnasium's `generate_random_map`: every tile
/// is frozen with probability `p` and a hole otherwise, the top-left is `S`, the bottom-right
/// `G`, and boards without a path from `S` to `G` are drawn again. Deterministic in `seed`
/// (ChaCha8, so not the same boards as Gymnasium's NumPy generator).
pub fn generate_random_map(size: usize, p: f64, seed: u64) -> Result<Vec<String>, EnvError> {
    if !(2..=MAX_SIZE).contains(&size) {
        return Err(config_error(
            "map.random.size",
            format!("must be in 2..={MAX_SIZE}, got {size}"),
        ));
    }
    if !(p > 0.0 && p <= 1.0) {
        return Err(config_error(
            "map.random.p",
            format!("must be in (0, 1], got {p}"),
        ));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..MAX_MAP_ATTEMPTS {
        let mut rows: Vec<String> = (0..size)
            .map(|_| {
                (0..size)
                    .map(|_| if rng.random::<f64>() < p { 'F' } else { 'H' })
                    .collect()
            })
            .collect();
        rows[0].replace_range(0..1, "S");
        rows[size - 1].replace_range(size - 1..size, "G");
        if Lake::parse(&rows)?.has_path() {
            return Ok(rows);
        }
    }
    Err(config_error(
        "map.random.p",
        format!("no solvable {size}x{size} map after {MAX_MAP_ATTEMPTS} draws with p = {p}"),
    ))
}

/// Which map to play.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MapChoice {
    /// Gymnasium's `"4x4"` map ([`MAP_4X4`]).
    #[serde(rename = "4x4")]
    Map4x4,
    /// Gymnasium's `"8x8"` map ([`MAP_8X8`]).
    #[serde(rename = "8x8")]
    Map8x8,
    /// A solvable random map from [`generate_random_map`]: drawn from the reset seed (a new
    /// lake every episode, which is what a policy that should generalise needs), or from
    /// `seed` when given (one fixed lake, as Gymnasium's `desc=generate_random_map(...)`).
    Random {
        size: usize,
        #[serde(default = "default_p")]
        p: f64,
        #[serde(default)]
        seed: Option<u64>,
    },
    /// A map of your own, rows of `S`/`F`/`H`/`G` (Gymnasium's `desc`).
    Custom(Vec<String>),
}

fn default_p() -> f64 {
    0.8
}

/// Configuration of [`FrozenLake`]; the defaults are Gymnasium's `FrozenLake-v1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FrozenLakeConfig {
    /// The map (default `"4x4"`).
    pub map: MapChoice,
    /// Whether moves can slip sideways (default true, as Gymnasium).
    pub is_slippery: bool,
    /// Probability of moving as intended on slippery ice (default 1/3).
    pub success_rate: f64,
    /// Rewards for reaching (goal, hole, frozen) tiles (default (1, 0, 0)).
    pub reward_schedule: (f64, f64, f64),
    /// Truncation limit. `None` uses Gymnasium's registrations: 200 steps for the 8x8 map,
    /// 100 for every other map.
    pub max_steps: Option<u32>,
    /// Penalty (subtracted from the reward) for an action that names no move.
    pub invalid_action_penalty: f64,
}

impl Default for FrozenLakeConfig {
    fn default() -> Self {
        let d = Dynamics::default();
        FrozenLakeConfig {
            map: MapChoice::Map4x4,
            is_slippery: d.is_slippery,
            success_rate: d.success_rate,
            reward_schedule: d.reward_schedule,
            max_steps: None,
            invalid_action_penalty: 0.0,
        }
    }
}

impl FrozenLakeConfig {
    /// Checks ranges; errors name the field.
    pub fn validate(&self) -> Result<(), EnvError> {
        if !(0.0..=1.0).contains(&self.success_rate) {
            return Err(config_error(
                "success_rate",
                format!("must be in [0, 1], got {}", self.success_rate),
            ));
        }
        let (g, h, f) = self.reward_schedule;
        for v in [g, h, f] {
            check_finite("reward_schedule", v)?;
        }
        check_finite("invalid_action_penalty", self.invalid_action_penalty)?;
        if self.max_steps == Some(0) {
            return Err(config_error("max_steps", "must be at least 1"));
        }
        match &self.map {
            MapChoice::Map4x4 | MapChoice::Map8x8 => {}
            MapChoice::Random { size, p, seed } => {
                // Checks size and p; with a fixed seed also that a map can be drawn.
                generate_random_map(*size, *p, seed.unwrap_or(0))?;
            }
            MapChoice::Custom(rows) => {
                Lake::parse(rows)?;
            }
        }
        Ok(())
    }

    /// The step limit in effect.
    pub fn effective_max_steps(&self) -> u32 {
        self.max_steps.unwrap_or(match self.map {
            MapChoice::Map8x8 => 200,
            _ => 100,
        })
    }

    fn dynamics(&self) -> Dynamics {
        Dynamics {
            is_slippery: self.is_slippery,
            success_rate: self.success_rate,
            reward_schedule: self.reward_schedule,
        }
    }
}

/// The live part of an episode.
#[derive(Debug)]
struct Episode {
    lake: Lake,
    state: usize,
    steps: u32,
    done: bool,
    rng: ChaCha8Rng,
}

/// The FrozenLake environment (see the module docs for dynamics and text format).
#[derive(Debug)]
pub struct FrozenLake {
    cfg: FrozenLakeConfig,
    /// Parsed once for fixed maps; random maps without a seed are drawn per reset.
    fixed_lake: Option<Lake>,
    episode: Option<Episode>,
}

impl FrozenLake {
    /// Builds the environment; fails on an invalid config.
    pub fn new(cfg: FrozenLakeConfig) -> Result<Self, EnvError> {
        cfg.validate()?;
        let fixed_lake = match &cfg.map {
            MapChoice::Map4x4 => Some(Lake::parse(&MAP_4X4)?),
            MapChoice::Map8x8 => Some(Lake::parse(&MAP_8X8)?),
            MapChoice::Random {
                size,
                p,
                seed: Some(seed),
            } => Some(Lake::parse(&generate_random_map(*size, *p, *seed)?)?),
            MapChoice::Random { seed: None, .. } => None,
            MapChoice::Custom(rows) => Some(Lake::parse(rows)?),
        };
        Ok(FrozenLake {
            cfg,
            fixed_lake,
            episode: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FrozenLakeConfig {
        &self.cfg
    }

    /// The current episode's lake and player state, if an episode was started.
    pub fn position(&self) -> Option<(&Lake, usize)> {
        self.episode.as_ref().map(|e| (&e.lake, e.state))
    }

    fn lake_for(&self, seed: u64) -> Result<Lake, EnvError> {
        match (&self.fixed_lake, &self.cfg.map) {
            (Some(l), _) => Ok(l.clone()),
            (None, MapChoice::Random { size, p, .. }) => {
                // A different stream from the slip RNG, so map and slips are independent.
                Lake::parse(&generate_random_map(*size, *p, seed ^ MAP_SEED_SALT)?)
            }
            (None, _) => Err(EnvError::Failed("frozen_lake: no map".into())),
        }
    }
}

/// Mixed into the reset seed for drawing random maps.
const MAP_SEED_SALT: u64 = 0x6672_6f7a_656e_6c6b;

/// The grid with the player drawn as `P`.
pub fn render(lake: &Lake, state: usize) -> String {
    let mut out = String::with_capacity(lake.num_states() + lake.nrow);
    for (i, t) in lake.tiles.iter().enumerate() {
        out.push(if i == state { 'P' } else { t.to_char() });
        if i % lake.ncol == lake.ncol - 1 {
            out.push('\n');
        }
    }
    out
}

fn info(state: usize, steps: u32, prob: f64, action: Option<Direction>, invalid: bool) -> Info {
    let mut info = Info::new();
    info.insert("state".into(), json!(state));
    info.insert("steps".into(), json!(steps));
    // Gymnasium reports the probability of the sampled transition as `prob`.
    info.insert("prob".into(), json!(prob));
    info.insert("action".into(), json!(action.map(Direction::index)));
    info.insert("invalid_action".into(), json!(invalid));
    info
}

#[async_trait]
impl Env for FrozenLake {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        let lake = self.lake_for(seed)?;
        let state = lake.start();
        let slippery = if self.cfg.is_slippery {
            " The ice is slippery: a move may go sideways."
        } else {
            ""
        };
        let observation = format!(
            "FrozenLake. Walk from S to G, avoid holes H.{slippery}\n\
             Reply with one move: Left, Down, Right or Up. P is you.\n{}",
            render(&lake, state)
        );
        self.episode = Some(Episode {
            lake,
            state,
            steps: 0,
            done: false,
            rng: ChaCha8Rng::seed_from_u64(seed),
        });
        Ok(Reset {
            observation,
            info: info(state, 0, 1.0, None, false),
        })
    }

    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let max_steps = self.cfg.effective_max_steps();
        let dynamics = self.cfg.dynamics();
        let penalty = self.cfg.invalid_action_penalty;
        let ep = match &mut self.episode {
            Some(ep) if !ep.done => ep,
            other => return Err(out_of_order("frozen_lake", other.is_some())),
        };
        ep.steps += 1;
        let dir = parse_direction(action, true);
        let (reward, terminated, prob, status) = match dir {
            Some(a) => {
                let ts = transitions(&ep.lake, ep.state, a, &dynamics);
                // Gymnasium's categorical_sample: the first index whose cumulative
                // probability exceeds one uniform draw.
                let u: f64 = ep.rng.random();
                let mut acc = 0.0;
                let t = ts
                    .iter()
                    .find(|t| {
                        acc += t.prob;
                        acc > u
                    })
                    .or(ts.last())
                    .copied()
                    .ok_or_else(|| EnvError::Failed("frozen_lake: empty transition".into()))?;
                ep.state = t.next_state;
                let status = match ep.lake.tile(t.next_state) {
                    Some(Tile::Goal) => "You reached the goal!",
                    Some(Tile::Hole) => "You fell into a hole.",
                    _ => "",
                };
                (
                    t.reward,
                    t.terminated,
                    t.prob,
                    format!("{}. {status}", a.word()),
                )
            }
            None => (
                -penalty,
                false,
                1.0,
                "Invalid move: reply Left, Down, Right or Up.".to_string(),
            ),
        };
        let truncated = ep.steps >= max_steps;
        ep.done = terminated || truncated;
        let observation = format!("{}\n{}", status.trim_end(), render(&ep.lake, ep.state));
        Ok(Step {
            observation,
            reward,
            terminated,
            truncated,
            info: info(ep.state, ep.steps, prob, dir, dir.is_none()),
        })
    }
}
