"""A reward function as a verl user has it: verl's GSM8K rule (verl/utils/reward_score/
gsm8k.py), strict method. The answer is the last `#### <number>` in the response's final
300 characters, commas and dollar signs dropped; it scores `score` when it equals the
ground truth, else `format_score`. rollflash calls it as verl does:
`compute_score(data_source, solution_str, ground_truth, extra_info)`.
"""
import re

CLIP_CHARS = 300
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_solution(solution_str):
    tail = solution_str[-CLIP_CHARS:]
    found = STRICT.findall(tail)
    if not found:
        return None
    return found[-1].replace(",", "").replace("$", "")


def compute_score(data_source, solution_str, ground_truth, extra_info=None,
                  format_score=0.0, score=1.0):
    answer = extract_solution(solution_str)
    if answer is None:
        return 0.0
    return score if answer == ground_truth else format_score
