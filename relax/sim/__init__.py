"""relax.sim: the cost model, hardware profiles (data), length models and the discrete-event simulator (SimPy) of
every schedule the engine runs. `relax simulate CONFIG [key=value ...] --hardware NAME` (relax/sim/cli.py).

- hardware.py + hardware/*.yaml: device, link, efficiency and overhead numbers, each with its source
- shapes.py + models/*.yaml: the policy's layer shapes (parameters are derived, never typed)
- lengths.py + lengths/*.yaml: response-length distributions per task, truncated at max_new_tokens
- cost.py: the time of each unit of work; sim.py: the schedules in simulated time; output.py: the run folder
Everything it writes says `simulated: true` and names the hardware.
"""

from __future__ import annotations

from relax.config import ExperimentConfig


def build(cfg: ExperimentConfig, hardware, band: str = "mid", recompute: bool = False,
          lengths: str | None = None, record: bool = True, length_band: str | None = None, **sim_options):
    """A ready-to-run Simulation of `cfg` on `hardware` (a profile name, YAML path or HardwareProfile).
    `length_band` takes the length model's band apart from the hardware's (default: `band`); `sim_options` are
    SimOptions' simulator-side engine behaviours (stream_groups, inflight_groups, packed_sequences)."""
    from relax.sim.cost import CostModel, SimOptions
    from relax.sim.hardware import load_hardware
    from relax.sim.lengths import fit_run, length_model
    from relax.sim.shapes import model_shape
    from relax.sim.sim import Simulation

    hw = load_hardware(hardware)
    options = SimOptions(band=band, recompute=recompute, **sim_options)
    band = length_band or band
    if lengths and not str(lengths).endswith((".yaml", ".yml")):
        from relax.sim.lengths import length_model as _lm

        base = _lm(cfg.task.name, cfg.rollout.max_new_tokens, band) if _has_file(cfg.task.name) else None
        # cv: the task file's, else assumed 0.5 (the metrics give only the mean)
        lm = fit_run(lengths, cfg.rollout.max_new_tokens, base.prompt_tokens if base else prompt_tokens(cfg),
                     base.cv if base else 0.5)
    else:
        lm = length_model(cfg.task.name, cfg.rollout.max_new_tokens, band, lengths)
    return Simulation(cfg, CostModel(cfg, model_shape(cfg), hw, options, lm.media_tokens), lm, record=record)


def prompt_tokens(cfg: ExperimentConfig, n: int = 64) -> float:
    """Mean prompt length in tokens of the task's first `n` training prompts (its own generator and tokenizer)."""
    from relax.models import build_tokenizer
    from relax.tasks import make_task

    task, tok = make_task(cfg.task, cfg.seed, "train"), build_tokenizer(cfg.model)
    n = min(n, cfg.task.size)
    return sum(len(tok.encode(task[i].prompt)) for i in range(n)) / n


def _has_file(task: str) -> bool:
    from relax.sim.lengths import HERE

    return (HERE / f"{task}.yaml").exists()


def devices_label(cfg: ExperimentConfig, hw) -> str:
    r = cfg.resources
    if hw.kind == "cpu":
        return f"{hw.name} (CPU)"
    pools = [r.actor.gpus, r.rollout.gpus, r.reference.gpus if cfg.algorithm.kl_coef > 0 else 0,
             r.actor_fwd.gpus if cfg.algorithm.old_log_probs == "actor_fwd" else 0]
    n = max(pools) if cfg.mode == "colocate" else sum(pools)
    return f"{n:g}x {hw.name}"
