"""Name -> function registries for advantage estimators and policy losses.

An algorithm is one decorated function in any module of `relax.algorithms` (the package imports all of
its modules, so a new file registers itself) selected by name in `algorithm.advantage` /
`algorithm.policy_loss`. The decorator also declares the `algorithm.params` keys the function reads, with
their defaults, so `check_config` can reject a misspelt key at start-up instead of silently training with
the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping

from relax.algorithms.correction import TIS_PARAMS

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig


@dataclass(frozen=True)
class _Entry:
    fn: Callable
    params: Mapping[str, Any]


_ADVANTAGES: dict[str, _Entry] = {}
_POLICY_LOSSES: dict[str, _Entry] = {}


def _register(table: dict[str, _Entry], kind: str, name: str, params: Mapping[str, Any]) -> Callable:
    def deco(fn: Callable) -> Callable:
        old = table.get(name)
        # The same function registered again (a module reload) replaces itself; a different one is a clash.
        if old is not None and (old.fn.__module__, old.fn.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"{kind} {name!r} is already registered by {old.fn.__module__}.{old.fn.__qualname__}")
        table[name] = _Entry(fn, MappingProxyType(dict(params)))
        return fn

    return deco


def _lookup(table: dict[str, _Entry], kind: str, name: str) -> _Entry:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}") from None


def register_advantage(name: str, *, params: Mapping[str, Any] | None = None) -> Callable:
    """Register `fn(inp: AdvantageInput, cfg) -> (advantages [B,T], returns [B,T])` under `name`.

    `params`: the `algorithm.params` keys the estimator reads, with defaults.
    """
    return _register(_ADVANTAGES, "advantage estimator", name, params or {})


def register_policy_loss(name: str, *, params: Mapping[str, Any] | None = None) -> Callable:
    """Register `fn(log_probs, old_log_probs, advantages, mask, cfg, *, loss_scale, rollout_log_probs=None)
    -> (scalar loss, metrics)` under `name`.

    `params`: the `algorithm.params` keys the loss reads, with defaults; the rollout-correction keys
    (`tis`, `tis_cap`) are added for every loss, since `reduce_policy_loss` applies them.
    """
    return _register(_POLICY_LOSSES, "policy loss", name, {**TIS_PARAMS, **(params or {})})


def get_advantage(name: str) -> Callable:
    return _lookup(_ADVANTAGES, "advantage estimator", name).fn


def get_policy_loss(name: str) -> Callable:
    return _lookup(_POLICY_LOSSES, "policy loss", name).fn


def known_advantages() -> dict[str, dict[str, Any]]:
    """{name: {params key: default}} for every registered advantage estimator."""
    return {name: dict(e.params) for name, e in sorted(_ADVANTAGES.items())}


def known_policy_losses() -> dict[str, dict[str, Any]]:
    """{name: {params key: default}} for every registered policy loss."""
    return {name: dict(e.params) for name, e in sorted(_POLICY_LOSSES.items())}


def read_params(cfg: AlgorithmConfig, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The `defaults` keys, each overridden by `cfg.params` when set there."""
    return {key: cfg.params.get(key, default) for key, default in defaults.items()}


def check_config(cfg: AlgorithmConfig) -> None:
    """Fail fast: both names are registered and every `cfg.params` key is read by one of them."""
    try:
        advantage = _lookup(_ADVANTAGES, "advantage estimator", cfg.advantage)
    except ValueError as err:
        raise ValueError(f"algorithm.advantage: {err}") from None
    try:
        loss = _lookup(_POLICY_LOSSES, "policy loss", cfg.policy_loss)
    except ValueError as err:
        raise ValueError(f"algorithm.policy_loss: {err}") from None
    allowed = {**advantage.params, **loss.params}
    unknown = sorted(set(cfg.params) - set(allowed))
    if unknown:
        raise ValueError(
            f"algorithm.params: unknown key(s) {unknown} for advantage {cfg.advantage!r} and "
            f"policy_loss {cfg.policy_loss!r}; known: {sorted(allowed)}"
        )
