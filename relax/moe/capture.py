"""Routing capture in the rollout engine: every token's top-k experts per MoE layer, without a per-token sync.

A forward hook on each MoE router (transformers' `Qwen3MoeTopKRouter`, whose forward returns
`(router_logits, routing_weights, selected_experts)`; the same hook point `relax.engines.http_server` uses)
copies the selected experts of the current forward into a slot of a preallocated small-integer buffer on the
model's device. On a GPU those copies are queued device ops; the buffers are brought to the host once per
generate call (`finish`). Buffers are reused across calls (grown when needed).

Layout, as SGLang's `routed_experts`: for each row, one entry per token fed to the engine: the prompt tokens
(prefill), then every generated token except the last (each is fed at the next decode step), i.e.
`[prompt_len + completion_len - 1, moe_layers, top_k]`.
"""

from __future__ import annotations

import torch

# Written where a token has no recorded routing (the trainer then routes it itself).
NOT_ROUTED = {torch.uint8: 255, torch.int16: -1}


def route_dtype(num_experts: int) -> torch.dtype:
    """The smallest dtype that holds every expert index plus the NOT_ROUTED marker."""
    return torch.uint8 if num_experts < 255 else torch.int16


def moe_routers(model) -> list[torch.nn.Module]:
    """The router of every MoE layer, in layer order (a decoder layer whose `mlp` has `experts` and `gate`)."""
    base = getattr(model, "model", model)
    return [layer.mlp.gate for layer in getattr(base, "layers", [])
            if hasattr(layer.mlp, "experts") and hasattr(layer.mlp, "gate")]


class RoutingCapture:
    """Records the experts each forward of `model` selects. Use: `begin(B, L, max_new)`, then `prefill()`
    before the prompt forward and `decode(t)` before the forward that feeds generated token t-1 ... t >= 1;
    `finish()` returns the buffers on the host; `routes(...)` cuts one row out of them."""

    def __init__(self, model):
        self.routers = moe_routers(model)
        if not self.routers:
            raise ValueError("model: routing capture needs an MoE model (no layer has mlp.experts and mlp.gate)")
        r = self.routers[0]
        self.layers, self.top_k, self.num_experts = len(self.routers), int(r.top_k), int(r.num_experts)
        self.dtype = route_dtype(self.num_experts)
        self.device = next(model.parameters()).device
        self._store = torch.empty(0, dtype=self.dtype, device=self.device)  # reused across calls
        self._target: torch.Tensor | None = None
        self.prompt = self.resp = None
        self.handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    def _hook(self, i: int):
        def hook(module, args, output):
            target = self._target
            if target is not None:
                target[:, i].copy_(output[2].view(target.shape[0], self.top_k))  # int64 -> uint8, no sync
        return hook

    def begin(self, batch: int, width: int, max_new: int) -> None:
        per = self.layers * self.top_k
        need = batch * (width + max_new) * per
        if self._store.numel() < need:
            self._store = torch.empty(need, dtype=self.dtype, device=self.device)
        self.prompt = self._store[: batch * width * per].view(batch, width, self.layers, self.top_k)
        self.resp = self._store[batch * width * per : need].view(batch, max_new, self.layers, self.top_k)

    def prefill(self) -> None:
        b, w = self.prompt.shape[:2]
        self._target = self.prompt.view(b * w, self.layers, self.top_k)

    def decode(self, t: int) -> None:
        """The next forward feeds the token generated at step t - 1."""
        self._target = self.resp[:, t - 1]

    def stop(self) -> None:
        self._target = None

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Stop recording; the prompt and response buffers on the host (one copy each; on CPU they are the
        reused buffers themselves: cut rows out with `routes` before the next `begin`)."""
        self._target = None
        return self.prompt.cpu(), self.resp.cpu()

    @staticmethod
    def routes(prompt: torch.Tensor, resp: torch.Tensor, row: int, prompt_len: int, n_out: int) -> torch.Tensor:
        """Row `row`'s routing for its `prompt_len` prompt tokens (left-padded) and `n_out - 1` fed generated
        tokens: `[prompt_len + n_out - 1, layers, k]`, a fresh tensor."""
        width = prompt.shape[1]
        return torch.cat([prompt[row, width - prompt_len :], resp[row, : max(n_out - 1, 0)]])

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
