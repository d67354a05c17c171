"""Device monitoring for the per-step metrics: NVIDIA GPUs through NVML (package nvidia-ml-py, module `pynvml`)
when a driver answers, psutil CPU figures otherwise.

    from relax.metrics.gpu import device_metrics, process_metrics
    record.update(device_metrics())             # controller, once per step: the whole machine
    record["busy_mem"] = process_metrics()      # inside a role (Ray actor): what this process holds

`device_metrics()` returns flat keys (`device`, `gpu_count`, `gpu_util_pct_mean`, `gpu_mem_used_mb`,
`gpu_mem_total_mb`, `gpu_power_w`, plus `gpus`: one dict per device) or, without GPUs, `device: "cpu"`,
`cpu_util_pct`, `cpu_util_pct_per_core`, `mem_used_mb`, `mem_total_mb`. Never raises: a failing NVML falls
back to the CPU figures and says why in `device_note`.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_nvml = None  # the pynvml module once initialised, False when unavailable
_nvml_note = ""


def _init_nvml():
    global _nvml, _nvml_note
    with _lock:
        if _nvml is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                _nvml = pynvml
            except Exception as e:  # noqa: BLE001 - no package, no driver, no device: all mean "use psutil"
                _nvml, _nvml_note = False, f"NVML unavailable ({type(e).__name__}: {e})"[:200]
    return _nvml or None


def reset() -> None:
    """Forget the NVML state (tests, or after a driver comes up)."""
    global _nvml, _nvml_note
    with _lock:
        _nvml, _nvml_note = None, ""


def _gpu(nv, i: int) -> dict:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    util = nv.nvmlDeviceGetUtilizationRates(h)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    name = nv.nvmlDeviceGetName(h)
    try:
        power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # mW -> W
    except Exception:  # noqa: BLE001 - some boards do not report power
        power = None
    return {"index": i, "name": name.decode() if isinstance(name, bytes) else str(name), "util_pct": float(util.gpu),
            "mem_util_pct": float(util.memory), "mem_used_mb": mem.used / 2**20, "mem_total_mb": mem.total / 2**20,
            "power_w": power}


def gpu_stats() -> list[dict]:
    nv = _init_nvml()
    if nv is None:
        return []
    return [_gpu(nv, i) for i in range(nv.nvmlDeviceGetCount())]


def cpu_stats() -> dict:
    import psutil

    per_core = psutil.cpu_percent(interval=None, percpu=True)
    vm = psutil.virtual_memory()
    return {"device": "cpu", "cpu_util_pct": sum(per_core) / max(len(per_core), 1), "cpu_util_pct_per_core": per_core,
            "mem_used_mb": (vm.total - vm.available) / 2**20, "mem_total_mb": vm.total / 2**20}


def device_metrics() -> dict:
    """Machine-wide figures for one step (utilisation since the previous call for the CPU figures)."""
    try:
        gpus = gpu_stats()
    except Exception as e:  # noqa: BLE001
        gpus, note = [], f"NVML query failed ({type(e).__name__}: {e})"[:200]
    else:
        note = _nvml_note
    if not gpus:
        out = cpu_stats()
        if note:
            out["device_note"] = note
        return out
    powers = [g["power_w"] for g in gpus if g["power_w"] is not None]
    return {"device": "gpu", "gpu_count": len(gpus),
            "gpu_util_pct_mean": sum(g["util_pct"] for g in gpus) / len(gpus),
            "gpu_mem_used_mb": sum(g["mem_used_mb"] for g in gpus),
            "gpu_mem_total_mb": sum(g["mem_total_mb"] for g in gpus),
            "gpu_power_w": sum(powers) if powers else None, "gpus": gpus}


def process_metrics(pid: int | None = None) -> dict:
    """One process (a role): its GPU memory per device (NVML) and its CPU share and RSS (psutil)."""
    import psutil

    pid = pid or os.getpid()
    proc = psutil.Process(pid)
    out = {"pid": pid, "cpu_pct": proc.cpu_percent(interval=None), "rss_mb": proc.memory_info().rss / 2**20}
    nv = _init_nvml()
    if nv is not None:
        used = {}
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.pid == pid and p.usedGpuMemory is not None:
                        used[i] = used.get(i, 0.0) + p.usedGpuMemory / 2**20
        except Exception:  # noqa: BLE001
            pass
        out["gpu_mem_mb"] = used
    return out


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; platform.processor() elsewhere)."""
    import platform

    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def hardware_description(emulated: str | None = None) -> str:
    """What ran (summary.json `environment.hardware`): the GPUs NVML sees (count x model), else the CPU;
    `emulated`: the hardware an emulated run stands in for, said beside what really ran."""
    try:
        gpus = gpu_stats()
    except Exception:  # noqa: BLE001 - a failing NVML means: describe the CPU
        gpus = []
    names = sorted({g["name"] for g in gpus})
    real = (f"{len(gpus)}x {', '.join(names)}" if gpus else
            f"{os.cpu_count()}-core CPU ({cpu_model()}), no GPU")
    return f"EMULATED {emulated} on {real}" if emulated else real
