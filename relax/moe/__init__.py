"""Mixture-of-experts support: Rollout Routing Replay (R3, arXiv 2510.11370).

- `capture`: the rollout engine records every token's top-k experts per MoE layer (router forward hooks
  writing into preallocated buffers; one batched copy per generate call), compactly (uint8).
- `fields`: those records as the bus field `rollout_routed_experts`, uint8 [T, layers, k] per row, one entry
  per token of prompt ++ response (`moe.r3_prompt`, default) or of the response; the last entry is
  `NOT_ROUTED` (that token was never fed to the engine).
- `replay`: a context manager that patches the Qwen3-MoE routers of a model so the trainer's forward uses
  the recorded expert sets, with gate weights from its own router logits renormalised over the set
  (g_i = I_i exp(s_i) / sum_j I_j exp(s_j)): the router still gets gradients.
The R3 study (overhead / mismatch measurements) is experiments/r3_moe/study.py; its table and figure
analysis/r3_moe.py.
"""

from relax.moe.capture import NOT_ROUTED, RoutingCapture, moe_routers, route_dtype
from relax.moe.fields import ROUTED_FIELD, r3_fields, routing_fields
from relax.moe.replay import build_replay, replay_from_batch, replay_routing

__all__ = ["NOT_ROUTED", "ROUTED_FIELD", "RoutingCapture", "build_replay", "moe_routers",
           "r3_fields", "replay_from_batch", "replay_routing", "route_dtype", "routing_fields"]
