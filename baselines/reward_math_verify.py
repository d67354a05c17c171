"""task.reward: math_verify for veRL and OpenRLHF: copied next to their launch script and loaded by them.

It runs inside those frameworks' environments, so it needs only `math-verify` (and torch, for OpenRLHF) and
never imports relax. It grades like relax.rewards.verify: the reference parsed as is or as `$...$`, the
response with math-verify's default extraction, 1.0 when they verify equal. Timeouts are off: math-verify
times out with signal.alarm, which works only in a main thread, and both frameworks grade in worker threads.
"""

from math_verify import parse, verify


def score(response: str, answer) -> float:
    if isinstance(answer, dict):  # OpenRLHF hands over DAPO-Math's whole `reward_model` cell
        answer = answer.get("ground_truth")
    answer = str(answer)
    gold = parse(answer, parsing_timeout=None) or parse(f"${answer}$", parsing_timeout=None)
    pred = parse(response, parsing_timeout=None)
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None))


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """veRL 0.9.1 `reward.custom_reward_function` (its reward managers call it with these keywords)."""
    return score(solution_str, ground_truth)


def reward_func(queries, prompts, labels, **kwargs) -> dict:
    """OpenRLHF 0.11.2 `--reward.remote_url <file>.py`: each query is the prompt followed by the response."""
    import torch

    responses = [q[len(p):] if q.startswith(p) else q for q, p in zip(queries, prompts)]
    rewards = torch.tensor([score(r, label) for r, label in zip(responses, labels)], dtype=torch.float)
    return {"rewards": rewards, "scores": rewards, "extra_logs": {}}
