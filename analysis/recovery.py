"""Recovery results of a run with injected faults, and of the recovery study: tables and figures.

    relax recovery RUN_DIR [RUN_DIR ...] [--out DIR]

Per fault (from `recovery.json` and `metrics.jsonl`):
  detect_s      fault -> the supervisor saw the process gone
  ready_s       fault -> the replacement answered (Tier 2: every role restarted)
  serving_s     a Rollout replica: fault -> the replacement (or the spare swapped in) put its first groups on
                the bus (the end of its first `generate` span after the fault, from trace.json)
  throughput_s  fault -> the end of the first step that starts a run of 3 steps whose mean step time is within
                1.25x the median step time before the fault ("back to the previous throughput"), and, for a
                Rollout replica, not before serving_s (every replica generating again); None if the run
                ended first
  boot          the replacement process's start-up phases (relax/fault/boot.py): Ray worker spawn, imports,
                DCS join, model build, ..., weight fetch
  dcs_s/bytes   the replacement's weight transfer from a live DCS peer (a new pair group included)
  wait_s        how long the replacement's start-up waited for its weights (boot phase `weight_fetch`): a
                DCS follower (an async Rollout replica) pulls them in the background from the moment it joins,
                while its model is built, so the transfer is mostly off the restart's critical path
  disk_s/bytes  reloading the same weights from the Actor's disk checkpoint in the same process (page cache
                warm: the file was just written), measured for comparison; disk_cold_s: a reload of the run's last
                checkpoint after evicting the file's pages (posix_fadvise), a read from the disk, measured by
                the driver at the end of the run (off the recovery path)
plus the run's samples lost / duplicated. Writes recovery_table.md and recovery.png next to the run (or --out).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from analysis.plot import save  # noqa: E402
from analysis.tables import write_csv
from relax.run_folder import RunFolder

SLOWER = 1.25  # steps within this factor of the pre-fault median count as "previous throughput"
WINDOW = 3  # ... over this many consecutive steps (single steps are noisy on a shared 2-core machine)


def load_run(run_dir: Path) -> tuple[list[dict], dict, dict]:
    run = RunFolder(run_dir)
    recovery = run.recovery()
    if recovery is None:
        raise FileNotFoundError(f"{run_dir}: no recovery.json (a run without injected faults?)")
    return run.metrics(), recovery, run.summary()


def first_generate_after(run_dir: Path, replica: int, t: float) -> float | None:
    """Run-clock end (s) of replica `replica`'s first `generate` span that ends after `t`."""
    ends = [(e["ts"] + e["dur"]) / 1e6 for e in RunFolder(run_dir).trace_events()
            if e.get("name") == "generate" and e.get("args", {}).get("replica") == replica]
    return min((x for x in ends if x > t), default=None)


def back_to_throughput(rows: list[dict], t_fault: float) -> float | None:
    before = [r["step_time_s"] for r in rows[1:] if r["wall_time_s"] < t_fault]  # step 0 includes the fill
    if not before:
        return None
    bar = SLOWER * statistics.median(before)
    after = [r for r in rows if r["wall_time_s"] > t_fault]
    for i in range(len(after) - WINDOW + 1):
        if statistics.mean(r["step_time_s"] for r in after[i : i + WINDOW]) <= bar:
            return after[i]["wall_time_s"] - t_fault
    return None


def table(run_dir: Path) -> list[dict]:
    rows, rec, summary = load_run(run_dir)
    out = []
    for ev in rec["events"]:
        if ev.get("t_fault") is None:
            continue
        throughput = back_to_throughput(rows, ev["t_fault"])
        serving = None
        if ev["role"] == "rollout" and ev.get("t_ready") is not None:
            spare = ev.get("replaced_by_spare")
            index = int(spare.rsplit("-", 1)[1]) if spare else ev["replica"]
            end = first_generate_after(run_dir, index, ev["t_ready"])
            serving = end - ev["t_fault"] if end is not None else None
            throughput = None if serving is None or throughput is None else max(throughput, serving)
        out.append({
            "run": run_dir.name, "role": ev["role"] + (f"-{ev['replica']}" if ev.get("replica") is not None else ""),
            "tier": ev["tier"], "at_step": ev.get("steps_done_at_detect"),
            "spare": ev.get("replaced_by_spare"),
            "detect_s": ev.get("detect_s"), "ready_s": ev.get("ready_s"), "serving_s": serving,
            "throughput_s": throughput, "boot": ev.get("boot"),
            "dcs_s": ev.get("dcs_seconds"), "wait_s": (ev.get("boot") or {}).get("weight_fetch"),
            "dcs_bytes": ev.get("dcs_bytes"), "dcs_from": ev.get("dcs_src"),
            "disk_s": ev.get("disk_seconds"), "disk_cold_s": ev.get("disk_cold_seconds"), "disk_bytes": ev.get("disk_bytes"),
            "rolled_back_versions": ev.get("rolled_back_versions"),
            "samples_lost": summary["samples_lost"], "samples_duplicated": summary["samples_duplicated"],
        })
    return out


def markdown(entries: list[dict]) -> str:
    cols = ["run", "role", "tier", "at_step", "spare", "detect_s", "ready_s", "serving_s", "throughput_s", "dcs_s",
            "wait_s", "dcs_bytes", "dcs_from",
            "disk_s", "disk_cold_s", "disk_bytes", "samples_lost", "samples_duplicated"]

    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(e.get(c)) for c in cols) + " |" for e in entries]
    return "\n".join(lines) + "\n"


def figure(run_dir: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, rec, _ = load_run(run_dir)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ends = [0.0] + [r["wall_time_s"] for r in rows]
    ax.step(ends, range(len(ends)), where="post", color="#333", lw=1.2, label="training steps done (slope: throughput)")
    ax.set_ylim(0, len(rows) * 1.08)
    colors = {1: "#d62728", 2: "#9467bd"}
    for ev in rec["events"]:
        if ev.get("t_fault") is None:
            continue
        c = colors.get(ev["tier"], "#777")
        name = ev["role"] + (f"-{ev['replica']}" if ev.get("replica") is not None else "")
        ax.axvline(ev["t_fault"], color=c, ls="--", lw=1)
        if ev.get("t_ready") is not None:
            ax.axvspan(ev["t_fault"], ev["t_ready"], color=c, alpha=0.12)
        ax.text(ev["t_fault"], ax.get_ylim()[1] * 0.98, f" kill {name} (tier {ev['tier']})", color=c, fontsize=8,
                va="top", rotation=90)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("training steps")
    ax.set_title(f"{run_dir.name}: throughput around injected kills (shaded: fault -> replacement ready)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, path, dpi=120)


def main(args) -> int:
    print(report_runs(args.runs, args.out), end="")
    return 0


def report_runs(runs: list[Path], out: Path | None = None) -> str:
    """The per-fault table of the runs (recovery_table.md) and a figure per run (recovery.png beside the run,
    or recovery-<run>.png in `out`); returns the table."""
    entries = []
    for run in runs:
        entries += table(run)
        dest = out or run
        dest.mkdir(parents=True, exist_ok=True)
        figure(run, dest / (f"recovery-{run.name}.png" if out else "recovery.png"))
    text = markdown(entries)
    (out or runs[0]).joinpath("recovery_table.md").write_text(text)
    return text


# ---- the recovery study's figure and tables (experiments/recovery/study.py; analysis/figures.py STUDIES) -----
STUDY_COLS = ["setting", "role", "tier", "spare", "detect_s", "ready_s", "serving_s", "throughput_s", "dcs_s",
              "wait_s", "dcs_bytes", "disk_s", "disk_cold_s", "disk_bytes", "samples_lost", "samples_duplicated"]
SETTINGS = ("spare", "cold")  # the study's fault runs (experiments/recovery/study.py)
NO_PAPER = "The Relax paper publishes no recovery timings: every number here is ours (CPU scale)."


def _study_rows(res: dict) -> list[dict]:
    return [r for k in SETTINGS if k in res for r in res[k]["rows"]]


def _bench_rows(res: dict) -> list[dict]:
    out = []
    for name, b in res.get("bench", {}).items():
        raw = b["raw_broadcast"]
        out.append({"bench": name, "payload_mb": b["payload_mb"], "what": "raw gloo broadcast (loopback)",
                    "gb_per_s": raw["gb_per_s"], "ms": 1000 * raw["best_s"], "vs_raw": 1.0, "load": b["load_before"]})
        for e in b["dcs"]:
            what = f"DCS, bucket {e['bucket_mb']:g} MB, groups {e.get('groups', 'reused')}"
            out.append({"bench": name, "payload_mb": b["payload_mb"], "what": what + ": transfer",
                        "gb_per_s": e["transfer_gb_per_s"], "ms": 1000 * e["best"]["transfer_s"],
                        "vs_raw": e["transfer_vs_raw"], "load": b["load_before"]})
            out.append({"bench": name, "payload_mb": b["payload_mb"], "what": what + ": sync incl. load",
                        "gb_per_s": e["sync_gb_per_s"], "ms": 1000 * e["best"]["sync_s"],
                        "vs_raw": e["sync_vs_raw"], "load": b["load_before"]})
        disk = b.get("disk_reload", {}).get("cold")
        if disk:
            s = disk["median_s"]
            out.append({"bench": name, "payload_mb": b["payload_mb"], "what": "disk reload (cold page cache)",
                        "gb_per_s": b["payload_mb"] * 2**20 / s / 1e9, "ms": 1000 * s,
                        "vs_raw": raw["best_s"] / s, "load": b["load_before"]})
    return out


def study_markdown(res: dict) -> str:
    def fmt(v):
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["# Recovery (relax study recovery)\n", NO_PAPER, "", "## Killed roles (seconds from the SIGKILL)", "",
             "| " + " | ".join(STUDY_COLS) + " |", "|" + "---|" * len(STUDY_COLS)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in STUDY_COLS) + " |" for r in _study_rows(res)]
    for k in SETTINGS:
        if k in res:
            x = res[k]
            lines.append(f"\n`{k}`: {x['run']}, overrides `{' '.join(x['overrides'])}`, {x['steps']} steps, "
                         f"lost {x['samples_lost']}, duplicated {x['samples_duplicated']}, "
                         f"load {x['load_before']} -> {x['load_after']}, {x['wall_s']} s")
    boots = [(r["setting"], r["role"], r["boot"]) for r in _study_rows(res) if r.get("boot")]
    if boots:
        lines += ["", "## Where a replacement's start-up goes (s)", ""]
        for setting, role, boot in boots:
            note = " (the spare's own start, before the fault: not on the recovery path)" if setting == "spare" \
                and role.startswith("rollout") else ""
            lines.append(f"- {setting} {role}{note}: " + ", ".join(f"{k} {v:.2f}" for k, v in boot.items()))
    bench = _bench_rows(res)
    if bench:
        lines += ["", "## Weight sync against the raw loopback broadcast (best of the repeats)", "",
                  "| payload MB | what | GB/s | ms | share of raw | load |", "|---|---|---|---|---|---|"]
        lines += [f"| {b['payload_mb']:g} | {b['what']} | {b['gb_per_s']:.2f} | {b['ms']:.1f} | "
                  f"{100 * b['vs_raw']:.0f}% | {b['load']} |" for b in bench]
        lines += [f"\ncommand: `{b['command']}`" for b in res["bench"].values()]
    el = res.get("elastic")
    if el and el.get("error"):
        lines += ["", f"## Elastic rollout: not complete ({el['error']})"]
    if el and el.get("phases"):
        lines += ["", "## Elastic rollout: phases of one live run", "",
                  "| phase | replicas | engines serving | groups | seconds | groups/s | groups by engine |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {p['phase']} | {p['replicas']} | {p['engines_serving']} | {p['groups']} | {p['seconds']:.1f} | "
                  f"{p['groups_per_s']:.2f} | {p['groups_by_engine']} |" for p in el["phases"]]
        lines += [f"- {o['kind']}: {o['status']} in {o['seconds']:.1f} s ({' > '.join(o['history'])})"
                  for o in el["operations"]]
        r = [p["groups_per_s"] for p in el["phases"]]
        if len(r) == 3 and min(r) > 0:
            lines.append(f"- rate with 2 replicas / with 1 before: {r[1] / r[0]:.2f}x, / with 1 after: {r[1] / r[2]:.2f}x. "
                         "It follows the replica count only where generation is the bottleneck and cores are free: "
                         f"on {res.get('cpus')} cores the replicas, the Actor and the Reference share the same CPUs, "
                         "so a second replica gains only what the other roles leave idle")
        lines.append(f"- lost {el['samples_lost']}, duplicated {el['samples_duplicated']}, load "
                     f"{el['load_before']} -> {el['load_after']}; command `relax {el['command'].removeprefix('-m relax.cli ')}`")
    return "\n".join(lines) + "\n"


def draw_recovery(source: Path, figs: Path, tables: Path) -> list[Path]:
    """recovery.png and recovery.{md,csv} from `<source>/recovery/recovery.json`; nothing when it is absent."""
    path = Path(source) / "recovery" / "recovery.json"
    if not path.exists():
        return []
    res = json.loads(path.read_text())
    figs.mkdir(parents=True, exist_ok=True)
    tables.mkdir(parents=True, exist_ok=True)
    rows = _study_rows(res)
    (tables / "recovery.md").write_text(study_markdown(res))
    write_csv(rows, tables / "recovery.csv", STUDY_COLS)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    labels = [f"{r['role']}\n{'spare' if r.get('spare') else ('tier 2' if r['tier'] == 2 else 'restart')}"
              f"\n({r['setting']} run)" for r in rows]
    keys = [("detect_s", "detect", "#1f77b4"), ("ready_s", "ready", "#ff7f0e"), ("serving_s", "serving (rollout)", "#2ca02c"),
            ("throughput_s", "back to throughput", "#d62728")]
    width = 0.2
    for j, (k, name, color) in enumerate(keys):
        xs = [i + (j - 1.5) * width for i in range(len(rows))]
        ax.bar(xs, [r.get(k) or 0 for r in rows], width, label=name, color=color)
    ax.axhline(15, color="#d62728", ls=":", lw=1)
    ax.text(len(rows) - 0.5, 15.3, "15 s target (rollout)", ha="right", fontsize=7, color="#d62728")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("seconds after the SIGKILL")
    lost = sum(res[k]["samples_lost"] for k in SETTINGS if k in res)
    dup = sum(res[k]["samples_duplicated"] for k in SETTINGS if k in res)
    ax.set_title(f"recovery per killed role (lost {lost}, duplicated {dup})", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")

    ax = axes[1]
    bench = [b for b in _bench_rows(res) if "sync incl" not in b["what"]]
    if bench:
        names = [f"{b['payload_mb']:g} MB: {b['what'].replace('DCS, ', '').replace(': transfer', '')}" for b in bench]
        colors = ["#555" if "raw" in b["what"] else "#8c564b" if "disk" in b["what"] else
                  "#9467bd" if "fresh" in b["what"] else "#17becf" for b in bench]
        ax.barh(range(len(bench)), [b["gb_per_s"] for b in bench], color=colors)
        for i, b in enumerate(bench):
            ax.text(b["gb_per_s"], i, f" {100 * b['vs_raw']:.0f}% of raw, {b['ms']:.1f} ms", va="center", fontsize=7)
        ax.set_yticks(range(len(bench)))
        ax.set_yticklabels(names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("GB/s (best of repeats)")
        ax.set_title("DCS weight transfer vs raw gloo loopback broadcast and disk", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    else:
        ax.axis("off")

    ax = axes[2]
    el = res.get("elastic")
    if el and el.get("phases"):
        phases = el["phases"]
        engines = sorted({e for p in phases for e in p["groups_by_engine"]})
        bottom = [0.0] * len(phases)
        for e, color in zip(engines, ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]):
            vals = [p["groups_by_engine"].get(e, 0) / p["seconds"] for p in phases]
            ax.bar(range(len(phases)), vals, bottom=bottom, label=e, color=color)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(phases)))
        ax.set_xticklabels([f"{p['phase']}\n({p['engines_serving']} serving)" for p in phases], fontsize=8)
        ax.set_ylabel("groups generated per second")
        ax.set_title("elastic rollout: scale out 1->2, scale in 2->1 (one live run)", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    else:
        ax.axis("off")
    loads = [x[k] for x in [res.get(s, {}) for s in (*SETTINGS, "elastic")] for k in ("load_before", "load_after") if k in x]
    load = f", 1-min load {min(loads):.0f}-{max(loads):.0f} (shared machine)" if loads else ""
    fig.suptitle(f"Fault recovery, DCS and elastic scaling (CPU scale, {res.get('cpus')} cores{load}). {NO_PAPER}",
                 fontsize=9)
    fig.tight_layout()
    out = figs / "recovery.png"
    save(fig, out)
    return [out, tables / "recovery.md", tables / "recovery.csv"]
