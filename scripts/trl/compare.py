#!/usr/bin/env python3
"""The table of scripts/bench_vs_trl.sh: reads what its runs left in OUT and prints a markdown
comparison (both sides, and rollflash ÷ TRL), the settings mapped between the two and every
difference that could not be removed; writes OUT/results.json and OUT/results.md.

    compare.py OUT

OUT holds settings.json (written by bench_vs_trl.sh), grad_check.json (scripts/trl/grad_check.py,
when the `grad` run ran), and for each run NAME among rf_sync, rf_async and trl_sync: NAME/
(rollflash: summary.json, metrics.jsonl; TRL: trl.json) and NAME.measure.json
(scripts/trl/measure.py: the whole process's wall time and peak RSS). A run
that is missing shows as "—". Standard library only.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_rows(path: Path):
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def rollflash_side(out: Path, name: str):
    d = out / name
    summary = load(d / "summary.json")
    if summary is None:
        return None
    rows = load_rows(d / "metrics.jsonl")
    m = load(out / f"{name}.measure.json") or {}
    eb, ea = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    trained = (summary.get("accounting") or {}).get("trained")
    return {
        "process_wall_s": m.get("wall_s"),
        "train_wall_s": summary.get("wall_s"),
        "steps": summary.get("steps"),
        "trained_samples": trained,
        "samples_per_s": summary.get("samples_per_s"),
        "step_s": mean(r.get("wall_s") for r in rows),
        # The trainer's wait for its batch: in the synchronous run that is the generation (and
        # grading) of the batch; at α = 1 it is what generation leaves exposed.
        "step_generate_s": mean(r.get("wait_s") for r in rows),
        "step_train_s": mean(r.get("train_s") for r in rows),
        "reward_mean": mean(r.get("reward") for r in rows),
        "staleness_mean": mean(r.get("staleness") for r in rows),
        "eval_before": eb.get("success_rate"),
        "eval_after": ea.get("success_rate"),
        "eval_tasks": eb.get("tasks"),
        "peak_rss_mb": m.get("max_rss_mb"),
        "rc": m.get("rc"),
    }


def trl_side(out: Path, name: str):
    t = load(out / name / "trl.json")
    if t is None:
        return None
    m = load(out / f"{name}.measure.json") or {}
    steps = t.get("steps") or []
    eb, ea = t.get("eval_before") or {}, t.get("eval_after") or {}
    return {
        "process_wall_s": m.get("wall_s"),
        "train_wall_s": t.get("train_wall_s"),
        "steps": len(steps),
        "trained_samples": t.get("trained_samples"),
        "samples_per_s": t.get("samples_per_s"),
        "step_s": mean(s.get("wall_s") for s in steps),
        # Generation, grading and advantages: GRPOTrainer._generate_and_score_completions.
        "step_generate_s": mean(s.get("generate_s") for s in steps),
        "step_train_s": mean(s.get("train_s") for s in steps),
        "reward_mean": mean(s.get("reward") for s in steps),
        "staleness_mean": 0.0 if steps else None,
        "eval_before": eb.get("success_rate"),
        "eval_after": ea.get("success_rate"),
        "eval_tasks": eb.get("tasks"),
        "peak_rss_mb": m.get("max_rss_mb", t.get("peak_rss_mb_self")),
        "verifier_rss_mb": t.get("verifier_peak_rss_mb"),
        "rc": m.get("rc"),
        "order": t.get("order"),
        "versions": t.get("versions"),
        "stop_ids": (t.get("settings") or {}).get("stop_ids_trl"),
    }


ROWS = [
    ("wall time, whole process (s)", "process_wall_s", "{:.1f}"),
    ("wall time, training loop (s)", "train_wall_s", "{:.1f}"),
    ("steps", "steps", "{}"),
    ("trained samples", "trained_samples", "{}"),
    ("trained samples/s (training loop)", "samples_per_s", "{:.3f}"),
    ("time per step, mean (s)", "step_s", "{:.2f}"),
    ("  generation per step (s)", "step_generate_s", "{:.2f}"),
    ("  training per step (s)", "step_train_s", "{:.2f}"),
    ("mean training reward", "reward_mean", "{:.3f}"),
    ("mean staleness (versions)", "staleness_mean", "{:.2f}"),
    ("held-out greedy accuracy before", "eval_before", "{:.3f}"),
    ("held-out greedy accuracy after", "eval_after", "{:.3f}"),
    ("peak memory, max RSS (MB)", "peak_rss_mb", "{:.0f}"),
]


def fmt(spec, v):
    return "—" if v is None else spec.format(v)


def table(title, rf, trl, trl_label, note=None):
    lines = [f"### {title}", ""]
    if note:
        lines += [note, ""]
    lines += [f"| | rollflash | {trl_label} | rollflash ÷ TRL |", "| --- | ---: | ---: | ---: |"]
    for label, key, spec in ROWS:
        a = (rf or {}).get(key)
        b = (trl or {}).get(key)
        ratio = "—"
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b and key not in ("steps", "eval_tasks", "staleness_mean"):
            ratio = f"{a / b:.2f}×"
        lines.append(f"| {label} | {fmt(spec, a)} | {fmt(spec, b)} | {ratio} |")
    if trl and trl.get("verifier_rss_mb"):
        lines.append(f"| (TRL's verifier subprocess, max RSS MB) | — | {trl['verifier_rss_mb']:.0f} | |")
    for side, r in (("rollflash", rf), ("TRL", trl)):
        if r is None:
            lines.append(f"\n{side}: no result (run missing or failed).")
        elif r.get("rc") not in (0, None):
            lines.append(f"\n{side}: the process exited {r['rc']}.")
    return "\n".join(lines)


def settings_table(s, trl):
    order = (trl or {}).get("order") or {}
    ids = (
        f"checked equal on {order.get('prompt_ids_equal')}/{order.get('prompt_ids_checked')} trained prompts"
        if order.get("prompt_ids_checked")
        else "not checked (no rollflash trajectories.jsonl to compare with)"
    )
    if order.get("first_difference"):
        ids += " — first difference: " + json.dumps(order["first_difference"])[:400]
    stop = (trl or {}).get("stop_ids")
    v = (trl or {}).get("versions") or {}
    rows = [
        ("model", f"`{s['model']}` (f32)", "same directory, `AutoModelForCausalLM`, float32 (TRL's bf16 default off)", "same"),
        ("train rows", f"`{s['train']}`, rollflash's seeded epoch order (shuffle_seed 0)",
         "the same rows in the order the rollflash sync run trained them, step by step (`--order`, `shuffle_dataset=False`)"
         if order.get("steps_from_rollflash") else "a seeded shuffle of the same file",
         "same per step vs the sync run" if order.get("steps_from_rollflash") else "**differs**: order"),
        ("held-out rows", f"first {s['eval']} of `{s['test']}` (greedy)", f"first {s['eval']} of the same file (greedy)", "same"),
        ("prompt", "`{question}` as the user turn, model's chat template (its default system turn), `add_generation_prompt`, no special tokens added",
         "conversational prompt `[{role: user, content: question}]` through `apply_chat_template` (what GRPOTrainer does)", ids),
        ("reward", "dataset task, `extract = [boxed, last_number]`, `format_weight = 0`, in process",
         f"`{s['verifier']}` (one subprocess, same verifier)", "same grader" if not s.get("verifier_stub") else "**differs: VERIFIER_STUB=1, a crude stand-in grades TRL**"),
        ("prompts per step × group size", f"{s['prompts']} × {s['group']}", f"generation batch {s['prompts'] * s['group']}, num_generations {s['group']}", "same"),
        ("micro-batch", f"train.micro_batch_size {s['micro']}", f"per_device_train_batch_size {s['micro']}, gradient_accumulation_steps = steps_per_generation", "same"),
        ("max new tokens", f"{s['max_new']} (max_total_tokens {s['max_total']}, never binding)", f"max_completion_length {s['max_new']} (no total cap)", "same"),
        ("sampling", f"temperature {s['temperature']}, top_p 1, no top_k", f"temperature {s['temperature']}, top_p 1, top_k 0", "same"),
        ("stop tokens", "config + generation_config + tokenizer eos", f"generation_config + tokenizer eos: {stop}", "same set"),
        ("learning rate", f"{s['lr']}, linear warm-up lr·(s+1)/{s['warmup']} then constant", "same formula as a LambdaLR passed to the trainer", "same"),
        ("optimiser", "AdamW β (0.9, 0.999), ε 1e-8, weight decay 0, grad-norm clip 1.0", "torch AdamW, same values", "same"),
        ("policy loss", "decoupled PPO, clip 0.2/0.2, behaviour-weight cap 5, one update per batch",
         "PPO clip ε = ε_high = 0.2, num_iterations 1 (ratio ≡ 1: old = current, detached)",
         "**differs**: rollflash weights tokens by π_prox/π_behav (engine vs trainer numerics, ≈ 1 at α = 0; the staleness correction at α = 1); TRL has no such term"),
        ("loss aggregation", "seq_mean_token_mean", "loss_type = \"grpo\" (mean over tokens, then sequences)", "same"),
        ("advantages", "GRPO (r − mean_g)/(std_g + 1e-6), unbiased std", "scale_rewards = \"group\": (r − mean_g)/(std_g + 1e-4), unbiased std",
         "**differs**: ε 1e-6 vs TRL's hard-coded 1e-4 (≤ 0.03% on 0/1 rewards)"),
        ("KL / entropy terms", "kl_coef 0, entropy_coef 0", "beta 0 (no reference model), entropy_coef 0", "same"),
        ("truncated completions", "trained", "trained (mask_truncated_completions false)", "same"),
        ("activation memory", "no activation checkpointing", "gradient_checkpointing false (TRL's default is true)", "same"),
        ("threads", f"train.threads {s['rf_train_threads']}, {s['rf_engines']} engine(s) × {s['rf_engine_threads']} thread(s)",
         f"torch.set_num_threads({s['trl_threads']}), one process generating then training",
         "same cores; at α = 1 rollflash's engines and trainer run at once"),
        ("generation", "rollflash's engine (continuous batching, requests of the step in flight)",
         "one padded `transformers.generate` over the step's sequences (static batch, runs to the longest)", "what is being compared"),
        ("asynchrony", "sync: controller.sync = true (α = 0); async: α = 1 (the default)",
         "synchronous only: TRL's `AsyncGRPOTrainer` (trl.experimental.async_grpo) generates on a vLLM server only, there is no CPU/in-process async",
         "**differs**: the async table compares rollflash α = 1 with TRL's synchronous run"),
        ("random streams", f"rollflash `seed = {s.get('seed', 0)}`", f"torch seed {s.get('seed', 0)}", "**differs**: samples are not the same draws"),
        ("versions", "this checkout's `rollflash`", f"trl {v.get('trl')}, transformers {v.get('transformers')}, torch {v.get('torch')}", ""),
    ]
    lines = ["### Settings, side by side", "", "| setting | rollflash | TRL | match |", "| --- | --- | --- | --- |"]
    for r in rows:
        lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |")
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: compare.py OUT")
    out = Path(sys.argv[1])
    s = load(out / "settings.json") or {}
    rf_sync = rollflash_side(out, "rf_sync")
    rf_async = rollflash_side(out, "rf_async")
    trl_sync = trl_side(out, "trl_sync")
    head = (
        f"## rollflash vs TRL GRPOTrainer on chain_sum ({s.get('label', '')})\n\n"
        f"{s.get('steps')} steps of {s.get('prompts')} prompts × {s.get('group')} samples, {s.get('max_new')} new tokens, "
        f"lr {s.get('lr')}, held-out greedy accuracy on {s.get('eval')} problems; {s.get('cores', '?')} cores. "
        "Ratios are rollflash ÷ TRL: above 1 for samples/s means rollflash is faster; below 1 for times and memory "
        "means rollflash takes less."
    )
    parts = [
        head,
        table("Synchronous: rollflash α = 0 (`controller.sync = true`) vs TRL GRPOTrainer (its default)", rf_sync, trl_sync, "TRL"),
        table(
            "Asynchronous: rollflash α = 1 (its default) vs TRL",
            rf_async,
            trl_sync,
            "TRL (synchronous)",
            note="TRL has no asynchronous mode on the CPU (its AsyncGRPOTrainer needs a vLLM server), so this compares "
            "rollflash's α = 1 with the same synchronous TRL run as above.",
        ),
        settings_table(s, trl_sync),
    ]
    grad = load(out / "grad_check.json")
    if grad is not None:
        if grad.get("pass") is None:
            parts.insert(3, f"### The first step's gradient vs PyTorch's\n\nNot compared: {grad.get('why')}.")
        else:
            parts.insert(3, (
                "### The first step's gradient vs PyTorch's\n\n"
                f"rollflash's gradient of its first step (from AdamW's first moment) against PyTorch's gradient of TRL's "
                f"`grpo` loss on the same {grad['samples']} samples ({grad['groups_with_signal']} group(s) with a reward "
                f"spread), `scripts/trl/grad_check.py`: cosine **{grad['cosine']:.6f}**, norm ratio "
                f"{grad['norm_ratio']:.4f} ({grad['grad_norm_rollflash']:.4f} vs {grad['grad_norm_torch']:.4f}), lowest "
                f"per-tensor cosine {grad['lowest_tensor_cosine']:.6f} (`{grad['lowest_tensor']}`): "
                + ("**passes** (cosine ≥ 0.999, norms within 1%)." if grad["pass"] else "**FAILS** (cosine ≥ 0.999, norms within 1%).")
            ))
    md = "\n\n".join(parts) + "\n"
    print(md)
    (out / "results.md").write_text(md)
    (out / "results.json").write_text(
        json.dumps({"settings": s, "rollflash_sync": rf_sync, "rollflash_async": rf_async, "trl_sync": trl_sync,
                    "grad_check": grad}, indent=2)
    )


if __name__ == "__main__":
    main()
