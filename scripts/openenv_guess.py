"""A small OpenEnv environment for rollflash's tests: guess a hidden number in a few tries.

The PyPI packages `openenv-core` and `openenv` ship the framework but no environment, so this
file is one, written on openenv-core's own server API (`Environment`, `Action`, `Observation`,
`create_fastapi_app`), and served by uvicorn exactly as OpenEnv's environments are. Text in,
text out, no model hub, CPU only:

- reset(seed): the hidden number is drawn from `seed` (same seed, same number); the
  observation's `prompt` states the task.
- step(GuessAction(guess=TEXT)): the first integer in TEXT is the guess. The reply says
  "higher" or "lower"; a right guess ends the episode with reward 1, the last wrong one with
  reward 0; text with no integer is an invalid guess (it still costs a try).

Run it with scripts/start_openenv.sh (which installs openenv-core first). The first line on
stdout is `listening on http://HOST:PORT`, so a caller asking for port 0 learns the port.
"""

import argparse
import random
import re
import socket
import sys
import uuid
from typing import Any, Optional

import uvicorn
from openenv.core.env_server import (
    Action,
    ConcurrencyConfig,
    Environment,
    Observation,
    State,
    create_fastapi_app,
)
from pydantic import Field

LOW = 1


class GuessAction(Action):
    """The model's turn: free text holding a number."""

    guess: str = Field(description="Text with the guessed number in it")


class GuessObservation(Observation):
    """What the model reads."""

    prompt: str = Field(default="", description="The text shown to the model")
    tries_left: int = Field(default=0, description="Guesses left in this episode")


class GuessState(State):
    target: int = 0
    tries_left: int = 0


class GuessEnvironment(Environment[GuessAction, GuessObservation, GuessState]):
    """One episode at a time per instance; instances share nothing, so sessions run
    concurrently."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    HIGH = 8
    TRIES = 3

    def __init__(self) -> None:
        super().__init__()
        self._state = GuessState()

    def reset(
        self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any
    ) -> GuessObservation:
        rng = random.Random(seed)
        self._state = GuessState(
            episode_id=episode_id or str(uuid.uuid4()),
            step_count=0,
            target=rng.randint(LOW, self.HIGH),
            tries_left=self.TRIES,
        )
        return GuessObservation(
            prompt=(
                f"Guess my number between {LOW} and {self.HIGH}. "
                f"You have {self.TRIES} tries. Answer with a number.\n"
            ),
            tries_left=self.TRIES,
            reward=None,
            done=False,
        )

    def step(
        self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any
    ) -> GuessObservation:
        s = self._state
        s.step_count += 1
        s.tries_left -= 1
        m = re.search(r"-?\d+", action.guess)
        if m is None:
            text, solved = "That is not a number.", False
        else:
            g = int(m.group())
            solved = g == s.target
            text = "Right!" if solved else ("Higher." if g < s.target else "Lower.")
        done = solved or s.tries_left <= 0
        if not done:
            text += f" {s.tries_left} tries left. Guess again.\n"
        return GuessObservation(
            prompt=text,
            tries_left=s.tries_left,
            reward=1.0 if solved else 0.0,
            done=done,
        )

    @property
    def state(self) -> GuessState:
        return self._state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 lets the OS pick")
    p.add_argument("--max-sessions", type=int, default=64, help="concurrent /ws sessions")
    p.add_argument("--high", type=int, default=8, help="numbers are 1..HIGH")
    p.add_argument("--tries", type=int, default=3, help="guesses per episode")
    a = p.parse_args()
    GuessEnvironment.HIGH = a.high
    GuessEnvironment.TRIES = a.tries
    app = create_fastapi_app(
        GuessEnvironment,
        GuessAction,
        GuessObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=a.max_sessions),
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((a.host, a.port))
    # Listening before the address is printed: early connections wait in the backlog
    # until uvicorn accepts them.
    sock.listen(128)
    host, port = sock.getsockname()[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    config = uvicorn.Config(app, log_level="warning", ws="websockets-sansio")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
