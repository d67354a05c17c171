"""Multi-turn rollout over TorchEngine: generate until a tool call or EOS, append the observation, continue.

All live sessions of a batch decode together (one `engine.generate` call per turn). A model turn is cut
just after its first `</tool>`: the tokens kept are exactly a prefix of what was sampled, so their recorded
log-probs stay exact. Observation tokens (tool replies, environment text, media placeholders) get loss
mask 0 and log-prob 0. Engines that take media (`engine.accepts_media`) are handed every medium of the
session so far on every turn, so images shown by earlier turns stay in context.
"""

from __future__ import annotations

from typing import Callable

from relax.agent.env import Environment, MediaRef
from relax.agent.tools import TOOL_END
from relax.agent.trajectory import Trajectory


def cut_after(tokenizer, ids: list[int], marker: str) -> int | None:
    """Smallest n such that decode(ids[:n]) contains `marker`, or None."""
    if marker not in tokenizer.decode(ids):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:  # decode(prefix) containing the marker is monotone in the prefix length
        mid = (lo + hi) // 2
        if marker in tokenizer.decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


class MultiTurnRollout:
    def __init__(self, engine, tokenizer, *, max_turns: int = 4, max_new_tokens: int = 32,
                 max_total_tokens: int = 256, media_ids: Callable[[MediaRef], list[int]] | None = None):
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        self.engine = engine
        self.tok = tokenizer
        self.max_turns = max_turns
        self.max_new_tokens = max_new_tokens
        self.max_total_tokens = max_total_tokens
        # Placeholder tokens for a medium (an omni tokenizer's <image> run); None: media show as text only.
        self.media_ids = media_ids

    def _encode_obs(self, text: str, media: list[MediaRef]) -> list[int]:
        ids = []
        if self.media_ids is not None:
            for m in media:
                ids += self.media_ids(m)
        return ids + (self.tok.encode(text, add_bos=False) if text else [])

    def run(self, envs: list[Environment], rows: list[dict]) -> list[Trajectory]:
        if len(envs) != len(rows):
            raise ValueError("run: one environment per row")
        trajs = []
        for env, row in zip(envs, rows):
            obs = env.reset(row)
            t = Trajectory(prompt_ids=self.tok.encode(obs.text) + [])
            if obs.media and self.media_ids is not None:  # media of the prompt go before its text
                t.prompt_ids = self.tok.encode("")[:1] + self._encode_obs(obs.text, obs.media)
            t.media = list(obs.media)
            trajs.append(t)
        live = list(range(len(envs)))
        while live:
            budget_ok = [i for i in live if len(trajs[i].context) + self.max_new_tokens <= self.max_total_tokens]
            for i in set(live) - set(budget_ok):
                trajs[i].truncated = True
            live = budget_ok
            if not live:
                break
            contexts = [trajs[i].context for i in live]
            if getattr(self.engine, "accepts_media", False):
                gens = self.engine.generate(contexts, self.max_new_tokens, media=[list(envs[i].session.media) for i in live])
            else:
                gens = self.engine.generate(contexts, self.max_new_tokens)
            still = []
            for i, g in zip(live, gens):
                t, env = trajs[i], envs[i]
                ids, lps = list(g.token_ids), list(g.log_probs)
                n = cut_after(self.tok, ids, TOOL_END)
                if n is not None:
                    ids, lps = ids[:n], lps[:n]
                t.add_model(ids, lps)
                t.weight_versions.append(g.weight_version)
                t.turns += 1
                text = self.tok.decode(ids)
                if n is None and g.finish_reason == "length" and "</answer>" not in text:
                    # Ran out of tokens mid-turn: no action to hand the environment.
                    t.truncated = True
                    continue
                res = env.step(text)
                t.reward += res.reward
                if res.done:
                    t.done = True
                    continue
                if t.turns >= self.max_turns:
                    t.truncated = True
                    continue
                t.add_observation(self._encode_obs(res.observation.text, res.observation.media))
                t.media += res.observation.media
                still.append(i)
            live = still
        return trajs
