//! Sokoban: push every box onto a target, in random rooms that are solvable by construction.
//!
//! **Room generation** (our own take on the reverse-play idea behind gym-sokoban): carve a
//! connected floor with a random walk inside a walled rectangle and put every box on a target.
//! Then play *backwards*, exhaustively: a breadth-first search over positions from every
//! solved position (the player anywhere on the floor), where a reverse move walks the player
//! one cell and may pull a box that lies directly behind it. A pull is the exact inverse of a
//! push, so each position's search depth is the length of its shortest forward solution, and
//! the path back to a solved position *is* that solution. The room is a position at the
//! greatest depth found (capped by `max_solution_moves`, the search by `max_search_states`),
//! chosen among equals by the seed; rooms whose boxes cannot leave their targets are drawn
//! again. Solvable by construction, as hard as the layout allows, and [`generate_room`]
//! returns an optimal solution with it. (A random-walk reverse play, as in gym-sokoban, mostly
//! jiggles boxes next to their targets in rooms this small: half its rooms took two moves.)
//!
//! **Rules**: the player moves Up/Down/Left/Right onto floor; walking into a box pushes it one
//! cell if the cell behind it is floor or target without a box (no pushing two boxes, no
//! pushing into walls); a blocked move leaves everything in place.
//!
//! **Rewards** (gym-sokoban's defaults): −0.1 per step, +1 for each box pushed onto a target,
//! −1 for each box pushed off one, +10 when the last box reaches its target. The episode
//! terminates when every box is on a target and is truncated after `max_steps` steps. An
//! unparsable action is a step without a move (−0.1, minus `invalid_action_penalty`).
//!
//! **Text** (XSB notation, ASCII): `#` wall, `_` floor (visible, unlike a trailing space),
//! `$` box, `.` target, `*` box on target, `@` player, `+` player on target. The action is the
//! last of the words `Up`/`Down`/`Left`/`Right` in the text (any case; see
//! [`super::parse_direction`]).

use std::collections::{HashSet, VecDeque};

use async_trait::async_trait;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{check_finite, config_error, out_of_order, parse_direction, Direction};
use crate::env::{Env, EnvError, Info, Reset, Step};

/// Largest room side accepted: observations must stay small for a 512-token context.
pub const MAX_SIDE: usize = 16;

/// Rooms drawn before [`generate_room`] gives up (only absurd configs get there).
const MAX_ROOM_ATTEMPTS: usize = 1_000;

/// Probability that the carving walk changes direction at a step.
const TURN_PROB: f64 = 0.35;

/// Configuration of [`Sokoban`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SokobanConfig {
    /// Room width including the outer walls (default 6: a 4x4 interior, one-box rooms of
    /// about ten moves, a size small models can learn; gym-sokoban's default is 10).
    pub width: usize,
    /// Room height including the outer walls (default 6).
    pub height: usize,
    /// Boxes (and targets) in the room (default 1).
    pub num_boxes: usize,
    /// Truncation limit (default 30). Generated rooms never need more moves than this.
    pub max_steps: u32,
    /// Positions the generator's reverse search may visit (default 20 000): bounds the
    /// time a reset takes in big rooms with many boxes, where the full search would explode.
    pub max_search_states: usize,
    /// Longest optimal solution a generated room may have; `None` (default) takes the
    /// hardest position found within `max_steps`. Lower it for a curriculum: rooms are then
    /// exactly this many moves from solved when the layout allows it.
    pub max_solution_moves: Option<u32>,
    /// Share of the interior carved into floor (default 0.75).
    pub floor_fraction: f64,
    /// Reward of every step (default −0.1).
    pub step_reward: f64,
    /// Reward for pushing a box onto a target (default 1).
    pub box_on_target_reward: f64,
    /// Reward for pushing a box off a target (default −1).
    pub box_off_target_reward: f64,
    /// Bonus when every box is on a target (default 10).
    pub solved_reward: f64,
    /// Extra penalty for an action that names no move (default 0).
    pub invalid_action_penalty: f64,
}

impl Default for SokobanConfig {
    fn default() -> Self {
        SokobanConfig {
            width: 6,
            height: 6,
            num_boxes: 1,
            max_steps: 30,
            max_search_states: 20_000,
            max_solution_moves: None,
            floor_fraction: 0.75,
            step_reward: -0.1,
            box_on_target_reward: 1.0,
            box_off_target_reward: -1.0,
            solved_reward: 10.0,
            invalid_action_penalty: 0.0,
        }
    }
}

impl SokobanConfig {
    /// Checks ranges; errors name the field.
    pub fn validate(&self) -> Result<(), EnvError> {
        for (field, v) in [("width", self.width), ("height", self.height)] {
            if !(4..=MAX_SIDE).contains(&v) {
                return Err(config_error(
                    field,
                    format!("must be in 4..={MAX_SIDE}, got {v}"),
                ));
            }
        }
        if self.num_boxes == 0 {
            return Err(config_error("num_boxes", "must be at least 1"));
        }
        if !(self.floor_fraction > 0.0 && self.floor_fraction <= 1.0) {
            return Err(config_error(
                "floor_fraction",
                format!("must be in (0, 1], got {}", self.floor_fraction),
            ));
        }
        let floor = self.floor_cells();
        if 2 * self.num_boxes + 2 > floor {
            return Err(config_error(
                "num_boxes",
                format!(
                    "{} boxes do not fit {floor} floor cells (need 2 per box plus 2)",
                    self.num_boxes
                ),
            ));
        }
        if self.max_steps == 0 {
            return Err(config_error("max_steps", "must be at least 1"));
        }
        if self.max_search_states == 0 {
            return Err(config_error("max_search_states", "must be at least 1"));
        }
        if self.max_solution_moves == Some(0) {
            return Err(config_error("max_solution_moves", "must be at least 1"));
        }
        for (field, v) in [
            ("step_reward", self.step_reward),
            ("box_on_target_reward", self.box_on_target_reward),
            ("box_off_target_reward", self.box_off_target_reward),
            ("solved_reward", self.solved_reward),
            ("invalid_action_penalty", self.invalid_action_penalty),
        ] {
            check_finite(field, v)?;
        }
        Ok(())
    }

    /// Floor cells the carving walk aims for.
    fn floor_cells(&self) -> usize {
        let interior = (self.width.saturating_sub(2)) * (self.height.saturating_sub(2));
        ((interior as f64 * self.floor_fraction).round() as usize).clamp(1, interior.max(1))
    }
}

/// What a cell of a room is made of; boxes and the player are tracked separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Cell {
    Wall,
    Floor,
    Target,
}

/// What a move did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveOutcome {
    /// Blocked by a wall or by a box that cannot move; nothing changed.
    Blocked,
    /// The player walked.
    Walked,
    /// The player pushed a box.
    Pushed,
}

/// A Sokoban position: static cells plus box and player positions. Cells are indexed
/// `row * width + col`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Room {
    width: usize,
    height: usize,
    cells: Vec<Cell>,
    boxes: Vec<bool>,
    player: usize,
}

impl Room {
    /// Parses XSB text (`#`, `_`/`-`/space floor, `$`, `.`, `*`, `@`, `+`); short lines are
    /// padded with floor. There must be exactly one player and as many boxes as targets.
    pub fn parse(text: &str) -> Result<Room, EnvError> {
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let height = lines.len();
        let width = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
        if height == 0 || width == 0 {
            return Err(config_error("room", "empty room"));
        }
        let mut cells = vec![Cell::Floor; width * height];
        let mut boxes = vec![false; width * height];
        let mut players = Vec::new();
        for (r, line) in lines.iter().enumerate() {
            for (c, ch) in line.chars().enumerate() {
                let i = r * width + c;
                let (cell, has_box, has_player) = match ch {
                    '#' => (Cell::Wall, false, false),
                    '_' | '-' | ' ' => (Cell::Floor, false, false),
                    '$' => (Cell::Floor, true, false),
                    '.' => (Cell::Target, false, false),
                    '*' => (Cell::Target, true, false),
                    '@' => (Cell::Floor, false, true),
                    '+' => (Cell::Target, false, true),
                    other => {
                        return Err(config_error(
                            "room",
                            format!("row {r}: unknown symbol {other:?}"),
                        ))
                    }
                };
                cells[i] = cell;
                boxes[i] = has_box;
                if has_player {
                    players.push(i);
                }
            }
        }
        let [player] = players[..] else {
            return Err(config_error(
                "room",
                format!("needs exactly one player, found {}", players.len()),
            ));
        };
        let room = Room {
            width,
            height,
            cells,
            boxes,
            player,
        };
        let targets = room.cells.iter().filter(|&&c| c == Cell::Target).count();
        if targets != room.num_boxes() || targets == 0 {
            return Err(config_error(
                "room",
                format!("{} boxes but {targets} targets", room.num_boxes()),
            ));
        }
        Ok(room)
    }

    /// Width including walls.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height including walls.
    pub fn height(&self) -> usize {
        self.height
    }

    /// The player's cell index.
    pub fn player(&self) -> usize {
        self.player
    }

    /// Number of boxes.
    pub fn num_boxes(&self) -> usize {
        self.boxes.iter().filter(|&&b| b).count()
    }

    /// Boxes standing on targets.
    pub fn boxes_on_target(&self) -> usize {
        self.boxes
            .iter()
            .zip(&self.cells)
            .filter(|(&b, &c)| b && c == Cell::Target)
            .count()
    }

    /// Whether every box is on a target.
    pub fn is_solved(&self) -> bool {
        self.boxes_on_target() == self.num_boxes()
    }

    /// The cell one step from `i`, or `None` off the grid.
    fn neighbour(&self, i: usize, d: Direction) -> Option<usize> {
        let (dr, dc) = d.delta();
        let r = (i / self.width).checked_add_signed(dr)?;
        let c = (i % self.width).checked_add_signed(dc)?;
        (r < self.height && c < self.width).then_some(r * self.width + c)
    }

    /// Whether the player or a box could stand on `i` (not a wall, no box).
    fn is_free(&self, i: usize) -> bool {
        self.cells[i] != Cell::Wall && !self.boxes[i]
    }

    /// Applies the push rules for one move.
    pub fn apply(&mut self, d: Direction) -> MoveOutcome {
        let Some(next) = self.neighbour(self.player, d) else {
            return MoveOutcome::Blocked;
        };
        if self.cells[next] == Cell::Wall {
            return MoveOutcome::Blocked;
        }
        if !self.boxes[next] {
            self.player = next;
            return MoveOutcome::Walked;
        }
        match self.neighbour(next, d) {
            Some(beyond) if self.is_free(beyond) => {
                self.boxes[next] = false;
                self.boxes[beyond] = true;
                self.player = next;
                MoveOutcome::Pushed
            }
            _ => MoveOutcome::Blocked,
        }
    }

    /// The room in XSB notation (see the module docs), one line per row.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity((self.width + 1) * self.height);
        for i in 0..self.cells.len() {
            let on_target = self.cells[i] == Cell::Target;
            out.push(match self.cells[i] {
                Cell::Wall => '#',
                _ if i == self.player => {
                    if on_target {
                        '+'
                    } else {
                        '@'
                    }
                }
                _ if self.boxes[i] => {
                    if on_target {
                        '*'
                    } else {
                        '$'
                    }
                }
                _ if on_target => '.',
                _ => '_',
            });
            if i % self.width == self.width - 1 {
                out.push('\n');
            }
        }
        out
    }
}

/// A breadth-first solver for small rooms: the shortest move sequence that solves `room`, or
/// `None` if there is none within `max_states` explored positions. Exact but exponential in
/// the number of boxes; meant for checking generated rooms, not for big puzzles.
pub fn solve_bfs(room: &Room, max_states: usize) -> Option<Vec<Direction>> {
    if room.is_solved() {
        return Some(Vec::new());
    }
    // Positions are keyed by (player, boxes); parents are kept to rebuild the path.
    let mut seen: HashSet<(usize, Vec<bool>)> = HashSet::new();
    let mut nodes: Vec<(Room, Option<(usize, Direction)>)> = vec![(room.clone(), None)];
    let mut queue = VecDeque::from([0usize]);
    seen.insert((room.player, room.boxes.clone()));
    while let Some(n) = queue.pop_front() {
        for d in Direction::ALL {
            let mut next = nodes[n].0.clone();
            if next.apply(d) == MoveOutcome::Blocked {
                continue;
            }
            if !seen.insert((next.player, next.boxes.clone())) {
                continue;
            }
            let solved = next.is_solved();
            nodes.push((next, Some((n, d))));
            if solved {
                let mut path = Vec::new();
                let mut at = nodes.len() - 1;
                while let Some((parent, d)) = nodes[at].1 {
                    path.push(d);
                    at = parent;
                }
                path.reverse();
                return Some(path);
            }
            if nodes.len() > max_states {
                return None;
            }
            queue.push_back(nodes.len() - 1);
        }
    }
    None
}

/// A generated room and a move sequence that solves it (the reversed reverse play).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedRoom {
    pub room: Room,
    pub solution: Vec<Direction>,
}

/// Generates a solvable room from `seed` (see the module docs for how).
pub fn generate_room(cfg: &SokobanConfig, seed: u64) -> Result<GeneratedRoom, EnvError> {
    cfg.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..MAX_ROOM_ATTEMPTS {
        if let Some(g) = try_generate(cfg, &mut rng) {
            return Ok(g);
        }
    }
    Err(EnvError::Failed(format!(
        "sokoban: no room with a displaced box after {MAX_ROOM_ATTEMPTS} attempts"
    )))
}

/// A position in the reverse search: the player's cell and the sorted box cells.
type Position = (usize, Vec<usize>);

/// A node of the reverse search.
struct SearchNode {
    pos: Position,
    /// The node this one was reached from, and the reverse move taken.
    parent: Option<(usize, Direction)>,
    /// Reverse moves from a solved position: the optimal forward solution length.
    depth: u32,
}

/// One attempt: carve, place targets, search backwards; `None` when no box can leave its
/// target.
fn try_generate(cfg: &SokobanConfig, rng: &mut ChaCha8Rng) -> Option<GeneratedRoom> {
    let (w, h) = (cfg.width, cfg.height);
    let mut room = Room {
        width: w,
        height: h,
        cells: vec![Cell::Wall; w * h],
        boxes: vec![false; w * h],
        player: 0,
    };
    // Carve a connected floor with a turning random walk over the interior.
    let want = cfg.floor_cells();
    let mut at = (rng.random_range(1..h - 1), rng.random_range(1..w - 1));
    let mut dir = Direction::ALL[rng.random_range(0..4)];
    let mut carved = 0;
    for _ in 0..want * 200 {
        let i = at.0 * w + at.1;
        if room.cells[i] == Cell::Wall {
            room.cells[i] = Cell::Floor;
            carved += 1;
            if carved >= want {
                break;
            }
        }
        if rng.random_bool(TURN_PROB) {
            dir = Direction::ALL[rng.random_range(0..4)];
        }
        let (dr, dc) = dir.delta();
        let (r, c) = (at.0.wrapping_add_signed(dr), at.1.wrapping_add_signed(dc));
        if (1..h - 1).contains(&r) && (1..w - 1).contains(&c) {
            at = (r, c);
        }
    }
    let mut floor: Vec<usize> = (0..w * h)
        .filter(|&i| room.cells[i] == Cell::Floor)
        .collect();
    if floor.len() < cfg.num_boxes + 1 {
        return None;
    }
    floor.shuffle(rng);
    let mut targets: Vec<usize> = floor[..cfg.num_boxes].to_vec();
    targets.sort_unstable();
    for &t in &targets {
        room.cells[t] = Cell::Target;
    }

    // Breadth-first over reverse moves from every solved position.
    let mut nodes: Vec<SearchNode> = Vec::new();
    let mut seen: HashSet<Position> = HashSet::new();
    for &p in &floor[cfg.num_boxes..] {
        let pos = (p, targets.clone());
        if seen.insert(pos.clone()) {
            nodes.push(SearchNode {
                pos,
                parent: None,
                depth: 0,
            });
        }
    }
    // A room must be solvable within the episode, whatever else is asked.
    let cap = cfg
        .max_solution_moves
        .unwrap_or(u32::MAX)
        .min(cfg.max_steps);
    let mut next = 0;
    'search: while next < nodes.len() {
        let (player, boxes) = nodes[next].pos.clone();
        let depth = nodes[next].depth;
        let here = next;
        next += 1;
        if depth >= cap {
            continue;
        }
        for d in Direction::ALL {
            let Some(to) = room.neighbour(player, d) else {
                continue;
            };
            if room.cells[to] == Cell::Wall || boxes.binary_search(&to).is_ok() {
                continue;
            }
            // Walk away, and (a second successor) pull the box behind, if there is one.
            let mut successors = vec![boxes.clone()];
            if let Some(behind) = room.neighbour(player, d.opposite()) {
                if let Ok(k) = boxes.binary_search(&behind) {
                    let mut pulled = boxes.clone();
                    pulled[k] = player;
                    pulled.sort_unstable();
                    successors.push(pulled);
                }
            }
            for b in successors {
                let pos = (to, b);
                if seen.insert(pos.clone()) {
                    nodes.push(SearchNode {
                        pos,
                        parent: Some((here, d)),
                        depth: depth + 1,
                    });
                    if nodes.len() >= cfg.max_search_states {
                        break 'search;
                    }
                }
            }
        }
    }
    let deepest = nodes.iter().map(|n| n.depth).max().unwrap_or(0);
    // Depth > 0 positions whose boxes all sit on targets are solved already; skip them.
    let candidates: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].depth == deepest && nodes[i].pos.1 != targets)
        .collect();
    if deepest == 0 || candidates.is_empty() {
        return None;
    }
    let chosen = candidates[rng.random_range(0..candidates.len())];
    let (player, boxes) = &nodes[chosen].pos;
    room.player = *player;
    for &b in boxes {
        room.boxes[b] = true;
    }
    // Undoing reverse move d is walking the opposite way, which pushes a pulled box back.
    let mut solution = Vec::with_capacity(deepest as usize);
    let mut at = chosen;
    while let Some((parent, d)) = nodes[at].parent {
        solution.push(d.opposite());
        at = parent;
    }
    Some(GeneratedRoom { room, solution })
}

/// The live part of an episode.
#[derive(Debug)]
struct Episode {
    room: Room,
    steps: u32,
    done: bool,
}

/// The Sokoban environment (see the module docs for rules, rewards and text).
#[derive(Debug)]
pub struct Sokoban {
    cfg: SokobanConfig,
    episode: Option<Episode>,
    /// The generator's solution for the current room, for demonstrations and tests.
    solution: Vec<Direction>,
}

impl Sokoban {
    /// Builds the environment; fails on an invalid config.
    pub fn new(cfg: SokobanConfig) -> Result<Self, EnvError> {
        cfg.validate()?;
        Ok(Sokoban {
            cfg,
            episode: None,
            solution: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SokobanConfig {
        &self.cfg
    }

    /// The current position, if an episode was started.
    pub fn room(&self) -> Option<&Room> {
        self.episode.as_ref().map(|e| &e.room)
    }

    /// A solution of the room generated by the last reset (not necessarily the shortest).
    pub fn generator_solution(&self) -> &[Direction] {
        &self.solution
    }

    /// Starts an episode from a given position instead of a generated one (puzzles of your
    /// own, tests of the rules).
    pub fn reset_to(&mut self, room: Room) -> Reset {
        let observation = intro(&room);
        let info = info(&room, 0, None, false, MoveOutcome::Blocked);
        self.solution.clear();
        self.episode = Some(Episode {
            room,
            steps: 0,
            done: false,
        });
        Reset { observation, info }
    }
}

fn intro(room: &Room) -> String {
    format!(
        "Sokoban. Push every box $ onto a target . (# wall, _ floor, * box on target, \
         @ you, + you on target).\nReply with one move: Up, Down, Left or Right.\n{}",
        room.render()
    )
}

fn info(
    room: &Room,
    steps: u32,
    action: Option<Direction>,
    invalid: bool,
    outcome: MoveOutcome,
) -> Info {
    let mut info = Info::new();
    info.insert("steps".into(), json!(steps));
    info.insert("boxes_on_target".into(), json!(room.boxes_on_target()));
    info.insert("num_boxes".into(), json!(room.num_boxes()));
    info.insert("action".into(), json!(action.map(Direction::word)));
    info.insert("invalid_action".into(), json!(invalid));
    info.insert("pushed".into(), json!(outcome == MoveOutcome::Pushed));
    info
}

#[async_trait]
impl Env for Sokoban {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        // The reverse search takes up to tens of milliseconds in big rooms: off the async
        // threads when there is a runtime to hand it to.
        let generated = match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let cfg = self.cfg.clone();
                handle
                    .spawn_blocking(move || generate_room(&cfg, seed))
                    .await
                    .map_err(|e| EnvError::Internal {
                        what: "sokoban: room generation".into(),
                        source: Box::new(e),
                    })?
            }
            Err(_) => generate_room(&self.cfg, seed),
        };
        let GeneratedRoom { room, solution } = generated?;
        let reset = self.reset_to(room);
        self.solution = solution;
        Ok(reset)
    }

    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let cfg = &self.cfg;
        let ep = match &mut self.episode {
            Some(ep) if !ep.done => ep,
            other => return Err(out_of_order("sokoban", other.is_some())),
        };
        ep.steps += 1;
        let before = ep.room.boxes_on_target();
        let dir = parse_direction(action, false);
        let mut reward = cfg.step_reward;
        let (outcome, status) = match dir {
            Some(d) => {
                let o = ep.room.apply(d);
                let s = match o {
                    MoveOutcome::Blocked => format!("{}: blocked.", d.word()),
                    _ => format!("{}.", d.word()),
                };
                (o, s)
            }
            None => {
                reward -= cfg.invalid_action_penalty;
                (
                    MoveOutcome::Blocked,
                    "Invalid move: reply Up, Down, Left or Right.".to_string(),
                )
            }
        };
        let after = ep.room.boxes_on_target();
        if after > before {
            reward += cfg.box_on_target_reward * (after - before) as f64;
        } else if after < before {
            reward += cfg.box_off_target_reward * (before - after) as f64;
        }
        let terminated = ep.room.is_solved();
        if terminated {
            reward += cfg.solved_reward;
        }
        // Gymnasium's TimeLimit: the last allowed step is truncated even if it also solved.
        let truncated = ep.steps >= cfg.max_steps;
        ep.done = terminated || truncated;
        let status = if terminated {
            format!("{status} Solved!")
        } else {
            status
        };
        Ok(Step {
            observation: format!("{status}\n{}", ep.room.render()),
            reward,
            terminated,
            truncated,
            info: info(&ep.room, ep.steps, dir, dir.is_none(), outcome),
        })
    }
}
