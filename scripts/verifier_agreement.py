"""Agreement of two math graders with careful human verdicts on scripts/verifier_cases.jsonl.

Runs HF math-verify (pinned 0.9.0; scripts/setup_data_tools.sh installs it in .venv-data) and
rollflash's MathVerifier (`rollflash verify --cases`, the binary given by --rollflash) on each
case -- a reference answer, a whole model response, a human verdict and a kind -- and prints
both agreement rates, per kind and overall, as a Markdown table (BENCHMARKS.md has it):

    scripts/setup_data_tools.sh
    cargo build --release
    .venv-data/bin/python scripts/verifier_agreement.py --rollflash target/release/rollflash

math-verify is called as its README shows: `verify(parse(gold), parse(response))`, with the
gold answer wrapped in `$...$` so its LaTeX extraction reads it.
"""

import argparse
import collections
import json
import os
import subprocess
import sys

from math_verify import parse, verify

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def math_verify_verdict(gold, answer):
    try:
        return bool(verify(parse(f"${gold}$"), parse(answer)))
    except Exception:  # a grader that raises has not credited the answer
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=os.path.join(ROOT, "scripts", "verifier_cases.jsonl"))
    p.add_argument("--rollflash", default=os.path.join(ROOT, "target", "release", "rollflash"))
    p.add_argument("--only-rollflash", action="store_true",
                   help="list only the cases where rollflash disagrees with the human verdict")
    a = p.parse_args()
    out = subprocess.run([a.rollflash, "verify", "--cases", a.cases],
                         check=True, capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.strip()]
    per_kind = collections.OrderedDict()
    totals = [0, 0, 0, 0, 0]  # cases, ours agree, mv agree, ours false credit, mv false credit
    disagreements = []
    for r in rows:
        mv = math_verify_verdict(r["gold"], r["answer"])
        ours, human = r["rollflash"], r["human"]
        k = per_kind.setdefault(r["kind"], [0, 0, 0])
        k[0] += 1
        k[1] += ours == human
        k[2] += mv == human
        totals[0] += 1
        totals[1] += ours == human
        totals[2] += mv == human
        totals[3] += ours and not human
        totals[4] += mv and not human
        if ours != human or (mv != human and not a.only_rollflash):
            disagreements.append((r["kind"], r["gold"], r["answer"], human, ours, mv))
    print("| kind | cases | rollflash agrees | math-verify 0.9.0 agrees |")
    print("| --- | --- | --- | --- |")
    for kind, (n, o, m) in per_kind.items():
        print(f"| {kind} | {n} | {o} | {m} |")
    n, o, m, fo, fm = totals
    print(f"| **all** | **{n}** | **{o} ({100 * o / n:.1f}%)** | **{m} ({100 * m / n:.1f}%)** |")
    print(f"\nwrong answers credited: rollflash {fo}, math-verify {fm}")
    print("\ndisagreements with the human verdict (kind, gold, response, human, rollflash, math-verify):",
          file=sys.stderr)
    for d in disagreements:
        print("  " + json.dumps(d, ensure_ascii=False), file=sys.stderr)


if __name__ == "__main__":
    main()
