"""The reward both sides of scripts/bench_vs_trl.sh are graded by: rollflash's own verifier,
kept open as one subprocess (`rollflash verify --stdin --extract boxed,last_number`), which
reads `{"reference", "response"}` JSON lines and answers `{"reward": x}` per line, flushed.

Standard library only, so the stub test and the driver share it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from typing import Sequence


class VerifierError(RuntimeError):
    pass


class Verifier:
    """One long-lived verifier process; `score` is one request/response line pair."""

    def __init__(self, cmd: Sequence[str] | str):
        self.cmd = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        self.calls = 0
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._stderr: list[str] = []
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
        except OSError as e:
            raise VerifierError(f"cannot start the verifier {self.cmd}: {e}") from e
        # Drain stderr so a chatty verifier can never block on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-50]

    def _fail(self, what: str) -> VerifierError:
        rc = self.proc.poll()
        tail = "".join(self._stderr[-20:]).strip()
        return VerifierError(
            f"verifier {shlex.join(self.cmd)}: {what}"
            + (f" (exit {rc})" if rc is not None else "")
            + (f"; its stderr:\n{tail}" if tail else "")
        )

    def score(self, reference: str, response: str) -> float:
        with self._lock:
            t0 = time.perf_counter()
            assert self.proc.stdin is not None and self.proc.stdout is not None
            try:
                self.proc.stdin.write(json.dumps({"reference": str(reference), "response": response}) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                raise self._fail(f"write failed: {e}") from e
            line = self.proc.stdout.readline()
            if not line:
                raise self._fail("closed its output")
            try:
                reward = float(json.loads(line)["reward"])
            except (ValueError, KeyError, TypeError) as e:
                raise self._fail(f"answered {line.strip()!r}, not {{\"reward\": x}}") from e
            self.calls += 1
            self.seconds += time.perf_counter() - t0
            return reward

    def score_many(self, references: Sequence[str], responses: Sequence[str]) -> list[float]:
        return [self.score(r, s) for r, s in zip(references, responses, strict=True)]

    def peak_rss_mb(self) -> float | None:
        """The verifier process's peak resident set (VmHWM), while it is still running."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    def close(self):
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
