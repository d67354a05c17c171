"""Device metrics: psutil figures on CPU, NVML figures (here from a fake pynvml) when GPUs answer."""

import os
import sys
import types

import pytest

from relax.metrics import gpu


@pytest.fixture(autouse=True)
def _fresh():
    gpu.reset()
    yield
    gpu.reset()


def test_cpu_fallback_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails, as on a machine without the package
    m = gpu.device_metrics()
    assert m["device"] == "cpu" and "NVML unavailable" in m["device_note"]
    assert 0 <= m["cpu_util_pct"] <= 100 and len(m["cpu_util_pct_per_core"]) >= 1
    assert 0 < m["mem_used_mb"] <= m["mem_total_mb"]
    p = gpu.process_metrics()
    assert p["rss_mb"] > 10 and "gpu_mem_mb" not in p
    # summary.json's environment.hardware: the CPU that ran, and an emulation says what it stands in for
    assert gpu.hardware_description().startswith(f"{os.cpu_count()}-core CPU (") and "no GPU" in gpu.hardware_description()
    assert gpu.hardware_description("16x H800").startswith("EMULATED 16x H800 on ")


def test_nvml_figures_per_device(monkeypatch):
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=40 + 20 * h, memory=10),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=(h + 1) * 2**30, total=80 * 2**30),
        nvmlDeviceGetName=lambda h: b"NVIDIA H800",
        nvmlDeviceGetPowerUsage=lambda h: 300_000 + 1000 * h,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=4242, usedGpuMemory=512 * 2**20)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    m = gpu.device_metrics()
    assert m["device"] == "gpu" and m["gpu_count"] == 2 and m["gpus"][1]["name"] == "NVIDIA H800"
    assert m["gpu_util_pct_mean"] == 50.0 and m["gpu_mem_used_mb"] == 3 * 1024 and m["gpu_power_w"] == 601.0
    assert gpu.hardware_description() == "2x NVIDIA H800"
    monkeypatch.setattr(fake, "nvmlDeviceGetComputeRunningProcesses",
                        lambda h: [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=512 * 2**20)])
    assert gpu.process_metrics()["gpu_mem_mb"] == {0: 512.0, 1: 512.0}
