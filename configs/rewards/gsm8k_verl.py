"""A reward function as a verl user has it: verl's GSM8K rule (verl/utils/reward_score/
gsm8k.py). Strict method: the answer is the last `#### <number>` in the response's final
300 characters; flexible method: the last number there. Commas and dollar signs are
dropped; it scores `score` when the answer equals the ground truth, else `format_score`
(nothing found: 0). rollflash calls it as verl does:
`compute_score(data_source, solution_str, ground_truth, extra_info)`.
"""
import re

CLIP_CHARS = 300
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str, method="strict"):
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = STRICT.findall(tail)
    else:
        found = [n for n in NUMBER.findall(tail) if n not in ("", ".")]
    if not found:
        return None
    return found[-1].replace(",", "").replace("$", "")


def compute_score(data_source, solution_str, ground_truth, extra_info=None,
                  method="strict", format_score=0.0, score=1.0):
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == ground_truth else format_score


def compute_score_flexible(data_source, solution_str, ground_truth, extra_info=None):
    """The flexible method: the last number counts, no `####` needed."""
    return compute_score(data_source, solution_str, ground_truth, extra_info, method="flexible")
