"""Builds a tiny random Qwen3 (vocab 512, hidden 64, 2 layers, 106,880 parameters, f32) with a
byte-level BPE tokenizer and a chat template, offline, for the Tinker server tests
(scripts/setup_tinker_server.sh). Deterministic: the tokenizer is trained on a fixed corpus and
the weights come from torch.manual_seed(0), so every machine builds the same model.

    python make_tiny_qwen3.py OUT_DIR
"""

import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

# Special ids are fixed by their order: 0 = <|endoftext|> (pad), 1 = <|im_start|>, 2 = <|im_end|> (eos).
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus():
    """A small fixed text: arithmetic, words and chat turns, enough for 512 BPE merges."""
    words = [
        "the", "model", "answer", "question", "is", "what", "number", "plus", "minus", "times",
        "equals", "user", "assistant", "system", "hello", "world", "train", "sample", "token",
        "reward", "policy", "gradient", "learn", "step", "value", "count", "add", "sum",
    ]
    lines = []
    for a in range(40):
        for b in range(0, 40, 3):
            lines.append(f"What is {a} plus {b}? The answer is {a + b}.")
            lines.append(f"{a} times {b} equals {a * b}")
    for i in range(400):
        lines.append(" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(12)))
    for i in range(50):
        lines.append(f"<|im_start|>user\nWhat is {i} minus 3?<|im_end|>\n<|im_start|>assistant\n{i - 3}<|im_end|>\n")
    return lines


def main(out: str) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    cfg = Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
    )
    cfg.dtype = "float32"
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"tiny qwen3: {n} parameters, tokenizer {len(fast)} tokens -> {out}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_qwen3.py OUT_DIR")
    main(sys.argv[1])
