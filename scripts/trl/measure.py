#!/usr/bin/env python3
"""Runs a command and records its wall time and peak memory, as `/usr/bin/time -v` would but
without needing it: `measure.py OUT.json -- CMD ARGS...`. The child's output passes through;
OUT.json gets {"cmd", "rc", "wall_s", "max_rss_mb", "user_s", "sys_s"}: max_rss_mb is the
command's own maximum resident set size (wait4's ru_maxrss; a subprocess of it, such as TRL's
verifier, is not included). Exits with the command's status.
"""

import json
import os
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: measure.py OUT.json -- CMD [ARGS...]")
    out, cmd = sys.argv[1], sys.argv[3:]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    with open(out, "w") as f:
        json.dump(
            {
                "cmd": cmd,
                "rc": rc,
                "wall_s": wall,
                "max_rss_mb": usage.ru_maxrss / 1024,
                "user_s": usage.ru_utime,
                "sys_s": usage.ru_stime,
            },
            f,
            indent=2,
        )
    sys.exit(rc if rc >= 0 else 128 - rc)


if __name__ == "__main__":
    main()
