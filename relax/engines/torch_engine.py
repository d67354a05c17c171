"""The CPU rollout engine: batched sampling with a KV cache over a transformers causal LM.

Prompts are left-padded so every row decodes at the same position; positions are derived from the attention
mask, so padding changes no logits. Sampling uses the Gumbel-max trick (one argmax instead of
`torch.multinomial`, ~30x cheaper over a 49k vocabulary). The recorded log-prob of each token is under the
temperature-scaled full distribution, the same quantity the trainer recomputes.

With `record_routing` (MoE models, for R3) each Generation carries `extras["routed_experts"]`: the experts
of every token fed to the model, uint8 [prompt_len + completion_len - 1, moe_layers, top_k], as SGLang's
`return_routed_experts` (relax/moe/capture.py: router hooks into reused buffers, no per-token sync).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from relax.engines.continuous import continuous_generate
from relax.engines.feed import Feed, limits

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Generation:
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str  # "stop" (EOS) | "length" (max_new_tokens)
    weight_version: int  # the version of its first token (the staleness bound applies to it)
    extras: dict = field(default_factory=dict)
    last_version: int | None = None  # the version of its last token when a partial rollout changed it (else None)


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator):
    """Sample one token per row; returns (tokens, log-prob of each token under softmax(logits / T)).

    temperature == 0 means greedy decoding (log-probs then under T = 1)."""
    if temperature == 0:
        logp = torch.log_softmax(logits.float(), dim=-1)
        tokens = logp.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits.float() / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    masked = logp
    if top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        cum = sorted_lp.exp().cumsum(-1)
        drop_sorted = (cum - sorted_lp.exp()) > top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        masked = logp.masked_fill(drop, float("-inf"))
    u = torch.rand(masked.shape, generator=gen).clamp_(1e-20, 1.0)
    tokens = (masked - torch.log(-torch.log(u))).argmax(dim=-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class TorchEngine:
    """Generation with in-place weight updates, pause/resume, and sleep/wake (weights released while asleep)."""

    def __init__(self, model, tokenizer, *, dtype="float32", temperature=1.0, top_p=1.0, seed=0,
                 record_routing=False):
        self.dtype = DTYPES[dtype]
        self.model = model.to(self.dtype).eval()
        self.capture = None
        if record_routing:
            from relax.moe.capture import RoutingCapture

            self.capture = RoutingCapture(self.model)
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.gen = torch.Generator().manual_seed(seed)
        self.version = 0
        # One generate or weight update at a time; re-entrant, so that a partial rollout's weight update from inside
        # generate_stream (its `between` hook, same thread) goes through between two decode steps.
        self._lock = threading.RLock()
        self._running = threading.Event()
        self._running.set()
        self.asleep = False

    # --- weights -------------------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copy new weights in place (after the in-flight generate call finishes)."""
        with self._lock:
            if self.asleep:
                self._assign(state)
            else:
                for name, p in self.model.named_parameters():
                    p.data.copy_(state[name])
            self.version = version

    def _assign(self, state):
        for name, p in self.model.named_parameters():
            p.data = state[name].to(self.dtype, copy=True)
        self.asleep = False

    def sleep(self) -> int:
        """Release the weights' memory (colocated mode hands the cores and memory to training). Returns bytes freed."""
        with self._lock:
            freed = 0
            for p in self.model.parameters():
                freed += p.data.numel() * p.data.element_size()
                p.data = torch.empty(0, dtype=self.dtype)
            self.asleep = True
            return freed

    def wake(self, state: dict[str, torch.Tensor], version: int) -> None:
        with self._lock:
            self._assign(state)
            self.version = version

    # --- flow control -----------------------------------------------------------------------------------
    def pause(self) -> None:
        """Stop at the next decode step; in-flight requests keep their state and continue on resume()."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    # --- generation -------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int]) -> list[Generation]:
        """One batch, decoded until its longest row ends (a finished row decodes pads meanwhile).
        `max_new_tokens`: one limit, or one per prompt."""
        with self._lock:
            if self.asleep:
                raise RuntimeError("engine is asleep: wake() it with weights before generating")
            try:
                return self._generate(prompts, max_new_tokens)
            finally:
                if self.capture is not None:
                    self.capture.stop()

    def greedy(self, prompts: list[list[int]], max_new_tokens: int | list[int]) -> list[Generation]:
        """`generate` at temperature 0 (ReMax's baseline response). Greedy decoding draws nothing from the sampling
        generator, so the sampled responses of a seed are the same with or without these calls."""
        with self._lock:  # re-entrant: generate takes it too; no sampled call runs meanwhile
            temperature, self.temperature = self.temperature, 0.0
            try:
                return self.generate(prompts, max_new_tokens)
            finally:
                self.temperature = temperature

    def generate_stream(self, feed: Feed, max_inflight: int, between: Callable[[], None] | None = None,
                        sampling: Callable[[int], tuple[float, float]] | None = None
                        ) -> Iterator[tuple[int, Generation]]:
        """Continuous batching (relax/engines/continuous.py) over `feed` (relax/engines/feed.py): yields
        (request number, Generation) as each request finishes, at most `max_inflight` decoding at once. Other
        threads' weight updates wait until it is exhausted; `between()` runs before every decode step in this
        thread, where a partial rollout calls `update_weights` (in-flight requests go on with the new weights:
        pause, update, continue). `sampling(number) -> (temperature, top_p)` gives each request its own
        settings (the HTTP server batches requests of different callers); default: the engine's."""
        if self.capture is not None:
            raise RuntimeError("continuous batching does not record routing (moe.r3): use chunked generate")
        with self._lock, torch.no_grad():
            if self.asleep:
                raise RuntimeError("engine is asleep: wake() it with weights before generating")

            def wait():
                self._running.wait()
                if between is not None:
                    between()

            def sample(logits, numbers):
                if sampling is None:
                    return sample_tokens(logits, self.temperature, self.top_p, self.gen)
                keys = [sampling(i) for i in numbers]
                tokens, log_probs = torch.empty(len(keys), dtype=torch.long), torch.empty(len(keys))
                for key in dict.fromkeys(keys):  # rows sharing settings are sampled together, in a fixed order
                    rows = torch.tensor([j for j, k in enumerate(keys) if k == key])
                    tokens[rows], log_probs[rows] = sample_tokens(logits[rows], *key, self.gen)
                return tokens, log_probs

            eos = self.tokenizer.eos_token_id
            for r in continuous_generate(self.model, feed, max_inflight, self.tokenizer.pad_token_id, eos, sample,
                                         wait, version=lambda: self.version):
                yield r.index, Generation(r.tokens, r.log_probs, "stop" if r.tokens[-1] == eos else "length",
                                          r.first_version, last_version=r.last_version)

    def _generate(self, prompts, max_new_tokens):
        limit = torch.tensor(limits(max_new_tokens, len(prompts)))
        max_new_tokens = int(limit.max())
        B = len(prompts)
        L = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((B, L), pad, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p) :] = torch.tensor(p)
            attn[i, L - len(p) :] = 1
        pos = (attn.cumsum(-1) - 1).clamp_(min=0)
        eos = self.tokenizer.eos_token_id
        out_tok = torch.full((B, max_new_tokens), pad, dtype=torch.long)
        out_lp = torch.zeros((B, max_new_tokens))
        done = torch.zeros(B, dtype=torch.bool)
        lengths = torch.full((B,), max_new_tokens, dtype=torch.long)
        past = None
        step_ids, step_pos = ids, pos
        cap = self.capture
        if cap is not None:
            cap.begin(B, L, max_new_tokens)
        for t in range(max_new_tokens):
            self._running.wait()
            if cap is not None:
                cap.prefill() if t == 0 else cap.decode(t)
            out = self.model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos,
                             past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok, lp = sample_tokens(out.logits[:, -1], self.temperature, self.top_p, self.gen)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            out_tok[:, t] = tok
            out_lp[:, t] = torch.where(done, torch.zeros_like(lp), lp)
            newly = (~done) & ((tok == eos) | (limit == t + 1))
            lengths[newly] = t + 1
            done |= newly
            if bool(done.all()):
                break
            # Finished rows keep decoding pads (batch shape stays fixed); their outputs are discarded.
            attn = torch.cat([attn, torch.ones((B, 1), dtype=torch.long)], dim=1)
            step_ids, step_pos = tok[:, None], step_pos[:, -1:] + 1
        routes = cap.finish() if cap is not None else None
        gens = []
        for i in range(B):
            n = int(lengths[i])
            stopped = bool(out_tok[i, n - 1] == eos)
            gens.append(Generation(out_tok[i, :n].tolist(), out_lp[i, :n].tolist(),
                                   "stop" if stopped else "length", self.version))
            if routes is not None:
                gens[-1].extras["routed_experts"] = cap.routes(*routes, i, len(prompts[i]), n)
        return gens
