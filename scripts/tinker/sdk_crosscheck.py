"""Drives a Tinker server with the official tinker SDK (0.25, the version SkyRL 0.4.0 pins)
on a schedule given as JSON, and prints what the server returned as JSON, so a test can
compare it with what our Rust client got on the same schedule: a check that we speak the
protocol, not our own reading of it.

    python sdk_crosscheck.py --url http://127.0.0.1:8785 --plan plan.json

plan.json:
  {"base_model": "...", "rank": 8, "seed": 0,
   "adam": {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12},
   "steps": [{"loss_fn": "cross_entropy",
              "datums": [{"tokens": [...], "loss_fn_inputs": {"target_tokens": [...], "weights": [...]}}]}],
   "sample": {"prompt": [...], "max_tokens": 8, "num_samples": 1, "stop": [2]}}   # greedy, optional

Output (stdout, one JSON object):
  {"steps": [{"elementwise_loss": [[...] per datum], "logprobs": [[...]], "metrics": {...}}],
   "sample": {"tokens": [[...]], "logprobs": [[...]]}}
"""

import argparse
import json
import os
import sys

import tinker
from tinker import types


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--plan", required=True)
    args = ap.parse_args()
    with open(args.plan) as f:
        plan = json.load(f)

    # The SDK insists on a key that starts with `tml-`; SkyRL ignores it.
    service = tinker.ServiceClient(base_url=args.url, api_key="tml-rollflash-crosscheck")
    training = service.create_lora_training_client(
        base_model=plan["base_model"], rank=plan["rank"], seed=plan["seed"]
    )
    adam = types.AdamParams(**plan["adam"])
    out = {"model_id": training.model_id, "steps": []}
    for step in plan["steps"]:
        data = [
            types.Datum(
                model_input=types.ModelInput.from_ints(d["tokens"]),
                loss_fn_inputs=dict(d["loss_fn_inputs"]),
            )
            for d in step["datums"]
        ]
        fb = training.forward_backward(data, step["loss_fn"]).result()
        metrics = training.optim_step(adam).result().metrics
        out["steps"].append(
            {
                "elementwise_loss": [o["elementwise_loss"].tolist() for o in fb.loss_fn_outputs],
                "logprobs": [o["logprobs"].tolist() for o in fb.loss_fn_outputs],
                "metrics": dict(metrics or {}),
            }
        )
    if "sample" in plan:
        s = plan["sample"]
        path = training.save_weights_for_sampler(name="sdk-crosscheck").result().path
        sampler = service.create_sampling_client(model_path=path)
        res = sampler.sample(
            prompt=types.ModelInput.from_ints(s["prompt"]),
            num_samples=s.get("num_samples", 1),
            sampling_params=types.SamplingParams(
                max_tokens=s["max_tokens"], temperature=0.0, seed=s.get("seed"), stop=s.get("stop")
            ),
        ).result()
        out["sample"] = {
            "tokens": [list(q.tokens) for q in res.sequences],
            "logprobs": [list(q.logprobs or []) for q in res.sequences],
        }
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()
    # The SDK's background event-loop thread aborts the interpreter at shutdown (SIGABRT
    # after the work is done); leave without running the shutdown.
    os._exit(0)


if __name__ == "__main__":
    main()
