"""Writes configs/data/verl_arith_{train,test}.parquet: arithmetic problems in exactly the
layout verl's GSM8K preprocessing (examples/data_preprocess/gsm8k.py) writes, by pyarrow as
`datasets` does (Snappy, structs inferred from the row dicts).

    ~/.cache/rollflash/vllm-venv/bin/python scripts/make_verl_example.py   # any pyarrow

The problems are the built-in task's shape (2-4 two-digit terms joined by +), so the
built-in model after its supervised warm-up can learn from them; the worked solution is the
built-in task's format, `12+7=19 19+30=49 #### 49`.
"""
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def row(rng, split, index):
    terms = [rng.randrange(100) for _ in range(rng.choice([2, 2, 3, 4]))]
    steps, total = [], terms[0]
    for t in terms[1:]:
        steps.append(f"{total}+{t}={total + t}")
        total += t
    question = "+".join(str(t) for t in terms)
    return {
        "data_source": "rollflash/arith",
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(total)},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": " ".join(steps) + f" #### {total}",
            "question": question,
        },
    }


def main(out="configs/data"):
    rng = random.Random(20261204)
    for split, n in [("train", 64), ("test", 32)]:
        table = pa.Table.from_pylist([row(rng, split, i) for i in range(n)])
        pq.write_table(table, f"{out}/verl_arith_{split}.parquet")


if __name__ == "__main__":
    main(*sys.argv[1:])
