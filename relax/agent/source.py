"""Agentic multi-turn generation for the Rollout role (`task.kind: agent`).

Each row is one episode: a fresh ToolEnv (its Session is the per-trajectory state) over the task's question,
driven by MultiTurnRollout with the role's engine: turns end at EOS or just after a tool call, tool replies
come back as observations, at most `agent.max_turns` model turns and `agent.max_total_tokens` tokens. The
trajectory is ONE bus row: response_ids = model turns + observations, loss_mask 1 exactly on the model's
tokens, rollout_log_probs 0 on the others. `env_reward` is the environment's own grade (the Reward role grades
the model's text again with the task's rule, relax.agent.env.tool_answer).
"""

from __future__ import annotations

from functools import partial

import torch

from relax.agent.env import ToolEnv
from relax.agent.rollout import MultiTurnRollout
from relax.agent.tools import ToolBox, calculate, run_python
from relax.agent.trajectory import trajectory_rows


def toolbox(cfg) -> ToolBox:
    a = cfg.agent
    tools = {"calc": calculate, "python": partial(run_python, timeout_s=a.tool_timeout_s)}
    return ToolBox({name: tools[name] for name in a.tools})


class AgentSource:
    def __init__(self, cfg, tokenizer, engine, data):
        self.cfg = cfg
        self.data = data
        self.tools = toolbox(cfg)
        a = cfg.agent
        self.driver = MultiTurnRollout(engine, tokenizer, max_turns=a.max_turns,
                                       max_new_tokens=cfg.rollout.max_new_tokens, max_total_tokens=a.max_total_tokens)

    def rows(self, prompt_indexes: list[int], max_new_tokens: int) -> dict:
        prompts = [self.data[i] for i in prompt_indexes]
        envs = [ToolEnv(self.tools) for _ in prompts]
        trajs = self.driver.run(envs, [{"question": p.prompt, "answer": p.answer} for p in prompts])
        out = trajectory_rows(trajs)
        out["tool_calls"] = torch.tensor([e.session.tool_calls for e in envs])
        out["tool_errors"] = torch.tensor([e.session.tool_errors for e in envs])
        return out
