#!/usr/bin/env python3
"""PyTorch counterpart of `rollflash bench-engine`: the same model, the same measurements.

A from-scratch Llama / Qwen2 / Qwen3-style decoder (RMSNorm, rotate-half RoPE, grouped-query
attention, SwiGLU, optional q/k RMSNorm, optional q/k/v biases, optional tied embeddings) in
float32 on the CPU. It loads a Hugging Face directory (config.json + model.safetensors), or only
its config.json with --random-weights (a real model's shapes: what the GPU bundle carries), or,
with no --model, builds the built-in default config of `ModelConfig::builtin_default` (Qwen3,
vocab 100, hidden 192, ...) with random weights.

Measurements (see crates/rollflash/src/bench.rs for ours):
  * decode, for each batch size B: B requests with the same prompt length and `new_tokens`
    tokens each, sampled at temperature 1 from the full softmax. The first step (prefill of every
    prompt + sampling of each request's first token) is timed separately; tokens/s counts the
    B * (new_tokens - 1) tokens of the following one-token steps, exactly as ours does. Then
    prefill alone (the B prompts and one sampled token each) is repeated on fresh caches until
    it has run 0.5 s (at least 3 runs), as ours repeats it on the same engine: one prefill of
    the default model takes about a millisecond, too short to time once. Ours
    batches continuously; here the batch is static, which for equal-length requests is the same
    schedule.
  * a training step: forward over train_seqs x train_len tokens, per-token log-probs of the next
    token (and, as ours does, per-token entropies, outside the graph), loss = -sum(log-probs),
    backward, global grad-norm clip to 1.0, AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight
    decay 0.01 on matrices only). One untimed warm-up step, then the mean over train_steps.

Output lines have the same format as ours, so scripts/bench_engine_vs_torch.sh parses both alike.

  .venv/bin/python scripts/bench_torch.py [--model DIR] [--threads 2] [--batch 1,16,64] ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    arch: str  # "Llama" | "Qwen2" | "Qwen3" (as ours prints it)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: list[int] = field(default_factory=list)

    @staticmethod
    def builtin_default(vocab_size: int = 100) -> "Config":
        # Mirrors ModelConfig::builtin_default (crates/rollflash-model/src/config.rs); the
        # built-in tokenizer has 100 tokens.
        return Config(
            arch="Qwen3",
            vocab_size=vocab_size,
            hidden_size=192,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=32,
            rms_norm_eps=1e-6,
            rope_theta=10_000.0,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            attention_bias=False,
            qk_norm=True,
        )

    @staticmethod
    def from_hf(path: Path) -> "Config":
        hf = json.loads(path.read_text())
        archs = hf.get("architectures") or []
        mt = hf.get("model_type")
        first = archs[0] if archs else None
        if first in ("LlamaForCausalLM", "MistralForCausalLM") or (not first and mt in ("llama", "mistral")):
            arch = "Llama"
        elif first == "Qwen2ForCausalLM" or (not first and mt == "qwen2"):
            arch = "Qwen2"
        elif first == "Qwen3ForCausalLM" or (not first and mt == "qwen3"):
            arch = "Qwen3"
        else:
            raise SystemExit(f"bench_torch.py: unsupported architecture {first or mt!r}")
        if hf.get("hidden_act", "silu") != "silu":
            raise SystemExit("bench_torch.py: only hidden_act = silu is supported")
        if hf.get("rope_scaling"):
            raise SystemExit("bench_torch.py: rope_scaling is not supported")
        h = hf["hidden_size"]
        nh = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        return Config(
            arch=arch,
            vocab_size=hf["vocab_size"],
            hidden_size=h,
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=nh,
            num_key_value_heads=hf.get("num_key_value_heads") or nh,
            head_dim=hf.get("head_dim") or h // nh,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=hf.get("rope_theta", 10_000.0),
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", arch == "Qwen2")),
            qk_norm=arch == "Qwen3",
            eos_token_ids=eos if isinstance(eos, list) else ([eos] if eos is not None else []),
        )

    def num_parameters(self) -> int:
        # Same count as ModelConfig::num_parameters.
        h = self.hidden_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            attn += q + 2 * kv
        if self.qk_norm:
            attn += 2 * self.head_dim
        layer = attn + 3 * h * self.intermediate_size + 2 * h
        embed = self.vocab_size * h
        return embed + (0 if self.tie_word_embeddings else embed) + self.num_hidden_layers * layer + h


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h, b = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=b)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=b)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=b)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, cos, sin, cache=None, start=0):
        # x: [B, T, H]; cos/sin: [T, hd]; cache: (k [B, nkv, L, hd], v [B, nkv, L, hd]) or None.
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            kc, vc = cache
            kc[:, :, start : start + T] = k
            vc[:, :, start : start + T] = v
            k, v = kc[:, :, : start + T], vc[:, :, : start + T]
        # Causal within the chunk; a one-token decode step attends to everything before it.
        o = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=self.nkv != self.nh)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class Mlp(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = Mlp(cfg)

    def forward(self, x, cos, sin, cache=None, start=0):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, start)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        hd = cfg.head_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(cfg.max_position_embeddings, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, ids, caches=None, start=0, last_only=False):
        T = ids.shape[1]
        cos, sin = self.cos[start : start + T], self.sin[start : start + T]
        x = self.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i], start)
        if last_only:
            x = x[:, -1:]
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, w)


def random_model(cfg: Config, device: str) -> CausalLM:
    """Seeded random weights as ours initialises them (matrices N(0, 0.02^2), norms 1, biases 0),
    built on `device` directly: a 1.5B model's initialisation on a 16-core host takes longer
    than on its GPU. Not the same numbers as ours (another generator): for speed only."""
    torch.manual_seed(0)
    with torch.device(device):
        m = CausalLM(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    return m


def load_model(args) -> tuple[CausalLM, str]:
    if args.model is None:
        return random_model(Config.builtin_default(), args.device), "built-in default"
    d = Path(args.model)
    cfg = Config.from_hf(d / "config.json")
    if args.random_weights:
        return random_model(cfg, args.device), f"{d} (its shapes, random weights)"
    from safetensors.torch import load_file

    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"bench_torch.py: no .safetensors file in {d}")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    state = {k: v.float() for k, v in state.items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    m = CausalLM(cfg)
    missing, unexpected = m.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"bench_torch.py: weights do not match: missing {missing}, unexpected {unexpected}")
    return m, str(d)


# Timing of the repeated prefill: at least this many runs, then more until this much time was
# spent in them, at most the maximum (the same rule as `rollflash bench-engine`'s).
PREFILL_MIN_RUNS = 3
PREFILL_SECS = 0.5
PREFILL_MAX_RUNS = 2000


def sync(args) -> None:
    """Waits for the device's queued work, so wall-clock times measure it (a no-op on the CPU)."""
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_decode(m: CausalLM, args) -> None:
    cfg = m.cfg
    vocab = cfg.vocab_size
    base = None
    total_len = args.prompt_len + args.new_tokens
    for b in args.batch:
        prompts = torch.tensor(
            [[(i * 31 + j * 7) % (vocab - 1) + 1 for j in range(args.prompt_len)] for i in range(b)],
            dtype=torch.long,
            device=args.device,
        )
        gen = torch.Generator(device=args.device).manual_seed(b)
        with torch.inference_mode():
            caches = [
                (
                    torch.empty(b, cfg.num_key_value_heads, total_len, cfg.head_dim, device=args.device, dtype=args.torch_dtype),
                    torch.empty(b, cfg.num_key_value_heads, total_len, cfg.head_dim, device=args.device, dtype=args.torch_dtype),
                )
                for _ in range(cfg.num_hidden_layers)
            ]

            def sample(logits):  # [b, 1, V] -> [b, 1]; temperature 1, no top-p/top-k
                probs = torch.softmax(logits[:, -1].float() / args.temperature, dim=-1)
                return torch.multinomial(probs, 1, generator=gen)

            sync(args)
            t0 = time.perf_counter()
            tok = sample(m(prompts, caches, 0, last_only=True))
            sync(args)
            prefill = time.perf_counter() - t0
            decoded = 0
            t1 = time.perf_counter()
            pos = args.prompt_len
            for _ in range(args.new_tokens - 1):
                tok = sample(m(tok, caches, pos))
                pos += 1
                decoded += b
            sync(args)
            dt = time.perf_counter() - t1
        tps = decoded / dt if dt > 0 else float("nan")
        if base is None:
            base = tps
        print(
            f"decode batch {b:>3}: {tps:>9.1f} tok/s ({tps / base:.1f}x batch {args.batch[0]}), "
            f"prefill {b * args.prompt_len} tok in {prefill:.3f} s",
            flush=True,
        )
        # Prefill alone, repeated on fresh caches until it has run for PREFILL_SECS (the rule of
        # `rollflash bench-engine`): one prefill of a tiny model takes about a millisecond.
        runs, spent = 0, 0.0
        while runs < PREFILL_MIN_RUNS or (spent < PREFILL_SECS and runs < PREFILL_MAX_RUNS):
            with torch.inference_mode():
                caches = [
                    (
                        torch.empty(b, cfg.num_key_value_heads, total_len, cfg.head_dim, device=args.device, dtype=args.torch_dtype),
                        torch.empty(b, cfg.num_key_value_heads, total_len, cfg.head_dim, device=args.device, dtype=args.torch_dtype),
                    )
                    for _ in range(cfg.num_hidden_layers)
                ]
                sync(args)
                t0 = time.perf_counter()
                sample(m(prompts, caches, 0, last_only=True))
                sync(args)
                spent += time.perf_counter() - t0
            runs += 1
        print(
            f"prefill batch {b:>3}: {runs * b * args.prompt_len / spent:>9.1f} tok/s "
            f"over {runs} runs of {b * args.prompt_len} tokens",
            flush=True,
        )


def bench_train(m: CausalLM, args) -> None:
    vocab = m.cfg.vocab_size
    seqs = torch.tensor(
        [[(i * 13 + j * 5) % (vocab - 1) + 1 for j in range(args.train_len)] for i in range(args.train_seqs)],
        dtype=torch.long,
        device=args.device,
    )
    decay = [p for p in m.parameters() if p.dim() >= 2]
    no_decay = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
    )
    m.train()

    def step():
        opt.zero_grad(set_to_none=True)
        logits = m(seqs)  # [S, L, V]
        logp = torch.log_softmax(logits, dim=-1)
        lp = logp[:, :-1].gather(-1, seqs[:, 1:, None]).squeeze(-1)
        if args.entropy:
            # Ours computes per-token entropies in the same pass (not part of the loss).
            with torch.no_grad():
                d = logp.detach()
                _ = -(d.exp() * d).sum(-1)
        loss = -lp.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()

    step()
    sync(args)
    t0 = time.perf_counter()
    for _ in range(args.train_steps):
        step()
    sync(args)
    dt = (time.perf_counter() - t0) / max(args.train_steps, 1)
    toks = args.train_seqs * args.train_len
    print(
        f"train step ({args.train_seqs} x {args.train_len} tokens, forward+backward+AdamW): "
        f"{dt:.3f} s, {toks / dt:.0f} tok/s",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="Hugging Face directory; the built-in default (random) when absent")
    p.add_argument("--random-weights", action="store_true",
                   help="with --model: read only its config.json and use seeded random weights of its shapes")
    p.add_argument("--batch", default="1,16,64", help="decode batch sizes, comma-separated")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--train-seqs", type=int, default=16)
    p.add_argument("--train-len", type=int, default=128)
    p.add_argument("--train-steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--no-entropy", dest="entropy", action="store_false",
                   help="skip the (unused) per-token entropies in the training step")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (scripts/device_check.sh)")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    args = p.parse_args()
    args.torch_dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    args.batch = [int(x) for x in args.batch.split(",") if x]
    if args.random_weights and args.model is None:
        raise SystemExit("bench_torch.py: --random-weights needs --model DIR (its config.json)")
    if args.new_tokens < 1 or args.prompt_len < 1:
        raise SystemExit("bench_torch.py: --new-tokens and --prompt-len must be at least 1")

    torch.set_num_threads(args.threads)
    m, name = load_model(args)
    m = m.to(device=args.device, dtype=args.torch_dtype)
    m.eval()
    cfg = m.cfg
    if args.prompt_len + args.new_tokens > cfg.max_position_embeddings:
        raise SystemExit("bench_torch.py: prompt + new tokens exceed max_position_embeddings")
    print(
        f"model: {name} ({cfg.arch}, {cfg.num_parameters() / 1e6:.1f} M params), threads: {args.threads} "
        f"[torch {torch.__version__}, {args.device}, {args.dtype}], "
        f"cpu kernels: {torch.backends.cpu.get_cpu_capability().lower()}",
        flush=True,
    )
    if not args.skip_decode:
        bench_decode(m, args)
    if not args.skip_train:
        bench_train(m, args)


if __name__ == "__main__":
    main()
