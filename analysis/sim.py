"""Tables and figures of the simulator's study (`relax study sim`, experiments/sim/study.py), from
`<results>/sim/sim_results.json`. Every table and plot says SIMULATED: these are cost-model predictions on a
hardware profile (relax/sim/hardware/), not measurements."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.plot import save  # noqa: E402
from analysis.tables import write_table  # noqa: E402

RESULTS_FILE = "sim_results.json"
TAG = "SIMULATED"


def _note(res: dict) -> str:
    return (f"{TAG}: relax/sim cost model + SimPy on the '{res['hardware']}' profile (datasheet numbers; efficiencies "
            f"sourced or assumed, relax/sim/hardware/{res['hardware']}.yaml), full recompute {res['recompute']}, "
            f"engine model {res['engine']} (simulator-side: our engine does one chunk_groups call at a time), "
            f"{res['steps']} steps per prediction. Published: arXiv 2604.11554 via analysis/published.py. No "
            "parameter is fitted to a published number except in the table marked calibrated.")


def _fmt(x, nd=1):
    return None if x is None else round(x, nd)


def gate_rows(res: dict) -> list[dict]:
    rows = []
    for name, e in res["gate"].items():
        b, mid = e["bands"], e["bands"]["mid"]
        rows.append({"prediction": name, "hardware": e.get("hardware", res["hardware"]), "published_s": e["published"],
                     "low_s": _fmt(b["low"]["step_time_s"]), "mid_s": _fmt(mid["step_time_s"]),
                     "high_s": _fmt(b["high"]["step_time_s"]),
                     "as_built_mid_s": _fmt(e.get("as_built_mid", {}).get("step_time_s")),
                     "bound_mid_s": _fmt(mid["bound_step_s"]), "slowest_pool": mid["slowest_pool"],
                     "eff_train_mfu": mid["effective_train_mfu"],
                     "eff_decode_bw": mid["effective_decode_bw_efficiency"],
                     "assumed_mfu / decode_bw": f"{mid['assumed_train_mfu']} / {mid['assumed_decode_bw']}",
                     "resp_tokens_mid": mid["response_tokens_mean"]})
    return rows


def solve_rows(res: dict) -> list[dict]:
    out = []
    for r in res["solve"]:
        row = {"prediction": r["prediction"], "published_s": r["published_s"]}
        for k in ("length_mean", "train_mfu", "decode_bw"):
            lo, hi = r[f"{k}_range"]
            row[k] = r[k] if r[k] is not None else f"none in [{lo}, {hi}]"
        row["best_split (rollout:actor -> step)"] = r.get("best_split", "-")
        row["train_mfu if trainer-bound"] = r.get("train_mfu_if_trainer_bound", "-")
        row["effective MFU if trainer-bound"] = r.get("effective_mfu_if_trainer_bound", "-")
        out.append(row)
    return out


def calibrated_rows(res: dict) -> list[dict]:
    c = res["calibrated"]
    rows = []
    for name, p in c.get("predictions", {}).items():
        pub = p["published"]
        rows.append({"prediction": name, "published_s": pub, "calibrated_s": _fmt(p["step_time_s"]),
                     "error_%": _fmt(100 * (p["step_time_s"] / pub - 1)) if pub else None,
                     "fitted": "yes" if name == c["fitted_to"] else "no (predicted)",
                     "eff_train_mfu": p["effective_train_mfu"], "eff_decode_bw": p["effective_decode_bw_efficiency"]})
    return rows


def _table(rows: list[dict], tables: Path, name: str, title: str, note: str) -> list[Path]:
    if not rows:
        return []
    columns = list(dict.fromkeys(k for r in rows for k in r))  # every row's keys, first-seen order
    return write_table([{c: r.get(c) for c in columns} for r in rows], tables, name, f"{TAG}: {title}", note,
                       columns=columns)


def plot_gate(res: dict, path: Path) -> Path:
    g = res["gate"]
    names = [n for n, e in g.items() if e["published"] is not None]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    x = range(len(names))
    mid = [g[n]["bands"]["mid"]["step_time_s"] for n in names]
    lo = [g[n]["bands"]["low"]["step_time_s"] for n in names]
    hi = [g[n]["bands"]["high"]["step_time_s"] for n in names]
    ax.bar([i - 0.2 for i in x], mid, 0.4, yerr=[[m - a for m, a in zip(mid, lo)], [b - m for m, b in zip(mid, hi)]],
           capsize=3, label="SIMULATED (length band low..high, mid bar)", color="#8fb3d9")
    ax.bar([i + 0.2 for i in x], [g[n]["published"] for n in names], 0.4, label="published (16 GPUs)", color="#d98f8f")
    ax.set_xticks(list(x), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{TAG}: the paper's step times at 16 GPUs, predicted from sourced assumptions", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)
    return path


def plot_scaling(res: dict, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for model in sorted({r["model"] for r in res["scaling"]}):
        rows = [r for r in res["scaling"] if r["model"] == model]
        n = [r["gpus"] for r in rows]
        (line,) = axes[0].plot(n, [r["async_samples_per_s"] for r in rows], "o-", label=f"{model} async s=1")
        axes[0].plot(n, [r["colocate_samples_per_s"] for r in rows], "s--", color=line.get_color(),
                     label=f"{model} colocate")
        axes[0].plot(n, [r["async_bound_samples_per_s"] for r in rows], ":", color=line.get_color(),
                     label=f"{model} async bound (slowest pool)")
        axes[1].plot(n, [r["speedup_vs_colocate"] for r in rows], "o-", label=model)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (weak scaling: pools, replicas, prompts x GPUs/16)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("samples/s")
    axes[1].set_ylabel("async / colocate speed-up")
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{TAG}: throughput and speed-up over colocate, 16 to 1024 H800", fontsize=10)
    fig.tight_layout()
    save(fig, path)
    return path


def plot_lines(rows: list[dict], key: str, x: str, y: str, title: str, xlabel: str, ylabel: str, path: Path,
               mark=None) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for v in sorted({r[key] for r in rows}, key=str):
        rr = [r for r in rows if r[key] == v and r[y] is not None]
        ax.plot([r[x] for r in rr], [r[y] for r in rr], "o-", label=f"{key} {v}")
        if mark:
            for r in rr:
                if r.get(mark):
                    ax.plot(r[x], r[y], "k*", ms=12)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{TAG}: {title}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)
    return path


def _staleness_series(rows: list[dict]) -> list[dict]:
    """One line per GPU count and engine: chunked claims (the paper's), streaming that refills, and streaming +
    partial rollout; samples/s per GPU, so 16 and 256 GPUs share one scale."""
    out = []
    for r in rows:
        per_gpu = r["samples_per_s"] / r["gpus"]
        out.append({"engine": f"{r['gpus']} GPUs, chunked", "max_staleness": r["max_staleness"],
                    "samples_per_s_per_gpu": round(per_gpu, 5)})
        for key, label in (("streaming_step_s", "streaming"), ("streaming_partial_step_s", "streaming+partial")):
            if r.get(key):
                out.append({"engine": f"{r['gpus']} GPUs, {label}", "max_staleness": r["max_staleness"],
                            "samples_per_s_per_gpu": round(per_gpu * r["step_time_s"] / r[key], 5)})
    return out


def draw_sim(results_root, figures_dir, tables_dir) -> list[Path]:
    src = Path(results_root) / "sim" / RESULTS_FILE
    if not src.exists():
        return []
    res = json.loads(src.read_text())
    figs, tables = Path(figures_dir), Path(tables_dir)
    figs.mkdir(parents=True, exist_ok=True)
    tables.mkdir(parents=True, exist_ok=True)
    note, out = _note(res), []
    if "gate" in res:
        out += _table(gate_rows(res), tables, "sim_gate", "the second gate: step times at the paper's 16xH800 "
                      "beside the published ones (band: length model low/mid/high)", note)
        out += _table(res["ratios"], tables, "sim_ratios", "the paper's ratios, predicted (length band)", note)
        out.append(plot_gate(res, figs / "sim_gate.png"))
    if "solve" in res:
        out += _table(solve_rows(res), tables, "sim_what_would_have_to_be_true", "the one value of each knob "
                      "(others at mid) that gives each published step time", note)
    if res.get("calibrated", {}).get("predictions"):
        c = res["calibrated"]
        out += _table(calibrated_rows(res), tables, "sim_calibrated", f"CALIBRATED: {c['knob']} = "
                      f"{c['value']:.0f} fitted to the published {c['fitted_to']} step time, the rest predicted", note)
    if "scaling" in res:
        out += _table(res["scaling"], tables, "sim_scaling", "throughput and speed-up over colocate, 16..1024 GPUs",
                      note)
        out.append(plot_scaling(res, figs / "sim_scaling.png"))
    if "staleness" in res:
        out += _table(res["staleness"], tables, "sim_staleness", "the staleness sweep", note)
        out.append(plot_lines(_staleness_series(res["staleness"]), "engine", "max_staleness", "samples_per_s_per_gpu",
                              "throughput by max_staleness (Qwen3-4B async)", "max_staleness s", "samples/s per GPU",
                              figs / "sim_staleness.png"))
    if "split" in res:
        out += _table(res["split"], tables, "sim_split", "rollout:actor split search (reference and actor_fwd fixed;"
                      " * = best)", note)
        out.append(plot_lines(res["split"], "gpus", "rollout_gpus", "step_time_s", "step time by rollout GPUs "
                              "(star: best)", "rollout GPUs (the rest of rollout+actor trains)", "step time (s)",
                              figs / "sim_split.png", mark="best"))
    if "max_length" in res:
        out += _table(res["max_length"], tables, "sim_max_length", "sensitivity to the maximum response length",
                      note)
        out.append(plot_lines(res["max_length"], "prediction", "max_new_tokens", "step_time_s", "step time by "
                              "max response length (16 GPUs)", "rollout.max_new_tokens", "step time (s)",
                              figs / "sim_max_length.png"))
    return out
