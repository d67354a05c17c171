"""Response-length models: a distribution per task, truncated at `rollout.max_new_tokens` (a response that reaches
it stops there, as the engine stops it).

A length file (relax/sim/lengths/<task>.yaml, or one a user names with `--lengths FILE`) gives the prompt length
and either a lognormal (mean and coefficient of variation of the untruncated response length, each `Sourced`, with
a low/high band where it is an assumption) or `empirical:` a list of observed lengths. `fit_run(run_dir)` fits the
lognormal's mean to one of our runs' metrics.jsonl (tokens / samples per step is the truncated mean; the
coefficient of variation is not in the metrics and stays assumed).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relax.config import ConfigError
from relax.sim.hardware import Sourced

HERE = Path(__file__).resolve().parent / "lengths"


class LengthFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str
    description: str = ""
    prompt_tokens: Sourced
    mean: Sourced | None = None  # untruncated lognormal mean (tokens)
    cv: Sourced | None = None  # untruncated lognormal std / mean
    empirical: list[int] | None = Field(None, min_length=1)
    group_cv: float = Field(0.0, ge=0)  # spread of a prompt's own mean across prompts (lengths in a group correlate)
    media_tokens: dict[str, Sourced] = {}  # of prompt_tokens, those a media tower makes, by tower (vision, audio)


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def truncated_mean(mean: float, cv: float, cap: int) -> float:
    """E[min(X, cap)] for X lognormal with this mean and cv (closed form)."""
    if cv <= 0:
        return min(mean, cap)
    s2 = math.log1p(cv * cv)
    s, mu = math.sqrt(s2), math.log(mean) - s2 / 2
    z = (math.log(cap) - mu) / s
    return mean * _phi(z - s) + cap * (1.0 - _phi(z))


@dataclass
class LengthModel:
    """Draws (prompt, response) token lengths; deterministic for a seed."""

    prompt_tokens: float
    max_new_tokens: int
    mean: float = 0.0
    cv: float = 0.0
    empirical: list[int] = field(default_factory=list)
    group_cv: float = 0.0
    source: str = ""
    media_tokens: dict[str, float] = field(default_factory=dict)  # per prompt, by tower (part of prompt_tokens)

    def draw_group(self, rng: random.Random, G: int) -> list[int]:
        cap = self.max_new_tokens
        if self.empirical:
            return [min(cap, max(1, rng.choice(self.empirical))) for _ in range(G)]
        mean = self.mean
        if self.group_cv > 0:
            gs2 = math.log1p(self.group_cv ** 2)
            mean *= math.exp(rng.gauss(-gs2 / 2, math.sqrt(gs2)))
        if self.cv <= 0:
            return [min(cap, max(1, round(mean)))] * G
        s2 = math.log1p(self.cv ** 2)
        mu, s = math.log(mean) - s2 / 2, math.sqrt(s2)
        return [min(cap, max(1, round(rng.lognormvariate(mu, s)))) for _ in range(G)]

    def draw(self, seed: int, steps: int, P: int, G: int) -> list[list[list[int]]]:
        """Response lengths [step][group][sample] of a whole run, drawn at once (numpy; deterministic for a seed)."""
        import numpy as np

        rng, cap = np.random.default_rng(seed), self.max_new_tokens
        if self.empirical:
            x = rng.choice(np.asarray(self.empirical, dtype=float), size=(steps, P, G))
        elif self.cv <= 0:
            x = np.full((steps, P, G), float(self.mean))
        else:
            s2 = math.log1p(self.cv ** 2)
            x = rng.lognormal(math.log(self.mean) - s2 / 2, math.sqrt(s2), size=(steps, P, G))
        if self.group_cv > 0 and not self.empirical:
            gs2 = math.log1p(self.group_cv ** 2)
            x = x * rng.lognormal(-gs2 / 2, math.sqrt(gs2), size=(steps, P, 1))
        return np.clip(np.rint(x), 1, cap).astype(int).tolist()

    @property
    def expected(self) -> float:
        """Mean response length after truncation."""
        if self.empirical:
            return sum(min(x, self.max_new_tokens) for x in self.empirical) / len(self.empirical)
        return truncated_mean(self.mean, self.cv, self.max_new_tokens)


def load_length_file(path: Path, max_new_tokens: int, band: str = "mid") -> LengthModel:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    try:
        f = LengthFile.model_validate(raw)
    except ValidationError as err:
        lines = [f"{Path(path).name}: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors()]
        raise ConfigError("invalid length file:\n  " + "\n  ".join(lines)) from None
    if f.empirical is None and (f.mean is None or f.cv is None):
        raise ConfigError(f"{Path(path).name}: mean and cv (a lognormal) or empirical (observed lengths) is required")
    src = f"{Path(path).name}: " + (f"empirical, {len(f.empirical)} lengths" if f.empirical else
                                    f"lognormal mean {f.mean.at(band):g} ({f.mean.source}), cv {f.cv.at(band):g}")
    media = {name: v.at(band) for name, v in f.media_tokens.items()}
    if sum(media.values()) > f.prompt_tokens.at(band):
        raise ConfigError(f"{Path(path).name}: media_tokens: {sum(media.values()):g} media tokens exceed prompt_tokens "
                          f"({f.prompt_tokens.at(band):g}) at band {band}")
    return LengthModel(prompt_tokens=f.prompt_tokens.at(band), max_new_tokens=max_new_tokens,
                       mean=f.mean.at(band) if f.mean else 0.0, cv=f.cv.at(band) if f.cv else 0.0,
                       empirical=list(f.empirical or []), group_cv=f.group_cv, source=src, media_tokens=media)


def fit_mean(observed: float, cv: float, cap: int) -> float:
    """The untruncated lognormal mean whose truncated mean is `observed` (bisection; observed < cap)."""
    if observed >= cap:
        return float(cap) * 50  # every response ran to the cap
    lo, hi = observed, observed * 1e4
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if truncated_mean(mid, cv, cap) < observed else (lo, mid)
    return 0.5 * (lo + hi)


def fit_run(run_dir: str | Path, max_new_tokens: int, prompt_tokens: float, cv: float) -> LengthModel:
    """A lognormal whose truncated mean matches a run's response tokens per sample (metrics.jsonl)."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tokens, samples = sum(r["tokens"] for r in rows), sum(r["samples"] for r in rows)
    observed = tokens / samples
    return LengthModel(prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens,
                       mean=fit_mean(observed, cv, max_new_tokens), cv=cv,
                       source=f"fitted to {path} ({observed:.2f} response tokens per sample; cv {cv:g} assumed)")


def length_model(task: str, max_new_tokens: int, band: str = "mid", path: str | Path | None = None) -> LengthModel:
    """The length model for `task`: `path` when given, else relax/sim/lengths/<task>.yaml."""
    p = Path(path) if path else HERE / f"{task}.yaml"
    if not p.exists():
        have = ", ".join(sorted(q.stem for q in HERE.glob("*.yaml")))
        raise ConfigError(f"task.name: no length model for '{task}' (relax/sim/lengths/ has {have}); give one "
                          f"with --lengths FILE")
    return load_length_file(p, max_new_tokens, band)
