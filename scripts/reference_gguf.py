#!/usr/bin/env python3
"""Independent float64 reference for SmolLM2-135M-Instruct, read straight from its GGUF file.

It checks `rollflash_model::gguf::convert_gguf_to_hf` and our Rust Llama forward without sharing
any code or intermediate file with them:

- weights come from the GGUF via the PyPI `gguf` package (`gguf.quants.dequantize`), never from
  the converted `model.safetensors`;
- q/k stay in llama.cpp's permuted row order and the rotary embedding is applied to adjacent
  pairs (GPT-J style), which is the same function as Hugging Face's `rotate_half` on
  un-permuted rows; so the Rust side's un-permutation is tested, not copied;
- the tokenizer is a small pure-Python byte-level BPE over the GGUF vocabulary and merges with
  llama.cpp's `smollm` pre-tokenizer regexes, not the `tokenizers` library.

It writes crates/rollflash-model/tests/fixtures/smollm2_reference.json (committed, so CI needs no
Python). To regenerate:

    scripts/fetch_smollm2.sh
    scripts/setup_python.sh
    .venv/bin/python scripts/reference_gguf.py [--hf-dir DIR]

With --hf-dir pointing at a directory written by `convert_gguf_to_hf`, it also loads that
directory's tokenizer.json with the `tokenizers` library and fails unless it encodes every
fixture text to the same ids as the pure-Python BPE.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import regex

import gguf
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GGUF = ROOT / "models" / "smollm2-135m-instruct.Q4_1.gguf"
DEFAULT_OUT = ROOT / "crates" / "rollflash-model" / "tests" / "fixtures" / "smollm2_reference.json"

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTION = "What is the capital of France?"
CONTINUATION = "The capital of France is Paris.<|im_end|>"
# Digits, contractions, punctuation, runs of spaces and newlines, accents, CJK, an emoji (a
# token split inside a UTF-8 sequence) and special tokens: the cases a tokenizer gets wrong.
TOKENIZER_TEXT = (
    "Hello world! It's 2024, and I've got 3.14 apples.\n\n  Café naïve — 東京 😀\t"
    "<|im_start|>user\nhi<|im_end|>"
)
GREEDY_NEW_TOKENS = 20


def chat_prompt(question: str) -> str:
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{question}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


# ---------------------------------------------------------------------------------------------
# Tokenizer: GPT-2 byte-level BPE, written out from the algorithm.


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM: split off every numeric character, then GPT-2's
# regex. (The trailing `\s+` alternative of Hugging Face's copy only matters for whitespace the
# first alternatives leave unmatched; unmatched spans are kept as pieces below, which is what
# llama.cpp does.)
PRE_REGEXES = [
    regex.compile(r"\p{N}"),
    regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"),
]


def split_keep(pattern: regex.Pattern, text: str) -> list[str]:
    out, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            out.append(text[pos : m.start()])
        out.append(m.group())
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return [p for p in out if p]


class Bpe:
    def __init__(self, tokens: list[str], types: list[int], merges: list[str]):
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.tokens = tokens
        self.types = types
        self.byte_map = bytes_to_unicode()
        self.unbyte = {c: b for b, c in self.byte_map.items()}
        # Control (3) and user-defined (4) tokens match literally, before pre-tokenization.
        specials = sorted((t for t, ty in zip(tokens, types) if ty in (3, 4)), key=len, reverse=True)
        self.special_re = regex.compile("|".join(regex.escape(s) for s in specials)) if specials else None

    def _bpe(self, word: str) -> list[str]:
        parts = list(word)
        while len(parts) > 1:
            best = min(
                ((self.ranks.get((a, b), 1 << 62), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))),
            )
            if best[0] == 1 << 62:
                break
            i = best[1]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return parts

    def _encode_ordinary(self, text: str) -> list[int]:
        pieces = [text]
        for pattern in PRE_REGEXES:
            pieces = [q for p in pieces for q in split_keep(pattern, p)]
        ids = []
        for piece in pieces:
            word = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
            for sym in self._bpe(word):
                if sym not in self.vocab:
                    raise ValueError(f"symbol {sym!r} is not in the vocabulary")
                ids.append(self.vocab[sym])
        return ids

    def decode(self, ids: list[int]) -> str:
        raw = b"".join(
            self.tokens[i].encode() if self.types[i] in (3, 4) else bytes(self.unbyte[c] for c in self.tokens[i])
            for i in ids
        )
        return raw.decode("utf-8", errors="replace")

    def encode(self, text: str) -> list[int]:
        if self.special_re is None:
            return self._encode_ordinary(text)
        ids, pos = [], 0
        for m in self.special_re.finditer(text):
            ids += self._encode_ordinary(text[pos : m.start()])
            ids.append(self.vocab[m.group()])
            pos = m.end()
        return ids + self._encode_ordinary(text[pos:])


# ---------------------------------------------------------------------------------------------
# Model: Llama in float64, in llama.cpp's (permuted q/k) basis.


class Llama:
    def __init__(self, reader: gguf.GGUFReader):
        arch = field(reader, "general.architecture")
        if arch != "llama":
            raise SystemExit(f"expected a llama GGUF, got {arch}")
        self.n_layer = int(field(reader, "llama.block_count"))
        self.n_head = int(field(reader, "llama.attention.head_count"))
        self.n_kv = int(field(reader, "llama.attention.head_count_kv"))
        self.dim = int(field(reader, "llama.embedding_length"))
        self.head_dim = self.dim // self.n_head
        self.eps = float(field(reader, "llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(field(reader, "llama.rope.freq_base"))
        self.w = {}
        for t in reader.tensors:
            # dequantize returns the PyTorch-order shape ([out, in] for a linear weight).
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            self.w[t.name] = a.reshape([int(d) for d in reversed(t.shape)])
        # No output.weight: the embedding matrix is also the output head (tied).
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])

    def rms(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * g

    def rope_pairs(self, x: np.ndarray) -> np.ndarray:
        """x: [T, H, D]; rotates (x[2j], x[2j+1]) by pos * theta^(-2j/D)."""
        t_len, _, d = x.shape
        inv = self.theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        ang = np.arange(t_len, dtype=np.float64)[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def hidden(self, ids: list[int]) -> np.ndarray:
        w, hd, t_len = self.w, self.head_dim, len(ids)
        x = w["token_embd.weight"][np.asarray(ids)]
        mask = np.triu(np.full((t_len, t_len), -np.inf), k=1)
        rep = self.n_head // self.n_kv
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = self.rms(x, w[p + "attn_norm.weight"])
            q = self.rope_pairs((h @ w[p + "attn_q.weight"].T).reshape(t_len, self.n_head, hd))
            k = self.rope_pairs((h @ w[p + "attn_k.weight"].T).reshape(t_len, self.n_kv, hd))
            v = (h @ w[p + "attn_v.weight"].T).reshape(t_len, self.n_kv, hd)
            att = np.empty((t_len, self.n_head, hd))
            for head in range(self.n_head):
                kv = head // rep
                s = q[:, head] @ k[:, kv].T / np.sqrt(hd) + mask
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                att[:, head] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, kv]
            x = x + att.reshape(t_len, -1) @ w[p + "attn_output.weight"].T
            h = self.rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        return self.rms(x, w["output_norm.weight"])

    def logits(self, ids: list[int], last_only: bool = False) -> np.ndarray:
        h = self.hidden(ids)
        if last_only:
            h = h[-1:]
        return h @ self.out.T


def log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--hf-dir", type=Path, help="a convert_gguf_to_hf output to cross-check the tokenizer of")
    args = ap.parse_args()
    if not args.gguf.exists():
        print(f"{args.gguf} is missing: run scripts/fetch_smollm2.sh first", file=sys.stderr)
        return 2

    reader = gguf.GGUFReader(str(args.gguf))
    if field(reader, "tokenizer.ggml.model") != "gpt2" or field(reader, "tokenizer.ggml.pre") != "smollm":
        raise SystemExit("this reference implements only the gpt2/smollm tokenizer")
    bpe = Bpe(
        field(reader, "tokenizer.ggml.tokens"),
        [int(x) for x in field(reader, "tokenizer.ggml.token_type")],
        field(reader, "tokenizer.ggml.merges"),
    )
    eos_id = int(field(reader, "tokenizer.ggml.eos_token_id"))

    prompt = chat_prompt(QUESTION)
    texts = {"tokenizer": TOKENIZER_TEXT, "prompt": prompt, "continuation": CONTINUATION}
    ids = {k: bpe.encode(v) for k, v in texts.items()}

    hf_checked = False
    if args.hf_dir is not None:
        from tokenizers import Tokenizer

        tk = Tokenizer.from_file(str(args.hf_dir / "tokenizer.json"))
        for k, v in texts.items():
            got = tk.encode(v, add_special_tokens=False).ids
            if got != ids[k]:
                raise SystemExit(f"tokenizer.json disagrees with the GGUF BPE on {k!r}:\n{got}\n{ids[k]}")
            if tk.decode(got, skip_special_tokens=False) != v:
                raise SystemExit(f"tokenizer.json does not round-trip {k!r}")
        hf_checked = True
        print(f"tokenizer.json in {args.hf_dir} matches the GGUF BPE on all texts")

    model = Llama(reader)

    # Log-probs of the continuation given the prompt.
    seq = ids["prompt"] + ids["continuation"]
    lp = log_softmax(model.logits(seq))
    n_prompt = len(ids["prompt"])
    cont_lp = [float(lp[n_prompt - 1 + i, tok]) for i, tok in enumerate(ids["continuation"])]
    print("continuation log-probs:", [round(x, 4) for x in cont_lp])

    # Greedy decoding from the prompt, recomputing the whole sequence each step.
    gen = list(ids["prompt"])
    new = []
    for _ in range(GREEDY_NEW_TOKENS):
        nxt = int(np.argmax(model.logits(gen, last_only=True)[0]))
        new.append(nxt)
        gen.append(nxt)
        if nxt == eos_id:
            break
    greedy_text = bpe.decode(new)
    print("greedy:", repr(greedy_text))
    if "Paris" not in greedy_text:
        print("warning: the greedy answer does not mention Paris", file=sys.stderr)

    fixture = {
        "note": (
            "Generated by scripts/reference_gguf.py from the GGUF file alone (gguf.quants.dequantize, "
            "float64 numpy Llama forward in llama.cpp's permuted q/k basis, pure-Python BPE). "
            "Regenerate: scripts/fetch_smollm2.sh && scripts/setup_python.sh && "
            ".venv/bin/python scripts/reference_gguf.py --hf-dir <convert_gguf_to_hf output>"
        ),
        "gguf_file": args.gguf.name,
        "gguf_sha256": sha256(args.gguf),
        "tokenizer_json_cross_checked": hf_checked,
        "tokenizer": {"text": TOKENIZER_TEXT, "ids": ids["tokenizer"]},
        "logprobs": {
            "prompt": prompt,
            "continuation": CONTINUATION,
            "prompt_ids": ids["prompt"],
            "continuation_ids": ids["continuation"],
            "logprobs": cont_lp,
        },
        "greedy": {
            "prompt_ids": ids["prompt"],
            "new_ids": new,
            "text": greedy_text,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
