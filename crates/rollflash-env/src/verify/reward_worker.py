# rollflash's Python reward worker: runs the user's reward functions for
# `rollflash_env::verify::python` (embedded there with include_str! and started as
# `python -u -c <this file>`). One process serves calls one at a time, for as long as the
# run lasts; the Rust side kills and restarts it when a call hangs past its deadline or the
# process dies.
#
# Protocol (stdin → stdout): frames of a u32 big-endian length, then that many bytes of
# UTF-8 JSON. The worker first writes {"ready": true, "python": "<version>"}. Each request is
#   {"path": "<file.py>", "function": "<name>", "style": "verl" | "trl", "items": [...]}
# and each reply {"results": [<result per item>]} or {"error": "<traceback>"} (the whole
# call failed: a TRL function raised or returned the wrong thing). A result is
# {"score": <finite float>, "extra": {"<key>": <finite float>, ...}} or {"error": "..."}.
#
# Why stdout is duplicated and then pointed at stderr: user code prints, and a stray print
# must land in the log, not in the middle of a frame.
import importlib.util
import json
import math
import os
import struct
import sys
import traceback

_proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
_proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)
sys.stdout = sys.stderr
# User code reading stdin would eat frames; give it an empty stdin instead.
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)

_functions = {}


def _read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = _proto_in.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _read_frame():
    head = _read_exact(4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    body = _read_exact(n)
    if body is None:
        return None
    return json.loads(body.decode("utf-8"))


def _write_frame(obj):
    body = json.dumps(obj, allow_nan=False).encode("utf-8")
    _proto_out.write(struct.pack(">I", len(body)) + body)
    _proto_out.flush()


def _load(path, name):
    key = (path, name)
    f = _functions.get(key)
    if f is not None:
        return f
    directory = os.path.dirname(os.path.abspath(path))
    # Helpers next to the reward file import as they do when the user runs it.
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(
        "rollflash_reward_%d" % len(_functions), path
    )
    if spec is None or spec.loader is None:
        raise ImportError("cannot load %s as a Python module" % path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    f = getattr(module, name, None)
    if f is None or not callable(f):
        raise AttributeError("%s has no function %r" % (path, name))
    _functions[key] = f
    return f


def _number(v):
    # bool is an int in Python; verl's `acc` is often one and counts as 0/1.
    if isinstance(v, (bool, int, float)):
        x = float(v)
        if math.isfinite(x):
            return x
    # numpy and torch scalars.
    if hasattr(v, "item") and callable(v.item):
        try:
            return _number(v.item())
        except Exception:
            return None
    return None


def _describe(v):
    text = repr(v)
    if len(text) > 80:
        text = text[:77] + "..."
    return "%s %s" % (type(v).__name__, text)


def _score(v):
    """One returned score as a result: a finite number, or verl's dict with `score`."""
    if isinstance(v, dict):
        if "score" not in v:
            return {"error": "returned a dict without `score`: %s" % _describe(v)}
        s = _number(v["score"])
        if s is None:
            return {"error": "returned `score` = %s, not a finite number" % _describe(v["score"])}
        extra = {}
        for k, x in v.items():
            if k == "score":
                continue
            n = _number(x)
            # Non-numeric extras (verl's `pred`) are for the user's own logs, not metrics.
            if n is not None:
                extra[str(k)] = n
        return {"score": s, "extra": extra}
    s = _number(v)
    if s is None:
        return {"error": "returned %s, not a finite number or a dict with `score`" % _describe(v)}
    return {"score": s, "extra": {}}


def _verl(f, items):
    out = []
    for it in items:
        try:
            v = f(
                it["data_source"],
                it["solution_str"],
                it["ground_truth"],
                it["extra_info"],
            )
            out.append(_score(v))
        except Exception:
            out.append({"error": traceback.format_exc(limit=8)})
    return {"results": out}


def _trl(f, items):
    columns = {}
    for it in items:
        for k in it["columns"]:
            columns.setdefault(k, None)
    kwargs = {k: [it["columns"].get(k) for it in items] for k in columns}
    try:
        v = f(
            prompts=[it["prompt"] for it in items],
            completions=[it["completion"] for it in items],
            **kwargs
        )
    except Exception:
        return {"error": traceback.format_exc(limit=8)}
    if not isinstance(v, (list, tuple)):
        return {"error": "returned %s, not a list of floats" % _describe(v)}
    if len(v) != len(items):
        return {"error": "returned %d scores for %d completions" % (len(v), len(items))}
    return {"results": [_score(x) for x in v]}


def main():
    _write_frame({"ready": True, "python": sys.version.split()[0]})
    while True:
        req = _read_frame()
        if req is None:
            return
        try:
            f = _load(req["path"], req["function"])
        except Exception:
            _write_frame({"error": traceback.format_exc(limit=8)})
            continue
        if req["style"] == "trl":
            _write_frame(_trl(f, req["items"]))
        else:
            _write_frame(_verl(f, req["items"]))


main()
