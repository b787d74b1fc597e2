#!/usr/bin/env python3
"""TRL's side of scripts/bench_vs_trl.sh: GRPOTrainer on chain_sum with the settings of a
`rollflash train --config configs/reasoning_gym_chain_sum.toml` run, timed per step
(generation vs training), with a greedy held-out evaluation before and after graded by
rollflash's own verifier. Writes OUT/trl.json; bench_vs_trl.sh puts it beside rollflash's
summary.json and metrics.jsonl (scripts/trl/compare.py).

Run with the venv of scripts/trl/setup_venv.sh:

    PY="$(scripts/trl/setup_venv.sh)"
    "$PY" scripts/trl/grpo_trl.py --model models/smollm2-hf \
        --train data/reasoning_gym/chain_sum_train.jsonl \
        --test data/reasoning_gym/chain_sum_test.jsonl \
        --verifier "target/release/rollflash verify --stdin --extract boxed,last_number" \
        --out /tmp/trl --steps 2 --prompts 2 --group 2 --max-new 8 --eval 4

--order RUN_DIR feeds it the prompts a rollflash run trained on, step by step (from that run's
trajectories.jsonl, saved with `dashboard.trajectories_per_step` = the batch size), and checks
that TRL's prompt token ids equal the ones rollflash generated from.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from verifier import Verifier  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face model directory")
    p.add_argument("--train", required=True, help="train JSONL (question, answer, id)")
    p.add_argument("--test", required=True, help="held-out JSONL (question, answer, id)")
    p.add_argument("--verifier", required=True, help="command of the stdin verifier (one JSON line per line)")
    p.add_argument("--out", required=True, help="output folder (trl.json, TRL's own output_dir)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prompts", type=int, default=4, help="prompts (groups) per step")
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--micro", type=int, default=8, help="sequences per forward/backward (gradient accumulation)")
    p.add_argument("--max-new", type=int, default=40)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--warmup", type=int, default=5, help="linear warm-up steps: lr*(s+1)/W, as rollflash")
    p.add_argument("--adam-beta1", type=float, default=0.9)
    p.add_argument("--adam-beta2", type=float, default=0.999)
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--clip", type=float, default=0.2, help="PPO clip epsilon (low and high)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval", type=int, default=100, help="held-out problems (the file's first N), greedy; 0 = none")
    p.add_argument("--eval-batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--order", help="a rollflash run directory whose trajectories.jsonl gives the prompts per step")
    p.add_argument("--grad-checkpointing", action="store_true", help="TRL's default; off unless asked (rollflash has none)")
    return p.parse_args(argv)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def messages(question: str):
    # What rollflash's dataset task makes of `template = "{question}"` with no `system` field: one
    # user turn, rendered through the model's chat template with add_generation_prompt.
    return [{"role": "user", "content": question}]


def user_text(prompt_text: str) -> str | None:
    """The user turn of a ChatML prompt as rollflash decoded it (special tokens kept)."""
    start = prompt_text.rfind("<|im_start|>user\n")
    if start < 0:
        return None
    rest = prompt_text[start + len("<|im_start|>user\n") :]
    end = rest.find("<|im_end|>")
    return rest[:end] if end >= 0 else None


def rollflash_order(run_dir: Path):
    """Per step, the groups (seed order as saved) a rollflash run trained on: [(question, prompt_ids)]."""
    path = run_dir / "trajectories.jsonl"
    steps: dict[int, dict[int, tuple[str, list[int]]]] = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            prompt = next((p["text"] for p in r["pieces"] if p["role"] == "prompt"), "")
            q = user_text(prompt)
            if q is None:
                raise SystemExit(f"{path}: a prompt without a ChatML user turn: {prompt[:200]!r}")
            ids = r["token_ids"][: len(r["token_ids"]) - r["response_tokens"]]
            steps.setdefault(r["step"], {}).setdefault(r["seed"], (q, ids))
    return [list(steps[s].values()) for s in sorted(steps)]


def main(argv=None):
    a = parse_args(argv)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("WANDB_DISABLED", "true")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    t_start = time.perf_counter()
    import torch

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    random.seed(a.seed)
    torch.manual_seed(a.seed)
    batch = a.prompts * a.group
    micro = a.micro if a.micro > 0 and batch % a.micro == 0 else batch
    accum = batch // micro

    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    load_s = time.perf_counter() - t_start

    def prompt_ids(question: str) -> list[int]:
        enc = tok.apply_chat_template(messages(question), add_generation_prompt=True, tokenize=True)
        if hasattr(enc, "keys") and "input_ids" in enc:
            enc = enc["input_ids"]
        return list(enc)

    # The stop ids: generation_config's (or config's) eos ids plus the tokenizer's, as both
    # rollflash (ModelConfig::stop_tokens) and TRL (GRPOTrainer.eos_token_ids) take them.
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tok.eos_token_id is not None and tok.eos_token_id not in eos:
        eos.insert(0, tok.eos_token_id)

    verifier = Verifier(a.verifier)
    test_rows = read_jsonl(a.test)[: a.eval]

    def evaluate(tag: str):
        if not test_rows:
            return None
        t0 = time.perf_counter()
        model.eval()
        rewards, lengths = [], []
        with torch.no_grad():
            for i in range(0, len(test_rows), a.eval_batch):
                rows = test_rows[i : i + a.eval_batch]
                ids = [prompt_ids(r["question"]) for r in rows]
                width = max(map(len, ids))
                input_ids = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in ids])
                mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
                gen = model.generate(
                    input_ids=input_ids,
                    attention_mask=mask,
                    do_sample=False,
                    max_new_tokens=a.max_new,
                    eos_token_id=eos,
                    pad_token_id=tok.pad_token_id,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                )[:, width:]
                for r, g in zip(rows, gen.tolist(), strict=True):
                    cut = next((j + 1 for j, t in enumerate(g) if t in eos), len(g))
                    lengths.append(cut)
                    text = tok.decode(g[:cut], skip_special_tokens=True)
                    rewards.append(verifier.score(r["answer"], text))
        dt = time.perf_counter() - t0
        res = {
            "tasks": len(rewards),
            "mean_reward": sum(rewards) / len(rewards),
            "success_rate": sum(r >= 1.0 for r in rewards) / len(rewards),
            "seconds": dt,
            "response_len_mean": sum(lengths) / len(lengths),
        }
        print(f"[trl] eval {tag}: greedy success {res['success_rate']:.3f} on {res['tasks']} in {dt:.1f}s", flush=True)
        return res

    eval_before = evaluate("before")

    # Training prompts: rollflash's, step by step, when a run directory is given; else a seeded
    # shuffle of the train file (TRL's own sampler would also shuffle, with its own seed).
    train_rows = read_jsonl(a.train)
    by_question = {}
    for r in train_rows:
        by_question.setdefault(r["question"], r)
    order_info = None
    if a.order:
        steps = rollflash_order(Path(a.order))
        chosen, checked, equal, first_diff = [], 0, 0, None
        for s, groups in enumerate(steps[: a.steps]):
            if len(groups) != a.prompts:
                raise SystemExit(f"{a.order}: step {s} trained {len(groups)} groups, expected {a.prompts}")
            for q, rf_ids in groups:
                row = by_question.get(q)
                if row is None:
                    raise SystemExit(f"{a.order}: a trained prompt is not in {a.train}: {q[:120]!r}")
                chosen.append(row)
                ours = prompt_ids(q)
                checked += 1
                if ours == rf_ids:
                    equal += 1
                elif first_diff is None:
                    first_diff = {"question": q, "rollflash": rf_ids, "trl": ours}
        if len(steps) < a.steps:
            # A shorter rollflash run: the remaining steps draw from rows it did not use.
            used = {r["question"] for r in chosen}
            rest = [r for r in train_rows if r["question"] not in used]
            random.Random(a.seed).shuffle(rest)
            chosen += rest[: (a.steps - len(steps)) * a.prompts]
        order_info = {
            "source": str(Path(a.order) / "trajectories.jsonl"),
            "steps_from_rollflash": min(len(steps), a.steps),
            "prompt_ids_checked": checked,
            "prompt_ids_equal": equal,
            "first_difference": first_diff,
        }
        print(f"[trl] prompts of {order_info['steps_from_rollflash']} steps from {order_info['source']}; "
              f"prompt token ids equal to rollflash's on {equal}/{checked}", flush=True)
        shuffle = False
    else:
        chosen = list(train_rows)
        random.Random(a.seed).shuffle(chosen)
        chosen = chosen[: a.steps * a.prompts]
        shuffle = False
    dataset = Dataset.from_list(
        [{"prompt": messages(r["question"]), "answer": str(r["answer"]), "row_id": str(r.get("id", ""))} for r in chosen]
    )

    step_rewards: list[float] = []
    reward_seconds = [0.0]

    def chain_sum_reward(prompts, completions, answer, **kwargs):
        t0 = time.perf_counter()
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rs = verifier.score_many(answer, texts)
        step_rewards.extend(rs)
        reward_seconds[0] += time.perf_counter() - t0
        return rs

    class Timed(GRPOTrainer):
        gen_seconds = 0.0
        gen_calls = 0

        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                Timed.gen_seconds += time.perf_counter() - t0
                Timed.gen_calls += 1

    steps_log: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()
            self.g0 = Timed.gen_seconds
            self.r0 = reward_seconds[0]
            self.lr = sched.get_last_lr()[0]
            step_rewards.clear()

        def on_step_end(self, args, state, control, **kw):
            wall = time.perf_counter() - self.t0
            gen = Timed.gen_seconds - self.g0
            rs = list(step_rewards)
            steps_log.append({
                "step": state.global_step,
                "wall_s": wall,
                "generate_s": gen,
                "reward_s": reward_seconds[0] - self.r0,
                "train_s": wall - gen,
                "samples": len(rs),
                "reward": sum(rs) / len(rs) if rs else None,
                "accuracy": sum(r >= 1.0 for r in rs) / len(rs) if rs else None,
                "lr": self.lr,
            })
            print(f"[trl] step {state.global_step}: {wall:.1f}s (generation {gen:.1f}s, training {wall - gen:.1f}s), "
                  f"reward {steps_log[-1]['reward']}", flush=True)

    # rollflash's optimiser: AdamW, linear warm-up lr*(s+1)/W then constant (OptimizerConfig::lr_at
    # with total_steps 0); transformers' constant_with_warmup starts at 0, so the schedule is ours.
    opt = torch.optim.AdamW(
        model.parameters(), lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_eps, weight_decay=a.weight_decay,
        fused=True,  # what transformers' default optim (adamw_torch_fused, torch >= 2.8) would build; fastest on CPU
    )
    warm = a.warmup
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm > 0 else 1.0)

    cfg = GRPOConfig(
        output_dir=str(out / "trl_output"),
        max_steps=a.steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum,  # one generation of prompts*group per optimiser step
        num_generations=a.group,
        max_completion_length=a.max_new,
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=0,
        learning_rate=a.lr,
        adam_beta1=a.adam_beta1,
        adam_beta2=a.adam_beta2,
        adam_epsilon=a.adam_eps,
        weight_decay=a.weight_decay,
        max_grad_norm=a.max_grad_norm,
        beta=0.0,  # rollflash: kl_coef 0 (no reference model)
        num_iterations=1,  # one optimiser step per batch
        epsilon=a.clip,
        epsilon_high=a.clip,
        loss_type="grpo",  # rollflash's seq_mean_token_mean
        scale_rewards="group",  # (r - mean_g) / (std_g + eps), unbiased std
        mask_truncated_completions=False,
        shuffle_dataset=shuffle,
        gradient_checkpointing=a.grad_checkpointing,
        bf16=False,
        fp16=False,
        use_cpu=True,
        seed=a.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
    )
    trainer = Timed(
        model=model,
        reward_funcs=chain_sum_reward,
        args=cfg,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[StepTimer()],
        optimizers=(opt, sched),
    )
    trl_eos = list(getattr(trainer, "eos_token_ids", []) or [])
    t0 = time.perf_counter()
    trainer.train()
    train_wall = time.perf_counter() - t0
    trained = sum(s["samples"] for s in steps_log)

    eval_after = evaluate("after")
    verifier_rss = verifier.peak_rss_mb()
    verifier.close()

    res = {
        "side": "trl",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "settings": {
            "steps": a.steps, "prompts": a.prompts, "group": a.group, "micro_batch": micro,
            "gradient_accumulation_steps": accum, "max_new_tokens": a.max_new, "temperature": a.temperature,
            "top_p": a.top_p, "lr": a.lr, "warmup": a.warmup, "threads": a.threads, "eval": len(test_rows),
            "adam": [a.adam_beta1, a.adam_beta2, a.adam_eps], "weight_decay": a.weight_decay,
            "max_grad_norm": a.max_grad_norm, "clip": a.clip, "gradient_checkpointing": a.grad_checkpointing,
            "stop_ids_eval": eos, "stop_ids_trl": trl_eos,
        },
        "order": order_info,
        "load_s": load_s,
        "train_wall_s": train_wall,
        "trained_samples": trained,
        "samples_per_s": trained / train_wall if train_wall > 0 else None,
        "steps": steps_log,
        "generate_s_total": Timed.gen_seconds,
        "reward_s_total": reward_seconds[0],
        "eval_before": eval_before,
        "eval_after": eval_after,
        "peak_rss_mb_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "verifier_peak_rss_mb": verifier_rss,
        "verifier_calls": verifier.calls,
        "verifier_s": verifier.seconds,
        "process_s": time.perf_counter() - t_start,
    }
    (out / "trl.json").write_text(json.dumps(res, indent=2))
    print(f"[trl] {len(steps_log)} steps, {trained} samples in {train_wall:.1f}s; wrote {out / 'trl.json'}", flush=True)


if __name__ == "__main__":
    main()
