"""The omni study's table and figure: async vs colocate on the omni task, beside the published numbers.

`draw_omni(results_root, figures_dir, tables_dir)` reads `<results_root>/omni/omni_results.json` (written by
`relax study omni`, experiments/omni/study.py) and writes `tables_dir/omni.{csv,md}` and `figures_dir/omni.png` (reward
against step and against wall time per mode; step time by mode with the measured and published ratios); it
returns the paths written ([] when there are no omni results). Published: Relax paper (arXiv 2604.11554),
Qwen3-Omni-30B-A3B on 16 GPUs, from `results/published/relax_paper.csv` (analysis/published.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis import published
from analysis.headroom import interval
from analysis.plot import save  # noqa: E402
from analysis.tables import write_table

RESULTS_FILE = "omni_results.json"
NOTE = ("Measured: tiny omni model (tiny Qwen3 + vision / audio encoders, {model}) on digit_sum (real handwritten "
        "digit images; DTMF tones, synthesized, not speech; PyAV-muxed videos) through the engine's Ray roles and "
        "TransferQueue bus, on a 2-core CPU shared with other jobs (1-min load average {load}); the two runs are one "
        "after the other, so load differences between them move the ratio. Training reward = mean of the first / "
        "last quarter of the steps (RL draws from {pool} prompts); held-out greedy accuracy on eval prompts whose digit "
        "images no training step saw, with a 95% Student-t interval over the seeds. Published: Relax paper (arXiv 2604.11554), "
        "Qwen3-Omni-30B-A3B on 16 GPUs. Compare the ratio, not absolute times.")


def published_omni() -> dict[tuple[str, str, str], float]:
    """The paper's omni numbers by (experiment, mode, metric)."""
    return {(r["experiment"], r["mode"], r["metric"]): r["value"] for r in published.rows()
            if r["experiment"].startswith("omni")}


def omni_rows(res: dict, pub: dict) -> list[dict]:
    a, c = res["modes"].get("async"), res["modes"].get("colocate")
    rows = []

    def add(metric, measured, published_value=None, unit=""):
        rows.append({"metric": metric, "measured": None if measured is None else round(float(measured), 3),
                     "published": published_value, "unit": unit})

    if a and c:
        add("async speed-up vs colocate (colocate step / async step)", c["mean_step_time_s"] / a["mean_step_time_s"],
            pub.get(("omni_modes", "async_off_policy", "speedup_vs_colocate")), "x")
    for mode, m in res["modes"].items():
        key = "async_off_policy" if mode == "async" else "colocate"
        add(f"{mode}: step time", m["mean_step_time_s"], pub.get(("omni_modes", key, "step_time")), "s")
        add(f"{mode}: training reward, first quarter", m["reward_start"],
            pub.get(("omni_convergence", "async", "reward_start")) if mode == "async" else None)
        add(f"{mode}: training reward, last quarter", m["reward_end"],
            pub.get(("omni_convergence", "async", "reward_end")) if mode == "async" else None)
        add(f"{mode}: held-out greedy accuracy, before RL", m.get("eval_accuracy_start"))
        add(f"{mode}: held-out greedy accuracy, after RL", m.get("eval_accuracy_end"))
        add(f"{mode}: held-out sampled reward, before RL", m.get("eval_reward_start"))
        add(f"{mode}: held-out sampled reward, after RL", m.get("eval_reward_end"))
        gain = gain_interval(m)
        if gain:
            n, mean, half = gain
            add(f"{mode}: held-out greedy accuracy gain, mean over {n} seed(s)", mean)
            add(f"{mode}: held-out greedy accuracy gain, 95% t half-width", half)
        add(f"{mode}: 1-min load average during the run", m["host_load"]["loadavg_after"][0])
    return rows


def seed_runs(m: dict) -> list[dict]:
    """A mode's runs, one per seed (a result written before --seeds: its one run)."""
    return m.get("per_seed") or [m]


def heldout_gains(m: dict) -> list[float]:
    """Held-out greedy accuracy after RL minus before, per seed."""
    return [r["eval_accuracy_end"] - r["eval_accuracy_start"] for r in seed_runs(m)
            if r.get("eval_accuracy_end") is not None and r.get("eval_accuracy_start") is not None]


def gain_interval(m: dict) -> tuple[int, float, float | None] | None:
    """(seeds, mean held-out gain, 95% t half-width; None for one seed), or None without held-out evals."""
    gains = heldout_gains(m)
    return (len(gains), *interval(gains)) if gains else None


def _note(res: dict) -> str:
    m = res.get("model") or {}
    loads = sorted(x for v in res["modes"].values() for x in (v["host_load"]["loadavg_before"][0],
                                                                v["host_load"]["loadavg_after"][0]))
    return NOTE.format(model=f"hidden {m.get('hidden_size')}, {m.get('num_layers')} layers",
                       load=f"{loads[0]}-{loads[-1]}" if loads else "?", pool=(res.get("task") or {}).get("rl_pool") or "all the train")


def plot_omni(res: dict, pub: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"async": "tab:blue", "colocate": "tab:orange"}
    fig, ax = plt.subplots(1, 4, figsize=(19, 4.2))
    for mode, m in res["modes"].items():
        s = m["series"]
        ax[0].plot(s["step"], s["reward"], "o-", ms=3, color=colors.get(mode), label=f"{mode} (measured)")
        ax[1].plot(s["wall_time_s"], s["reward"], "o-", ms=3, color=colors.get(mode), label=f"{mode} (measured)")
    r0 = pub.get(("omni_convergence", "async", "reward_start"))
    r1 = pub.get(("omni_convergence", "async", "reward_end"))
    if r0 is not None and r1 is not None:
        for a in ax[:2]:
            a.axhline(r0, color="grey", ls=":", lw=1)
            a.axhline(r1, color="grey", ls="--", lw=1, label=f"published async {r0:.2f} -> {r1:.2f} (30B, 16 GPUs)")
    ax[0].set(xlabel="RL step", ylabel="training reward (mean over the step)", title="reward vs step")
    ax[1].set(xlabel="wall time since RL start (s)", ylabel="training reward", title="reward vs wall time")
    for a in ax[:2]:
        a.set_ylim(0, 1)
        a.legend(fontsize=7)
    modes = [m for m in ("colocate", "async") if m in res["modes"]]
    times = [res["modes"][m]["mean_step_time_s"] for m in modes]
    bars = ax[2].bar(modes, times, color=[colors[m] for m in modes])
    for b, t, m in zip(bars, times, modes):
        load = res["modes"][m]["host_load"]
        ax[2].text(b.get_x() + b.get_width() / 2, t, f"{t:.2f} s\nload {load['loadavg_before'][0]:g}"
                   f"->{load['loadavg_after'][0]:g}", ha="center", va="bottom", fontsize=7)
    title = "step time by mode (measured, CPU)"
    if len(modes) == 2:
        ratio = times[0] / times[1]
        p = pub.get(("omni_modes", "async_off_policy", "speedup_vs_colocate"))
        title += f"\nasync speed-up {ratio:.2f}x" + (f"; published {p:.2f}x (30B, 16 GPUs)" if p else "")
    ax[2].margins(y=0.2)
    ax[2].set(ylabel="mean step time (s)", title=title)
    for i, mode in enumerate(modes):
        for r in seed_runs(res["modes"][mode]):
            if r.get("eval_accuracy_start") is None:
                continue
            ax[3].plot([i - 0.15, i + 0.15], [r["eval_accuracy_start"], r["eval_accuracy_end"]], "o-",
                       color=colors[mode], alpha=0.8)
        gain = gain_interval(res["modes"][mode])
        if gain:
            _, mean, half = gain
            ax[3].text(i, 1.02, f"gain {mean:+.3f}" + (f" +- {half:.3f}" if half is not None else ""),
                       ha="center", fontsize=7)
    ax[3].set_xticks(range(len(modes)), modes)
    ax[3].set(ylim=(0, 1.1), ylabel="held-out greedy accuracy (before -> after RL)",
              title="held-out accuracy, each seed (measured)")
    fig.suptitle("Omni task (digit_sum: image + DTMF tone / video -> sum), tiny omni model, CPU, through the engine",
                 fontsize=10)
    fig.text(0.5, 0.005, "Published values are the paper's Qwen3-Omni-30B-A3B run; ours is a tiny model on 2 shared "
             "CPU cores: compare the ratio and the direction of reward, not absolute values.", ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    save(fig, path)
    return path


def draw_omni(results_root, figures_dir, tables_dir) -> list[Path]:
    src = Path(results_root) / "omni" / RESULTS_FILE
    if not src.exists():
        return []
    res = json.loads(src.read_text())
    if not res.get("modes"):
        return []
    pub = published_omni()
    rows = omni_rows(res, pub)
    tables_dir, figures_dir = Path(tables_dir), Path(figures_dir)
    tables = write_table(rows, tables_dir, "omni", "Omni: async vs colocate on the omni task (through the engine)",
                         _note(res), columns=["metric", "measured", "published", "unit"])
    return [*tables, plot_omni(res, pub, figures_dir / "omni.png")]
