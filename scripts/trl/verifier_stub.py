#!/usr/bin/env python3
"""A stand-in for `rollflash verify --stdin --extract boxed,last_number`, for testing the
driver's plumbing on a binary that lacks the stdin mode: same protocol (one
`{"reference", "response"}` JSON line in, one `{"reward": x}` line out, flushed), a much
cruder grader (the last `\\boxed{}` or else the last number, compared as a float with the
reference's). bench_vs_trl.sh uses it only with VERIFIER_STUB=1 and then says so in its table:
its rewards are not rollflash's.
"""

import json
import re
import sys

NUM = re.compile(r"-?\d+(?:\.\d+)?")


def answer(text: str):
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    pool = boxed[-1:] if boxed else [text]
    nums = NUM.findall(pool[-1].replace(",", ""))
    return float(nums[-1]) if nums else None


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        got, want = answer(req["response"]), answer(str(req["reference"]))
        reward = 1.0 if got is not None and want is not None and abs(got - want) < 1e-9 else 0.0
        sys.stdout.write(json.dumps({"reward": reward}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
