"""The algorithm suite: advantage estimators and policy losses behind one name registry.

Add an algorithm by writing one module in this package that decorates a function with
`register_advantage(name)` or `register_policy_loss(name)`; every module here is imported below, so the
name is then valid in `algorithm.advantage` / `algorithm.policy_loss`.
"""

import importlib
import pkgutil

from relax.algorithms.advantages import AdvantageInput, gae, grpo, reinforce_pp_baseline, rloo
from relax.algorithms.aggregation import AGG_MODES, LossScale, aggregate, masked_mean
from relax.algorithms.correction import TIS_PARAMS, tis_weight
from relax.algorithms.groups import GroupStats, filter_groups, group_stats
from relax.algorithms.gspo import gspo_loss, gspo_token_loss, sequence_log_ratio
from relax.algorithms.kl import KL_ESTIMATORS, kl_penalty, kl_reward
from relax.algorithms.opd import opd_loss, opd_token_advantage
from relax.algorithms.policy import PolicyTerms, clipped_surrogate, log_ratio, policy_terms, ratio_metrics, reduce_policy_loss
from relax.algorithms.ppo import ppo_loss
from relax.algorithms.registry import (
    check_config,
    get_advantage,
    get_policy_loss,
    known_advantages,
    known_policy_losses,
    read_params,
    register_advantage,
    register_policy_loss,
)
from relax.algorithms.sapo import sapo_gate, sapo_loss

# Researchers' modules: a new file in this package registers itself without touching this one.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "AGG_MODES",
    "KL_ESTIMATORS",
    "TIS_PARAMS",
    "AdvantageInput",
    "GroupStats",
    "LossScale",
    "PolicyTerms",
    "aggregate",
    "check_config",
    "clipped_surrogate",
    "filter_groups",
    "gae",
    "get_advantage",
    "get_policy_loss",
    "group_stats",
    "grpo",
    "gspo_loss",
    "gspo_token_loss",
    "kl_penalty",
    "kl_reward",
    "known_advantages",
    "known_policy_losses",
    "log_ratio",
    "masked_mean",
    "opd_loss",
    "opd_token_advantage",
    "policy_terms",
    "ppo_loss",
    "ratio_metrics",
    "read_params",
    "reduce_policy_loss",
    "register_advantage",
    "register_policy_loss",
    "reinforce_pp_baseline",
    "rloo",
    "sapo_gate",
    "sapo_loss",
    "sequence_log_ratio",
    "tis_weight",
]
