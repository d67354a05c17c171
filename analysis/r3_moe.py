"""The R3 table and figure, beside the paper's published step-time overheads (Relax, veRL) and mismatch cut.

`draw_r3(results_root, figures_dir, tables_dir)` reads `<results_root>/r3_moe/r3_results.json` (written by
`relax study r3_moe`, experiments/r3_moe/study.py) and writes `tables_dir/r3_moe.{csv,md}` and
`figures_dir/r3_moe.png`; it returns the paths written ([] when there are no R3 results). Published numbers
come from results/published/relax_paper.csv (analysis/published.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis import published
from analysis.plot import save  # noqa: E402
from analysis.tables import write_table

RESULTS_FILE = "r3_results.json"
NOTE = ("Measured: tiny Qwen3-MoE ({model}) on a 2-core CPU shared with other jobs (load average {load}), rollout "
        "engine bf16, trainer {precision}. Side-by-side overheads: R3 off and on alternate unit by unit on the same inputs "
        "and seeds, timed in thread CPU time (wall time beside it); they carry a few % of noise from the load. "
        "\"R3's own work, timed\": the pieces R3 adds, each timed in a tight loop, over the step's time: precise, "
        "but it leaves out cache effects. End-to-end runs are separate runs and noisier still. Published: Relax "
        "paper (arXiv 2604.11554), Qwen3-30B-A3B on 16xH800. Compare ratios, not absolute times. "
        "veRL (emulated): veRL's one-step-off-policy dataflow run with our kernels, our uint8 bus field and our "
        "replay; its R3 cost here is only the schedule's own extra work (the old-log-prob and reference forwards "
        "replay on the trainer's critical path). veRL's published {verl_pub} also pays for its data path, which the "
        "emulation does not reproduce: routed experts travel as a dense padded [batch, max prompt + response, "
        "layers, k] tensor through the single-controller driver and are broadcast to the workers (the transfer "
        "volume reported in verl issue #6211). Mismatch: R3 removes the routing flips' share of the engine-vs-trainer "
        "gap; the dense bf16 noise on every token stays, so the reduction depends on how many tokens' forwards "
        "route differently and how far a flip moves the log-prob. Trainers beside the config's: fp32; bf16 "
        "(autocast: bf16 matmuls, fp32 master weights, residual stream and norms); bf16 weights (the whole model "
        "cast to bf16: on a CPU the same kernels as the engine, so it differs from it only by the KV-cache path "
        "and padding, unlike Megatron against SGLang on GPUs). Intervals: paired bootstrap over rows (95%).")


TRAINER_LABEL = {"fp32": "fp32", "bf16": "bf16 autocast", "bf16_weights": "bf16 weights (same CPU kernels as the engine)"}


def _note(res: dict, pub: dict) -> str:
    m = res.get("model") or {}
    model = (f"{m.get('num_layers')} MoE layers, {m.get('num_experts')} experts, top-{m.get('experts_per_token')}, "
             f"hidden {m.get('hidden_size')}") if m else "see the config"
    load = (res.get("overhead") or {}).get("load_before") or res.get("load_start") or ["?"]
    prec = ((res.get("mismatch") or {}).get("warmup") or {}).get("trainer_precision", "fp32")
    prec = {"fp32": "fp32", "bf16": "bf16 mixed precision (autocast, fp32 master weights)"}.get(prec, prec)
    verl = pub.get(("verl", "r3_step_time_overhead"))
    return NOTE.format(model=model, load=load[0], precision=prec, verl_pub="?" if verl is None else f"{verl:g}%")


def published_r3() -> dict[tuple[str, str], float]:
    """The paper's R3 numbers by (system, metric)."""
    return {(r["system"], r["metric"]): r["value"] for r in published.rows() if r["experiment"] == "r3_moe"}


def _mismatches(res: dict) -> dict:
    """Mismatch measurements by weights: the config's model (warm-up, each run's final weights), then the
    other model shapes (warm-up weights)."""
    out = dict(res.get("mismatch") or {})
    out.update({f"warmup, {k}": v for k, v in (res.get("mismatch_variants") or {}).items()})
    return out


def _r(x, nd=3):
    return None if x is None else round(float(x), nd)


def r3_rows(res: dict, pub: dict) -> list[dict]:
    rows = []

    def add(metric, measured, published_value=None, unit="", how=""):
        rows.append({"metric": metric, "measured": measured, "published": published_value, "unit": unit, "how": how})

    oh = res.get("overhead")
    if oh:
        st = oh["stages"]
        pub_relax = pub.get(("relax", "r3_step_time_overhead"))
        how = (f"{oh.get('clock', 'cpu')} time, off/on interleaved unit by unit over {oh['reps']} rounds, best of "
               "the rounds")
        add("R3 step-time overhead, relax async (side by side)", _r(oh["async_step_overhead_pct"], 2), pub_relax, "%",
            f"bottleneck stage ({oh['bottleneck_stage']}); {how}")
        if "component_async_step_overhead_pct" in oh:
            add("R3 step-time overhead, relax async (R3's own work, timed)", _r(oh["component_async_step_overhead_pct"], 2),
                pub_relax, "%", "the extra pieces timed in tight loops / the bottleneck stage's step time")
        add("R3 overhead if the stages ran serially (side by side)", _r(oh["serial_step_overhead_pct"], 2), None, "%",
            "rollout + actor + reference one after the other (a colocated or synchronous schedule)")
        if "verl_step_overhead_pct" in oh:
            pub_verl = pub.get(("verl", "r3_step_time_overhead"))
            add("R3 step-time overhead, veRL emulated step (side by side)", _r(oh["verl_step_overhead_pct"], 2),
                pub_verl, "%", "max(generation, update + old-log-prob forward + reference forward): the emulated "
                "veRL step's work from the same units, our kernels and our compact bus field")
            add("R3 step-time overhead, veRL emulated step (R3's own work, timed)",
                _r(oh.get("component_verl_step_overhead_pct"), 2), pub_verl, "%",
                "the extra pieces timed in tight loops, over the same emulated veRL step")
        if "component_serial_step_overhead_pct" in oh:
            add("R3 overhead if the stages ran serially (R3's own work, timed)",
                _r(oh["component_serial_step_overhead_pct"], 2), None, "%", "all extra pieces / all stages' step time")
        for name, s in st.items():
            wall = (oh.get("wall") or {}).get("stages", {}).get(name, {}).get("overhead_pct")
            comp = (oh.get("components") or {}).get(name, {})
            pieces = ", ".join(f"{k[:-2]} {1000 * v:.2f} ms" for k, v in comp.items() if k != "extra_s")
            med = s.get("median_overhead_pct")
            add(f"  {name} stage overhead (side by side)", _r(s["overhead_pct"], 2), None, "%",
                f"{s['off_s']:.3f} s off -> {s['on_s']:.3f} s on per step ({s['pairs']} pairs)"
                + (f"; medians: {med:+.1f}%" if med is not None else "")
                + (f"; wall time: {wall:+.1f}%" if wall is not None else ""))
            if comp:
                add(f"  {name} stage overhead (R3's own work, timed)", _r(s.get("component_overhead_pct"), 2), None,
                    "%", f"{1000 * comp['extra_s']:.2f} ms per step: {pieces}")
        bus = oh.get("bus")
        if bus:
            add("  bus put + fetch of the field", _r(1000 * bus["extra_s"], 1), None, "ms",
                f"a step's rows put (chunks) and fetched by Actor + Reference, best of {bus['reps']} off/on rounds "
                f"(wall, Ray + TransferQueue): {1000 * bus['off_s']:.0f} ms off, {1000 * bus['on_s']:.0f} ms on "
                f"({bus['overhead_pct']:+.0f}% of the bus time; median ratio {bus['ratio_median_pct']:+.0f}%)")
        add("routing bytes per sample", _r(oh["bytes_per_sample"], 1), None, "B",
            f"{oh['tokens_per_sample']:.1f} tokens x layers x k, uint8; the sample's other fields: "
            f"{oh['other_fields_bytes_per_sample']:.0f} B")
    for schedule, s in (res.get("runs") or {}).items():
        label = "relax async" if schedule == "relax" else f"{schedule} (emulated)"
        add(f"R3 step-time overhead, {label}, end-to-end runs", _r(s["step_time_overhead_pct"], 2),
            pub.get((schedule, "r3_step_time_overhead")), "%",
            f"mean steady step time, {len(s['off'])} off/on pair(s) of runs "
            + ("run side by side (same load)" if s.get("concurrent") else "run one after the other"))
    if "verl" not in (res.get("runs") or {}):
        add("R3 step-time overhead, veRL", None, pub.get(("verl", "r3_step_time_overhead")), "%",
            "not measured: the emulated veRL schedule does not read the R3 fields (no SUPPORTS_R3)")
    for state, mm in _mismatches(res).items():
        red = mm["r3_on_reduction_pct"]
        ci = mm.get("r3_on_reduction_ci95") or {}
        ci_s = lambda m: f"; 95% interval {ci[m][0]:.0f}..{ci[m][1]:.0f}%" if m in ci else ""  # noqa: E731
        prec = mm.get("trainer_precision", "fp32")
        add(f"mismatch reduction, mean |dlogp| ({state} weights)", _r(red["mean_abs"], 1),
            pub.get(("relax", "r3_logprob_mismatch_reduction")), "%",
            f"bf16 engine vs {prec} trainer: {mm['r3_off']['mean_abs']:.5f} -> {mm['r3_on']['mean_abs']:.5f} over "
            f"{mm['r3_off']['tokens']} tokens{ci_s('mean_abs')}; response-only replay: "
            f"{mm['r3_response_reduction_pct']['mean_abs']:.1f}%")
        add(f"mismatch reduction, KL engine||trainer ({state} weights)", _r(red["kl_k3"], 1), None, "%",
            f"{mm['r3_off']['kl_k3']:.2e} -> {mm['r3_on']['kl_k3']:.2e} (k3 on sampled tokens){ci_s('kl_k3')}")
        for t, g in (mm.get("trainers") or {}).items():
            if t == prec:
                continue
            tci = g.get("reduction_ci95") or {}
            add(f"  mismatch reduction |dlogp| / KL, {TRAINER_LABEL.get(t, t)} trainer ({state} weights)",
                _r(g["reduction_pct"]["mean_abs"], 1), None, "%",
                f"|dlogp| {g['r3_off']['mean_abs']:.5f} -> {g['r3_on']['mean_abs']:.5f}"
                + (f" (95% {tci['mean_abs'][0]:.0f}..{tci['mean_abs'][1]:.0f}%)" if tci else "")
                + f"; KL {g['reduction_pct']['kl_k3']:.0f}%; (token, layer) pairs routed differently: "
                  f"{100 * g['pairs_flipped']:.2f}%, response tokens with a flip: {100 * g['tokens_flip_at']:.1f}%"
                + (f"; with R3, |dlogp| on the {prec} trainer's flipped tokens {g['on_at_headline_flips']:.5f}, "
                   f"elsewhere {g['on_elsewhere']:.5f}" if g.get("on_at_headline_flips") is not None else ""))
        ag = mm["routing_agreement"]
        add(f"trainer routes as the engine, R3 off ({state} weights)", _r(100 * ag["response"], 1), None, "%",
            f"response tokens x layers with the same top-k set (prompt: {100 * ag['prompt']:.1f}%)")
        fl = mm.get("flips")
        if fl:
            at, no = fl["flip_at"], fl["no_flip_at"]
            add(f"tokens with a routing flip, R3 off ({state} weights)", _r(100 * at["tokens_share"], 1), None, "%",
                f"response tokens whose own forward routes differently in at least one of {fl['layers']} layers "
                f"({mm.get('trainer_precision', 'fp32')} trainer vs bf16 engine); a flip in the generated context: "
                f"{100 * fl['flip_response']['tokens_share']:.1f}%, in the prompt: "
                f"{100 * fl['flip_prompt']['tokens_share']:.1f}%; (token, layer) pairs: "
                f"{100 * fl['pairs_flipped']:.2f}%"
                + (f"; a flip moves {100 * fl['swapped_gate_mean']:.1f}% of the pair's gate weight (mean)"
                   if fl.get("swapped_gate_mean") is not None else ""))
            if at["tokens_share"] and no["tokens_share"]:
                removed = at.get("share_of_removed")
                add(f"  mean |dlogp| on flipped / unflipped tokens ({state} weights)", _r(at["mean_abs_off"], 5), None,
                    "", f"flipped: {at['mean_abs_off']:.5f} off -> {at['mean_abs_on']:.5f} on; unflipped: "
                        f"{no['mean_abs_off']:.5f} -> {no['mean_abs_on']:.5f} (dense bf16 noise R3 cannot remove); "
                        + (f"replay moves the trainer's log-prob by {at['mean_shift']:.5f} on flipped tokens, "
                           f"{no['mean_shift']:.5f} on the others; " if "mean_shift" in at else "")
                        + f"flipped tokens carry {100 * at['share_of_abs_off']:.0f}% of |dlogp| and "
                        f"{100 * at['share_of_kl_off']:.0f}% of KL off"
                        + (f", {100 * removed:.0f}% of what replay removed" if removed is not None else ""))
    for schedule, s in (res.get("runs") or {}).items():
        for mode in ("off", "on"):
            gaps = [r["onpolicy_logp_gap_abs"] for r in s[mode] if r.get("onpolicy_logp_gap_abs") is not None]
            steps = sum(r["onpolicy_steps"] for r in s[mode])
            if gaps:
                add(f"in-run mean |dlogp| trainer vs engine, {schedule} R3 {mode}", _r(sum(gaps) / len(gaps), 5), None,
                    "", f"Actor's own measure on the {steps} step(s) of {len(gaps)} run(s) whose samples all came "
                        "from the weights it trains (the others are one version stale)")
            gaps = [r["logp_gap_abs"] for r in s[mode] if r.get("logp_gap_abs") is not None]
            if gaps:
                add(f"in-run mean |dlogp| incl. staleness, {schedule} R3 {mode}", _r(sum(gaps) / len(gaps), 5), None, "",
                    "Actor, every steady step (mostly samples one weight version behind: policy lag dominates)")
    return rows


def _bar_label(ax, bars, fmt="{:.1f}"):
    for b in bars:
        h = b.get_height()
        if h == h:  # not NaN
            ax.annotate(fmt.format(h), (b.get_x() + b.get_width() / 2, h), ha="center", va="bottom", fontsize=7)


def plot_r3(res: dict, pub: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(26, 5.6))
    ax = axes[0]
    labels, vals, colors = [], [], []
    oh = res.get("overhead")
    if oh:
        labels += ["relax async\nside by side", "relax async\nR3 work timed"]
        vals += [oh["async_step_overhead_pct"], oh.get("component_async_step_overhead_pct", float("nan"))]
        colors += ["#d62728", "#d62728"]
        labels += ["serial stages\nside by side", "serial stages\nR3 work timed"]
        vals += [oh["serial_step_overhead_pct"], oh.get("component_serial_step_overhead_pct", float("nan"))]
        colors += ["#ff9896", "#ff9896"]
        if "verl_step_overhead_pct" in oh:
            labels += ["veRL step\n(emulated)\nside by side", "veRL step\n(emulated)\nR3 work timed"]
            vals += [oh["verl_step_overhead_pct"], oh.get("component_verl_step_overhead_pct", float("nan"))]
            colors += ["#98df8a", "#98df8a"]
    for schedule, s in (res.get("runs") or {}).items():
        labels.append(f"{schedule} async\ne2e runs" + ("" if schedule == "relax" else "\n(emulated)"))
        vals.append(s["step_time_overhead_pct"])
        colors.append("#d62728" if schedule == "relax" else "#2ca02c")
    for system, color in (("relax", "#7f7f7f"), ("verl", "#2ca02c")):
        if (system, "r3_step_time_overhead") in pub:
            labels.append(f"{'Relax' if system == 'relax' else 'veRL'}\n(published)")
            vals.append(pub[(system, "r3_step_time_overhead")])
            colors.append(color)
    bars = ax.bar(range(len(vals)), vals, color=colors)
    for b, lab in zip(bars, labels):
        if "published" in lab:
            b.set_hatch("//")
            b.set_alpha(0.6)
    _bar_label(ax, bars)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(range(len(vals)), [x.replace("\n", " ") for x in labels], fontsize=6, rotation=60, ha="right")
    ax.set(title="R3 step-time overhead (measured: solid; published: hatched)", ylabel="% of step time")
    if oh:
        ax.text(0.02, 0.97, f"routing adds {oh['bytes_per_sample']:.0f} B/sample (uint8)\n"
                f"other fields: {oh['other_fields_bytes_per_sample']:.0f} B/sample", transform=ax.transAxes,
                va="top", fontsize=7)

    ax = axes[1]
    mm = _mismatches(res)
    states = list(mm)
    x = range(len(states))
    w = 0.27
    for j, (key, label, color) in enumerate((("r3_off", "R3 off", "#7f7f7f"), ("r3_response", "replay response", "#ff9896"),
                                             ("r3_on", "R3 on (prompt + response)", "#d62728"))):
        bars = ax.bar([i + (j - 1) * w for i in x], [mm[s][key]["mean_abs"] for s in states], w, label=label, color=color)
        if key == "r3_on":
            for b, s in zip(bars, states):
                red_s = mm[s]["r3_on_reduction_pct"]
                ax.annotate(f"|d| {-red_s['mean_abs']:+.0f}%\nKL {-red_s['kl_k3']:+.0f}%", (b.get_x() + w / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=6)
    floor = [mm[s].get("fp32_engine_r3_off", {}).get("mean_abs") for s in states]
    if any(f is not None for f in floor):
        ax.scatter(list(x), floor, marker="_", s=400, color="black", label="fp32 engine (floor)", zorder=3)
    red = pub.get(("relax", "r3_logprob_mismatch_reduction"))
    ax.set_xticks(list(x), [s.replace("_", " ").replace(", ", "\n") for s in states], fontsize=6)
    precs = {mm[s].get("trainer_precision", "fp32") for s in states}
    ax.set(title=f"bf16 engine vs {'/'.join(sorted(precs)) or 'fp32'} trainer, same weights"
           + (f"\n(published reduction: {red:.0f}%)" if red else ""),
           ylabel="mean |delta log-prob| on rollout tokens")
    ax.legend(fontsize=6, loc="lower left", framealpha=0.8)

    ax = axes[2]
    have = [st for st in states if (mm[st].get("flips") or {}).get("flip_at", {}).get("tokens_share")]
    w = 0.2
    for j, (part, mode, label, color) in enumerate((
            ("no_flip_at", "off", "no flip, R3 off", "#c7c7c7"), ("no_flip_at", "on", "no flip, R3 on", "#7f7f7f"),
            ("flip_at", "off", "flipped, R3 off", "#ff9896"), ("flip_at", "on", "flipped, R3 on", "#d62728"))):
        vals = [mm[st]["flips"][part].get(f"mean_abs_{mode}", float("nan")) for st in have]
        bars = ax.bar([i + (j - 1.5) * w for i in range(len(have))], vals, w, label=label, color=color)
        if j == 2:
            for b, st in zip(bars, have):
                ax.annotate(f"{100 * mm[st]['flips']['flip_at']['tokens_share']:.0f}% of tokens",
                            (b.get_x() + w, b.get_height()), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(have)), [st.replace("_", " ").replace(", ", "\n") for st in have], fontsize=6)
    ax.set(title="Where the gap sits: tokens whose own forward routes\ndifferently (some layer) vs the others",
           ylabel="mean |delta log-prob|")
    if have:
        ax.legend(fontsize=7)

    ax = axes[3]
    trainers = [t for t in TRAINER_LABEL if any(t in (mm[st].get("trainers") or {}) for st in states)]
    w = 0.8 / max(2 * len(trainers), 1)
    colors = {"fp32": "#1f77b4", "bf16": "#d62728", "bf16_weights": "#9467bd"}
    for j, (t, m) in enumerate((t, m) for t in trainers for m in ("mean_abs", "kl_k3")):
        vals = [(mm[st].get("trainers") or {}).get(t, {}).get("reduction_pct", {}).get(m, float("nan")) for st in states]
        cis = [(mm[st].get("trainers") or {}).get(t, {}).get("reduction_ci95", {}).get(m) for st in states]
        pos = [i + (j - len(trainers) + 0.5) * w for i in range(len(states))]
        err = [[v - c[0] if c else 0 for v, c in zip(vals, cis)], [c[1] - v if c else 0 for v, c in zip(vals, cis)]]
        ax.bar(pos, vals, w, yerr=err, capsize=2, color=colors.get(t), alpha=1.0 if m == "mean_abs" else 0.45,
               hatch="" if m == "mean_abs" else "..", label=f"{TRAINER_LABEL[t]}: {'|dlogp|' if m == 'mean_abs' else 'KL'}")
    if red:
        ax.axhline(red, color="black", ls="--", lw=1, label=f"published |dlogp| reduction ({red:.0f}%)")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(range(len(states)), [s.replace("_", " ").replace(", ", "\n") for s in states], fontsize=6)
    ax.set(title="R3's mismatch reduction by trainer precision\n(bf16 engine; bars: 95% bootstrap over rows)",
           ylabel="reduction with R3 (%)")
    if trainers:
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, framealpha=0.8)

    ax = axes[4]
    for schedule, s in (res.get("runs") or {}).items():
        for mode, color in (("off", "#7f7f7f"), ("on", "#d62728")):
            for i, run in enumerate(s[mode]):
                rew = run["reward"]
                smooth = [sum(rew[max(0, t - 4):t + 1]) / len(rew[max(0, t - 4):t + 1]) for t in range(len(rew))]
                ax.plot(range(len(rew)), rew, color=color, alpha=0.2, lw=0.8)
                ax.plot(range(len(rew)), smooth, color=color, ls="-" if schedule == "relax" else "--",
                        label=f"{schedule}{'' if schedule == 'relax' else ' (emulated)'} R3 {mode}" if i == 0 else None)
    ax.set(title="Reward (5-step mean, raw faint)", xlabel="training step", ylabel="mean reward of the step's samples")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    for a in axes:
        a.grid(alpha=0.3)
    fig.suptitle("Rollout Routing Replay (R3): tiny Qwen3-MoE, 2-core CPU (measured) beside 16xH800 (published)",
                 fontsize=10)
    fig.tight_layout()
    save(fig, path)
    return path


def draw_r3(results_root, figures_dir, tables_dir) -> list[Path]:
    """The R3 table (CSV + Markdown) and figure from `<results_root>/r3_moe/r3_results.json`."""
    src = Path(results_root) / "r3_moe" / RESULTS_FILE
    if not src.exists():
        return []
    res = json.loads(src.read_text())
    pub = published_r3()
    rows = r3_rows(res, pub)
    tables_dir, figures_dir = Path(tables_dir), Path(figures_dir)
    tables = write_table(rows, tables_dir, "r3_moe", "Rollout Routing Replay (R3): overhead and log-prob mismatch",
                         _note(res, pub), columns=["metric", "measured", "published", "unit", "how"])
    return [*tables, plot_r3(res, pub, figures_dir / "r3_moe.png")]
