#!/usr/bin/env python3
"""Loads a LoRA adapter rollflash saved with the real `peft` package and compares logits.

    peft_check.py --base BASE_DIR --adapter ADAPTER_DIR --ours OURS.safetensors

BASE_DIR is a Hugging Face model directory (the frozen base), ADAPTER_DIR holds
`adapter_config.json` and `adapter_model.safetensors` as rollflash wrote them, and
OURS.safetensors holds `tokens` (the input ids, as float32) and `logits` ([T, V], float32):
rollflash's forward of those tokens with the adapter applied. The script loads the base with
`transformers.AutoModelForCausalLM`, wraps it with `peft.PeftModel.from_pretrained` (nothing of
rollflash's code), runs the same tokens in float32 and prints the largest absolute logit
difference. It also checks that the adapter was really applied: PEFT only warns when saved
tensor names do not match its modules and then leaves B at zero, so the adapter must move the
logits by much more than the tolerance.

Exit status: 0 = within --tol (default 1e-4), 1 = not, 77 = torch/transformers/peft missing
(install them with scripts/setup_peft.sh).
"""

import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    try:
        import peft
        import torch
        import transformers
        from safetensors.torch import load_file
    except ImportError as e:
        print(f"SKIP: {e} (install with scripts/setup_peft.sh)")
        return 77

    ours = load_file(args.ours)
    tokens = ours["tokens"].round().long().unsqueeze(0)
    want = ours["logits"].double()
    try:
        base = transformers.AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    except TypeError:  # transformers before `dtype` replaced `torch_dtype`
        base = transformers.AutoModelForCausalLM.from_pretrained(
            args.base, torch_dtype=torch.float32
        )
    model = peft.PeftModel.from_pretrained(base, args.adapter)
    model.eval()
    adapted = [n for n, _ in model.named_modules() if n.endswith(".lora_A")]
    with torch.no_grad():
        got = model(input_ids=tokens).logits[0].double()
        with model.disable_adapter():
            plain = model(input_ids=tokens).logits[0].double()
    err = (got - want).abs().max().item()
    effect = (got - plain).abs().max().item()
    report = {
        "peft": peft.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "adapted_modules": len(adapted),
        "max_abs_logit_diff": err,
        "adapter_effect": effect,
        "tol": args.tol,
    }
    print(json.dumps(report))
    if effect <= 10 * args.tol:
        print("FAIL: the adapter does not change PEFT's logits (were its tensors loaded?)")
        return 1
    if not err <= args.tol:
        print(f"FAIL: logits differ by {err:.3e} > {args.tol:.0e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
