#!/usr/bin/env python3
"""Independent float64 NumPy reference for the Hugging Face decoder forward pass.

Written from the published definitions in `transformers`' modeling_llama.py, modeling_qwen2.py
and modeling_qwen3.py, without importing them, so that rollflash's Rust forward pass can be
checked against something that shares none of its code.

Per layer (pre-norm decoder):
    h  = x + o_proj(attn(rope(qk_norm(q_proj(rms(x)))), rope(qk_norm(k_proj(rms(x)))), v_proj(rms(x))))
    x' = h + down_proj(silu(gate_proj(rms(h))) * up_proj(rms(h)))
then the final RMSNorm and lm_head (or the embedding matrix when tie_word_embeddings).

Family differences:
    llama : no biases (attention_bias / mlp_bias honoured if set), no q/k norm.
    qwen2 : bias on q, k, v (always, as in modeling_qwen2.py), none on o.
    qwen3 : RMSNorm over head_dim on each head of q and k (q_norm, k_norm) before rotary;
            biases only if attention_bias.

Numerics: everything is computed in float64 from the checkpoint's weights upcast to float64,
including the rotary tables. (transformers itself builds cos/sin in float32 even for a float64
model; `self-check` reports how much that changes the logits, ~1e-7.)

Modes:
    forward MODEL_DIR TOKEN...   print logits [T, V] for an HF model directory
    generate-fixtures            write tiny random HF checkpoints + reference logits into
                                 crates/rollflash-model/tests/fixtures/ref_{llama,qwen2,qwen3}/
                                 and then run the self-check on them
    self-check                   consistency checks of this reference on the fixtures (and a
                                 cross-check against torch float64 if torch is importable)

Setup:  scripts/setup_python.sh && .venv/bin/python scripts/reference_forward.py generate-fixtures
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURE_ROOT = REPO_ROOT / "crates" / "rollflash-model" / "tests" / "fixtures"
REGENERATE = "scripts/setup_python.sh && .venv/bin/python scripts/reference_forward.py generate-fixtures"

# The fixed token sequence of every fixture: 12 ids < 64, including both ends of the vocabulary
# and one repeated id (42) so that position dependence is exercised.
FIXTURE_TOKENS = [1, 17, 42, 5, 63, 0, 28, 9, 33, 50, 12, 42]

# Fixture families: HF names and per-family switches. Seeds are fixed; the legacy
# np.random.RandomState stream is used because numpy guarantees it stays the same across versions.
FAMILIES = {
    "llama": dict(arch="LlamaForCausalLM", model_type="llama", tie=False, attention_bias=False, seed=1001),
    "qwen2": dict(arch="Qwen2ForCausalLM", model_type="qwen2", tie=False, attention_bias=True, seed=1002),
    "qwen3": dict(arch="Qwen3ForCausalLM", model_type="qwen3", tie=True, attention_bias=False, seed=1003),
}

FIXTURE_SHAPE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=128,
)


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


@dataclass
class Config:
    family: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool

    @staticmethod
    def from_hf(cfg: dict) -> "Config":
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else None
        model_type = cfg.get("model_type")
        if arch in ("LlamaForCausalLM", "MistralForCausalLM") or (arch is None and model_type in ("llama", "mistral")):
            family = "llama"
        elif arch == "Qwen2ForCausalLM" or (arch is None and model_type == "qwen2"):
            family = "qwen2"
        elif arch == "Qwen3ForCausalLM" or (arch is None and model_type == "qwen3"):
            family = "qwen3"
        else:
            raise ValueError(f"unsupported architecture {arch!r} / model_type {model_type!r}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg['hidden_act']!r} not supported")
        if cfg.get("rope_scaling") is not None:
            raise ValueError("rope_scaling not supported")
        if cfg.get("use_sliding_window", False):
            raise ValueError("sliding-window attention not supported")
        hidden = cfg["hidden_size"]
        heads = cfg["num_attention_heads"]
        attention_bias = bool(cfg.get("attention_bias", False))
        if family == "qwen2":
            # modeling_qwen2.py: q/k/v_proj always have bias=True, o_proj bias=False.
            qkv_bias, o_bias = True, False
        else:
            # modeling_llama.py / modeling_qwen3.py: bias=config.attention_bias on q, k, v and o.
            qkv_bias, o_bias = attention_bias, attention_bias
        return Config(
            family=family,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=family == "llama" and bool(cfg.get("mlp_bias", False)),
            qk_norm=family == "qwen3",
        )


def load_dir(model_dir: Path) -> tuple[Config, dict[str, np.ndarray]]:
    """Reads config.json and every *.safetensors file of an HF model directory."""
    model_dir = Path(model_dir)
    cfg = Config.from_hf(json.loads((model_dir / "config.json").read_text()))
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    weights: dict[str, np.ndarray] = {}
    for f in files:
        weights.update(load_file(str(f)))
    return cfg, weights


# --------------------------------------------------------------------------------------------
# The reference forward (vectorised, float64)
# --------------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """LlamaRMSNorm: x * rsqrt(mean(x^2, -1) + eps) * w."""
    var = np.mean(x * x, axis=-1, keepdims=True)
    return w * (x / np.sqrt(var + eps))


def rope_tables(num_pos: int, head_dim: int, theta: float, dtype=np.float64, hf_float32: bool = False):
    """cos, sin of shape [T, head_dim]: inv_freq = 1/theta^(2i/d), emb = cat(freqs, freqs).

    hf_float32=True imitates transformers, which builds these tables in float32."""
    if hf_float32:
        inv_freq = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
        pos = np.arange(num_pos, dtype=np.float32)
        freqs = np.outer(pos, inv_freq).astype(np.float32)
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    pos = np.arange(num_pos, dtype=np.float64)
    freqs = np.outer(pos, inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotate_interleaved(x: np.ndarray) -> np.ndarray:
    """GPT-J style pairing (2i, 2i+1): NOT what HF Llama/Qwen use; only for the sensitivity check."""
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def forward(cfg: Config, weights: dict[str, np.ndarray], tokens, dtype=np.float64, bug: str | None = None,
            hf_float32_rope: bool = False) -> np.ndarray:
    """Logits [T, V] for one sequence starting at position 0.

    `bug` deliberately injects a common implementation mistake (used only by the sensitivity
    check, to show the fixture detects it); None is the correct forward."""
    tokens = np.asarray(tokens, dtype=np.int64)
    T = len(tokens)
    H, KV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    n_rep = H // KV
    eps = cfg.rms_norm_eps

    def w(name):
        return weights[name].astype(dtype)

    def linear(x, prefix, bias):
        y = x @ w(prefix + ".weight").T
        if bias:
            y = y + w(prefix + ".bias")
        return y

    cos, sin = rope_tables(T, D, cfg.rope_theta, dtype, hf_float32=hf_float32_rope)
    if bug == "rope_theta":
        cos, sin = rope_tables(T, D, cfg.rope_theta * 10, dtype)
    rot = rotate_interleaved if bug == "rope_interleaved" else rotate_half
    scale = 1.0 / math.sqrt(cfg.hidden_size if bug == "scale_hidden" else D)
    causal = np.triu(np.ones((T, T), dtype=bool), k=1)

    x = w("model.embed_tokens.weight")[tokens]  # [T, hidden]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        h = rms_norm(x, w(f"{p}.input_layernorm.weight"), eps)
        qkv_bias = cfg.qkv_bias and bug != "no_qkv_bias"
        q = linear(h, f"{p}.self_attn.q_proj", qkv_bias).reshape(T, H, D)
        k = linear(h, f"{p}.self_attn.k_proj", qkv_bias).reshape(T, KV, D)
        v = linear(h, f"{p}.self_attn.v_proj", qkv_bias).reshape(T, KV, D)
        if cfg.qk_norm and bug not in ("no_qk_norm", "qk_norm_after_rope"):
            q = rms_norm(q, w(f"{p}.self_attn.q_norm.weight"), eps)
            k = rms_norm(k, w(f"{p}.self_attn.k_norm.weight"), eps)
        q = q * cos[:, None, :] + rot(q) * sin[:, None, :]
        k = k * cos[:, None, :] + rot(k) * sin[:, None, :]
        if cfg.qk_norm and bug == "qk_norm_after_rope":
            q = rms_norm(q, w(f"{p}.self_attn.q_norm.weight"), eps)
            k = rms_norm(k, w(f"{p}.self_attn.k_norm.weight"), eps)
        if bug == "kv_tile":
            # Wrong GQA mapping: q head h reads kv head h % KV instead of h // n_rep.
            k_rep, v_rep = np.tile(k, (1, n_rep, 1)), np.tile(v, (1, n_rep, 1))
        else:
            # repeat_kv: q head h reads kv head h // n_rep.
            k_rep, v_rep = np.repeat(k, n_rep, axis=1), np.repeat(v, n_rep, axis=1)
        scores = np.einsum("thd,shd->hts", q, k_rep) * scale  # [H, T, T]
        if bug != "no_causal_mask":
            scores = np.where(causal[None], -np.inf, scores)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs = probs / probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v_rep).reshape(T, H * D)
        x = x + linear(attn, f"{p}.self_attn.o_proj", cfg.o_bias)

        h = rms_norm(x, w(f"{p}.post_attention_layernorm.weight"), eps)
        gate = linear(h, f"{p}.mlp.gate_proj", cfg.mlp_bias)
        up = linear(h, f"{p}.mlp.up_proj", cfg.mlp_bias)
        act = gate * up if bug == "no_silu" else silu(gate) * up
        x = x + linear(act, f"{p}.mlp.down_proj", cfg.mlp_bias)

    x = rms_norm(x, w("model.norm.weight"), eps)
    tied = cfg.tie_word_embeddings != (bug == "flip_tie")
    if tied or "lm_head.weight" not in weights:
        head = w("model.embed_tokens.weight")
    else:
        head = w("lm_head.weight")
    return x @ head.T


# --------------------------------------------------------------------------------------------
# A second, decode-style implementation for the self-check: one token at a time with a KV
# cache, explicit per-head loops and pairwise rotation. Shares no tensor code with forward().
# --------------------------------------------------------------------------------------------


def forward_incremental(cfg: Config, weights: dict[str, np.ndarray], tokens) -> np.ndarray:
    H, KV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    half = D // 2
    group = H // KV
    eps = cfg.rms_norm_eps
    W = {k: v.astype(np.float64) for k, v in weights.items()}

    def norm(vec, wt):
        ms = sum(float(a) * float(a) for a in vec) / len(vec)
        return np.array([wt[j] * vec[j] / math.sqrt(ms + eps) for j in range(len(vec))])

    def lin(vec, prefix, bias):
        mat = W[prefix + ".weight"]
        out = np.array([float(np.dot(mat[r], vec)) for r in range(mat.shape[0])])
        return out + W[prefix + ".bias"] if bias else out

    def rotate(vec, pos):
        out = vec.copy()
        for j in range(half):
            ang = pos / (cfg.rope_theta ** (2.0 * j / D))
            c, s = math.cos(ang), math.sin(ang)
            a, b = vec[j], vec[j + half]
            out[j] = a * c - b * s
            out[j + half] = b * c + a * s
        return out

    cache_k = [[[] for _ in range(KV)] for _ in range(cfg.num_layers)]
    cache_v = [[[] for _ in range(KV)] for _ in range(cfg.num_layers)]
    head_w = W["model.embed_tokens.weight"] if cfg.tie_word_embeddings or "lm_head.weight" not in W else W["lm_head.weight"]
    rows = []
    for pos, tok in enumerate(tokens):
        x = W["model.embed_tokens.weight"][tok].copy()
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}"
            h = norm(x, W[f"{p}.input_layernorm.weight"])
            q = lin(h, f"{p}.self_attn.q_proj", cfg.qkv_bias)
            k = lin(h, f"{p}.self_attn.k_proj", cfg.qkv_bias)
            v = lin(h, f"{p}.self_attn.v_proj", cfg.qkv_bias)
            for g in range(KV):
                kg = k[g * D:(g + 1) * D]
                if cfg.qk_norm:
                    kg = norm(kg, W[f"{p}.self_attn.k_norm.weight"])
                cache_k[i][g].append(rotate(kg, pos))
                cache_v[i][g].append(v[g * D:(g + 1) * D].copy())
            attn = np.zeros(H * D)
            for hh in range(H):
                qh = q[hh * D:(hh + 1) * D]
                if cfg.qk_norm:
                    qh = norm(qh, W[f"{p}.self_attn.q_norm.weight"])
                qh = rotate(qh, pos)
                g = hh // group
                s = [float(np.dot(qh, kk)) / math.sqrt(D) for kk in cache_k[i][g]]
                m = max(s)
                e = [math.exp(a - m) for a in s]
                z = sum(e)
                out = np.zeros(D)
                for a, vv in zip(e, cache_v[i][g]):
                    out += (a / z) * vv
                attn[hh * D:(hh + 1) * D] = out
            x = x + lin(attn, f"{p}.self_attn.o_proj", cfg.o_bias)
            h = norm(x, W[f"{p}.post_attention_layernorm.weight"])
            gate = lin(h, f"{p}.mlp.gate_proj", cfg.mlp_bias)
            up = lin(h, f"{p}.mlp.up_proj", cfg.mlp_bias)
            act = np.array([g_ / (1.0 + math.exp(-g_)) for g_ in gate]) * up
            x = x + lin(act, f"{p}.mlp.down_proj", cfg.mlp_bias)
        x = norm(x, W["model.norm.weight"])
        rows.append(head_w @ x)
    return np.stack(rows)


# --------------------------------------------------------------------------------------------
# Optional torch float64 cross-check (only when torch is importable; never installed by us).
# --------------------------------------------------------------------------------------------


def forward_torch(cfg: Config, weights: dict[str, np.ndarray], tokens) -> np.ndarray:
    """A direct torch float64 transcription of the HF modeling code (eager attention)."""
    import torch

    f64 = torch.float64
    W = {k: torch.from_numpy(np.ascontiguousarray(v.astype(np.float64))) for k, v in weights.items()}
    T = len(tokens)
    H, KV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    n_rep = H // KV
    eps = cfg.rms_norm_eps

    def rms(x, wt):
        var = x.pow(2).mean(-1, keepdim=True)
        return wt * (x * torch.rsqrt(var + eps))

    def lin(x, prefix, bias):
        return torch.nn.functional.linear(x, W[prefix + ".weight"], W[prefix + ".bias"] if bias else None)

    def rotate_half_t(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def repeat_kv(x):
        b, kvh, t, d = x.shape
        return x[:, :, None, :, :].expand(b, kvh, n_rep, t, d).reshape(b, kvh * n_rep, t, d)

    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=f64) / D))
    freqs = torch.arange(T, dtype=f64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # [1, 1, T, D]
    mask = torch.full((T, T), float("-inf"), dtype=f64).triu(1)

    x = W["model.embed_tokens.weight"][torch.tensor(list(tokens), dtype=torch.long)][None]  # [1, T, hidden]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        residual = x
        h = rms(x, W[f"{p}.input_layernorm.weight"])
        q = lin(h, f"{p}.self_attn.q_proj", cfg.qkv_bias).view(1, T, H, D)
        k = lin(h, f"{p}.self_attn.k_proj", cfg.qkv_bias).view(1, T, KV, D)
        v = lin(h, f"{p}.self_attn.v_proj", cfg.qkv_bias).view(1, T, KV, D)
        if cfg.qk_norm:
            q = rms(q, W[f"{p}.self_attn.q_norm.weight"])
            k = rms(k, W[f"{p}.self_attn.k_norm.weight"])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half_t(q) * sin
        k = k * cos + rotate_half_t(k) * sin
        k, v = repeat_kv(k), repeat_kv(v)
        scores = torch.matmul(q, k.transpose(2, 3)) * (D ** -0.5) + mask
        probs = torch.softmax(scores, dim=-1)
        o = torch.matmul(probs, v).transpose(1, 2).reshape(1, T, H * D)
        x = residual + lin(o, f"{p}.self_attn.o_proj", cfg.o_bias)
        residual = x
        h = rms(x, W[f"{p}.post_attention_layernorm.weight"])
        act = torch.nn.functional.silu(lin(h, f"{p}.mlp.gate_proj", cfg.mlp_bias)) * lin(h, f"{p}.mlp.up_proj", cfg.mlp_bias)
        x = residual + lin(act, f"{p}.mlp.down_proj", cfg.mlp_bias)
    x = rms(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if cfg.tie_word_embeddings or "lm_head.weight" not in W else W["lm_head.weight"]
    return (x[0] @ head.T).numpy()


def forward_transformers(model_dir: Path, tokens) -> np.ndarray | None:
    """Logits from the real `transformers` classes in float64, if transformers is importable."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except Exception:  # noqa: BLE001 - optional dependency
        return None
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float64, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([list(tokens)], dtype=torch.long))
    return out.logits[0].numpy()


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


def hf_config(family: str) -> dict:
    fam = FAMILIES[family]
    return {
        "architectures": [fam["arch"]],
        "model_type": fam["model_type"],
        **FIXTURE_SHAPE,
        "tie_word_embeddings": fam["tie"],
        "attention_bias": fam["attention_bias"],
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def random_weights(family: str) -> dict[str, np.ndarray]:
    """Float32 weights in HF layout: matrices and biases ~ N(0, 0.2), norms ~ 1 + N(0, 0.1)."""
    fam = FAMILIES[family]
    s = FIXTURE_SHAPE
    rng = np.random.RandomState(fam["seed"])
    hid, inter, D = s["hidden_size"], s["intermediate_size"], s["head_dim"]
    q_dim, kv_dim = s["num_attention_heads"] * D, s["num_key_value_heads"] * D

    def mat(*shape):
        return rng.normal(0.0, 0.2, size=shape).astype(np.float32)

    def norm(n):
        return (1.0 + rng.normal(0.0, 0.1, size=n)).astype(np.float32)

    W = {"model.embed_tokens.weight": mat(s["vocab_size"], hid)}
    for i in range(s["num_hidden_layers"]):
        p = f"model.layers.{i}"
        W[f"{p}.input_layernorm.weight"] = norm(hid)
        W[f"{p}.self_attn.q_proj.weight"] = mat(q_dim, hid)
        W[f"{p}.self_attn.k_proj.weight"] = mat(kv_dim, hid)
        W[f"{p}.self_attn.v_proj.weight"] = mat(kv_dim, hid)
        if fam["attention_bias"]:
            W[f"{p}.self_attn.q_proj.bias"] = mat(q_dim)
            W[f"{p}.self_attn.k_proj.bias"] = mat(kv_dim)
            W[f"{p}.self_attn.v_proj.bias"] = mat(kv_dim)
        if family == "qwen3":
            W[f"{p}.self_attn.q_norm.weight"] = norm(D)
            W[f"{p}.self_attn.k_norm.weight"] = norm(D)
        W[f"{p}.self_attn.o_proj.weight"] = mat(hid, q_dim)
        W[f"{p}.post_attention_layernorm.weight"] = norm(hid)
        W[f"{p}.mlp.gate_proj.weight"] = mat(inter, hid)
        W[f"{p}.mlp.up_proj.weight"] = mat(inter, hid)
        W[f"{p}.mlp.down_proj.weight"] = mat(hid, inter)
    W["model.norm.weight"] = norm(hid)
    if not fam["tie"]:
        W["lm_head.weight"] = mat(s["vocab_size"], hid)
    return W


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_reference_json(path: Path, meta: dict, logits: np.ndarray) -> None:
    """JSON with the logits one row per line; floats are written with repr (exact round trip)."""
    head = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in meta.items())
    rows = ",\n".join("    [" + ", ".join(repr(float(v)) for v in row) + "]" for row in logits)
    text = "{\n" + head + ',\n  "logits": [\n' + rows + "\n  ]\n}\n"
    json.loads(text)  # must be valid JSON
    path.write_text(text)


def generate_fixtures(root: Path) -> None:
    for family in FAMILIES:
        out = root / f"ref_{family}"
        out.mkdir(parents=True, exist_ok=True)
        cfg_json = hf_config(family)
        (out / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")
        save_file(random_weights(family), str(out / "model.safetensors"), metadata={"format": "pt"})

        # Recompute from what is on disk, exactly as a consumer would read it.
        cfg, weights = load_dir(out)
        logits = forward(cfg, weights, FIXTURE_TOKENS)
        meta = {
            "note": (
                f"Reference logits for the tiny random {cfg_json['architectures'][0]} checkpoint in this "
                "directory (HF layout, float32 weights; matrices and biases ~ N(0, 0.2), norm weights "
                f"~ 1 + N(0, 0.1), numpy RandomState seed {FAMILIES[family]['seed']}). Produced by "
                "scripts/reference_forward.py, an independent float64 NumPy implementation of the "
                "transformers decoder forward, run on the float32 weights upcast to float64 (rotary "
                "tables also in float64; transformers builds them in float32, which alone moves these "
                "logits by ~1e-7), for `tokens` starting at position 0. logits[t][v] is the "
                "logit of token v at position t. Regenerate with: " + REGENERATE
            ),
            "family": family,
            "architecture": cfg_json["architectures"][0],
            "tokens": FIXTURE_TOKENS,
            "logits_shape": list(logits.shape),
            "logits_dtype": "float64",
            "model_safetensors_sha256": sha256(out / "model.safetensors"),
        }
        write_reference_json(out / "reference.json", meta, logits)
        sizes = ", ".join(f"{f.name} {f.stat().st_size} B" for f in sorted(out.iterdir()))
        print(f"wrote {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}: {sizes}")


# --------------------------------------------------------------------------------------------
# Self-check
# --------------------------------------------------------------------------------------------


class Checker:
    def __init__(self):
        self.failures = 0

    def check(self, ok: bool, what: str, detail: str = "") -> None:
        status = "ok  " if ok else "FAIL"
        if not ok:
            self.failures += 1
        print(f"  [{status}] {what}{(': ' + detail) if detail else ''}")


def maxabs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


def self_check(root: Path) -> int:
    c = Checker()
    try:
        import torch  # noqa: F401

        have_torch = True
    except Exception:  # noqa: BLE001
        have_torch = False

    for family in FAMILIES:
        d = root / f"ref_{family}"
        print(f"{family} ({d}):")
        cfg, weights = load_dir(d)
        ref = json.loads((d / "reference.json").read_text())
        tokens = ref["tokens"]
        stored = np.array(ref["logits"], dtype=np.float64)
        T, V = len(tokens), cfg.vocab_size

        # 0. The checkpoint is what we think it is.
        c.check(sha256(d / "model.safetensors") == ref["model_safetensors_sha256"], "model.safetensors sha256 matches reference.json")
        c.check(all(v.dtype == np.float32 for v in weights.values()), "all tensors float32")
        c.check(("lm_head.weight" in weights) != cfg.tie_word_embeddings, "lm_head present iff not tied")
        c.check(T == 12 and all(0 <= t < V for t in tokens), "12 tokens, all < vocab")

        logits = forward(cfg, weights, tokens)
        c.check(logits.shape == (T, V) and stored.shape == (T, V), "logits shape [T, V]", f"{logits.shape}")
        c.check(maxabs(logits, stored) == 0.0, "recomputed logits == reference.json (bitwise)", f"{maxabs(logits, stored):.1e}")

        # 1. Sensitivity: activations are not near zero, logits vary across positions and vocab.
        std = float(logits.std())
        c.check(std > 0.3, "logits are O(1)", f"std {std:.3f}, max |logit| {np.abs(logits).max():.3f}")
        c.check(maxabs(logits[2], logits[11]) > 0.1, "same token (42) at positions 2 and 11 gives different logits",
                f"{maxabs(logits[2], logits[11]):.3f}")

        # 2. Independent decode-style implementation (KV cache, loops, pairwise rotation).
        inc = forward_incremental(cfg, weights, tokens)
        c.check(maxabs(logits, inc) < 1e-12, "vectorised == incremental decode-style implementation", f"{maxabs(logits, inc):.1e}")

        # 3. Causality: rows <= t are unchanged when tokens after t change; prefix == full.
        rng = np.random.RandomState(7)
        worst_causal = 0.0
        worst_changed = np.inf
        for t in range(T - 1):
            alt = list(tokens[: t + 1]) + [int(x) for x in rng.randint(0, V, size=T - t - 1)]
            if alt == list(tokens):
                continue
            la = forward(cfg, weights, alt)
            worst_causal = max(worst_causal, maxabs(la[: t + 1], logits[: t + 1]))
            first_diff = next(j for j in range(T) if alt[j] != tokens[j])
            worst_changed = min(worst_changed, maxabs(la[first_diff], logits[first_diff]))
        c.check(worst_causal < 1e-12, "causal: logits at t unchanged when later tokens change", f"max diff {worst_causal:.1e}")
        c.check(worst_changed > 1e-3, "...while the changed positions do change", f"min change {worst_changed:.2e}")
        worst_prefix = max(maxabs(forward(cfg, weights, tokens[:k]), logits[:k]) for k in range(1, T + 1))
        c.check(worst_prefix < 1e-12, "prefix: forward(tokens[:k]) == forward(tokens)[:k] for all k", f"{worst_prefix:.1e}")

        # 4. Rotary: q.k after rotation depends only on the relative position.
        D = cfg.head_dim
        qv, kv = np.random.RandomState(3).normal(size=(2, D))
        cos, sin = rope_tables(40, D, cfg.rope_theta)
        rope = lambda x, p: x * cos[p] + rotate_half(x) * sin[p]  # noqa: E731
        rel = max(abs(rope(qv, m) @ rope(kv, n) - rope(qv, m + s) @ rope(kv, n + s)) for m, n, s in [(5, 2, 9), (11, 0, 20), (3, 3, 30)])
        c.check(rel < 1e-12, "rope: <R(m)q, R(n)k> depends only on m - n", f"{rel:.1e}")
        c.check(maxabs(rope(qv, 0), qv) == 0.0, "rope: position 0 is the identity")

        # 5. Float32 estimate: what a correct float32 implementation should reach (test bound 1e-4).
        l32 = forward(cfg, weights, tokens, dtype=np.float32)
        e32 = maxabs(l32, logits)
        c.check(e32 < 1e-5, "numpy float32 forward vs float64 well inside the Rust F32 bound 1e-4", f"{e32:.1e}")
        ehf = maxabs(forward(cfg, weights, tokens, hf_float32_rope=True), logits)
        c.check(ehf < 1e-4, "info: transformers-style float32 rotary tables change float64 logits by", f"{ehf:.1e}")

        # 6. The fixture detects common mistakes (each changes logits far beyond 1e-4).
        # (A rotary position offset is invisible here by design: attention depends only on relative
        # positions, so a shifted start position changes nothing in a single prefill.)
        bugs = ["rope_interleaved", "rope_theta", "kv_tile", "scale_hidden", "no_causal_mask", "no_silu"]
        if not cfg.tie_word_embeddings:
            bugs.append("flip_tie")  # output projection taken from embed_tokens instead of lm_head
        if cfg.qkv_bias:
            bugs.append("no_qkv_bias")
        if cfg.qk_norm:
            bugs += ["no_qk_norm", "qk_norm_after_rope"]
        for bug in bugs:
            e = maxabs(forward(cfg, weights, tokens, bug=bug), logits)
            c.check(e > 1e-2, f"detects bug `{bug}`", f"max diff {e:.3f}")

        # 7. Optional: torch float64 transcription of the HF code, and transformers itself.
        if have_torch:
            et = maxabs(forward_torch(cfg, weights, tokens), logits)
            c.check(et < 1e-10, "torch float64 implementation agrees", f"{et:.1e}")
            hf = forward_transformers(d, tokens)
            if hf is not None:
                # transformers builds the rotary tables in float32, hence the looser bound.
                eh = maxabs(hf, logits)
                c.check(eh < 1e-5, "transformers AutoModelForCausalLM (float64) agrees", f"{eh:.1e}")
                eh2 = maxabs(hf, forward(cfg, weights, tokens, hf_float32_rope=True))
                c.check(eh2 < 1e-9, "...and with float32 rotary tables emulated", f"{eh2:.1e}")
            else:
                print("  [skip] transformers not importable")
        else:
            print("  [skip] torch not importable: torch cross-check skipped")

    print("self-check:", "all passed" if c.failures == 0 else f"{c.failures} FAILED")
    return 1 if c.failures else 0


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    f = sub.add_parser("forward", help="print float64 logits [T, V] for an HF model directory")
    f.add_argument("model_dir", type=Path)
    f.add_argument("tokens", type=int, nargs="+")
    f.add_argument("--out", type=Path, help="write logits to this .npy file instead of printing JSON")
    g = sub.add_parser("generate-fixtures", help="write the ref_* fixtures, then self-check them")
    g.add_argument("--root", type=Path, default=FIXTURE_ROOT)
    g.add_argument("--no-check", action="store_true")
    s = sub.add_parser("self-check", help="consistency checks on the ref_* fixtures")
    s.add_argument("--root", type=Path, default=FIXTURE_ROOT)
    args = ap.parse_args(argv)

    if args.mode == "forward":
        cfg, weights = load_dir(args.model_dir)
        if any(not 0 <= t < cfg.vocab_size for t in args.tokens):
            ap.error(f"token ids must be in [0, {cfg.vocab_size})")
        logits = forward(cfg, weights, args.tokens)
        if args.out:
            np.save(args.out, logits)
        else:
            json.dump(logits.tolist(), sys.stdout)
            print()
        return 0
    if args.mode == "generate-fixtures":
        generate_fixtures(args.root)
        return 0 if args.no_check else self_check(args.root)
    return self_check(args.root)


if __name__ == "__main__":
    sys.exit(main())
