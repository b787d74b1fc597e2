"""rollflash's first RL step against PyTorch: the gradient of TRL's GRPO loss on the very samples
rollflash trained on, taken with transformers' model of the same weights, compared with
rollflash's own gradient of that step.

    grad_check.py RUN_DIR MODEL_DIR OUT_JSON [--max-grad-norm 1.0]

RUN_DIR is a one-step synchronous rollflash run (scripts/bench_vs_trl.sh's `grad` run) that
logged every trajectory of step 0 (`dashboard.trajectories_per_step`) and wrote the checkpoint
of step 1. rollflash's gradient is read back from AdamW's first moment after one step,
m = (1 - beta1) * clip * g (`crates/rollflash-model/src/train.rs`, `AdamW::step`), with clip
= min(1, max_grad_norm / |g|) from the step's logged grad_norm. The PyTorch side is TRL's
`loss_type="grpo"` at ratio 1 (one update per batch): advantages (r - mean) / (std + eps) per
group of one prompt (unbiased std, as torch.std), each sequence's token-mean of -A * log p over
its response tokens, mean over sequences. Passes when the cosine between the two gradients is at
least 0.999 and their norms agree within 1%: what the f32 arithmetic of two implementations
allows, and far below what a wrong token alignment, advantage or aggregation would give.
"""

import argparse
import collections
import json
import math
import sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

BETA1 = 0.9  # rollflash's train.adam_beta1 default; the bench does not change it


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    trajs = [json.loads(x) for x in open(f"{a.run}/trajectories.jsonl") if x.strip()]
    trajs = [t for t in trajs if t["step"] == 0]
    step0 = json.loads(open(f"{a.run}/metrics.jsonl").readline())
    if len(trajs) != step0["trained"]:
        sys.exit(f"{len(trajs)} trajectories logged for step 0, {step0['trained']} trained: "
                 "set dashboard.trajectories_per_step to the batch size")
    grad_norm = step0["grad_norm"]
    if grad_norm == 0.0:
        result = {"pass": None, "why": "no group of step 0 had a reward spread (zero gradient); try another SEED"}
        json.dump(result, open(a.out, "w"), indent=2)
        print(result["why"])
        return
    clip = min(1.0, a.max_grad_norm / grad_norm)

    groups = collections.defaultdict(list)
    for t in trajs:
        groups[t["seed"]].append(t["reward"])
    stats = {}
    for s, rs in groups.items():
        mu = sum(rs) / len(rs)
        sd = math.sqrt(sum((r - mu) ** 2 for r in rs) / (len(rs) - 1)) if len(rs) > 1 else 0.0
        stats[s] = (mu, sd)

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.zero_grad()
    n = len(trajs)
    for t in trajs:
        ids = torch.tensor([t["token_ids"]])
        resp_len = t["response_tokens"]
        prompt_len = ids.shape[1] - resp_len
        mu, sd = stats[t["seed"]]
        adv = (t["reward"] - mu) / (sd + 1e-6)
        if adv == 0.0:
            continue
        logits = model(ids).logits[0, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        resp = logp[prompt_len - 1:]
        assert resp.shape[0] == resp_len, (resp.shape, resp_len)
        (-(adv * resp).mean() / n).backward()

    opt = safe_open(f"{a.run}/checkpoints/step-00000001/optimizer.safetensors", "pt")
    keys = set(opt.keys())
    dot = n_torch = n_ours = 0.0
    per = []
    missing = []
    for name, param in model.named_parameters():
        key = f"exp_avg.{name}"
        if key not in keys or param.grad is None:
            missing.append(name)
            continue
        g_ours = opt.get_tensor(key).double() / ((1.0 - BETA1) * clip)
        g_torch = param.grad.double()
        d = (g_ours * g_torch).sum().item()
        a2 = (g_torch ** 2).sum().item()
        b2 = (g_ours ** 2).sum().item()
        dot, n_torch, n_ours = dot + d, n_torch + a2, n_ours + b2
        if a2 > 0 and b2 > 0:
            per.append((d / math.sqrt(a2 * b2), name))
    per.sort()
    cosine = dot / math.sqrt(n_torch * n_ours)
    ratio = math.sqrt(n_ours / n_torch)
    result = {
        "samples": n,
        "groups_with_signal": sum(1 for mu, sd in stats.values() if sd > 0),
        "grad_norm_rollflash": math.sqrt(n_ours),
        "grad_norm_torch": math.sqrt(n_torch),
        "norm_ratio": ratio,
        "cosine": cosine,
        "lowest_tensor_cosine": per[0][0] if per else None,
        "lowest_tensor": per[0][1] if per else None,
        "missing": missing,
        "pass": cosine >= 0.999 and abs(ratio - 1.0) <= 0.01 and not missing,
    }
    json.dump(result, open(a.out, "w"), indent=2)
    print(json.dumps(result, indent=2))
    if not result["pass"]:
        sys.exit("rollflash's first-step gradient differs from PyTorch's")


if __name__ == "__main__":
    main()
