#!/usr/bin/env bash
# GPU checks for the cluster backends, on one GPU machine with PyTorch preinstalled and no network.
#   bash scripts/gpu_check.sh            (PY=/path/to/python to choose the interpreter)
# Runs `pytest -m gpu` under a 7.5-minute budget and prints a summary:
#   - CUDA weights -> HF names -> a CPU model (always, with CUDA)
#   - Megatron trainer step on tiny Qwen3 dense + MoE, and the single-GPU weight update path (trainer CUDA shard ->
#     HF tensors -> our torch engine server -> same log-probs), when megatron-core is importable
#   - a real SGLang server on the GPU driven by our client (generate, pause, flush, update, continue), when sglang
#     is importable
# Relax's own Python dependencies (transformers, fastapi, uvicorn, httpx, safetensors, pydantic, pyyaml, tabulate,
# psutil) must be importable; the script says which are missing instead of trying the network.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
if [[ -z "${PY:-}" ]]; then
  if [[ -x .venv/bin/python ]] && .venv/bin/python -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    PY=.venv/bin/python
  else
    PY=python3
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
export TOKENIZERS_PARALLELISM=false
OUT=$(mktemp -d)
T0=$(date +%s)
echo "== relax gpu_check: $(date -u +%FT%TZ) python=$PY"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
"$PY" - <<'PYEOF' | tee "$OUT/env.txt"
import importlib.util as u
import torch
print(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}")
for m in ["pytest_timeout", "transformers", "fastapi", "uvicorn", "httpx", "safetensors", "pydantic", "yaml", "tabulate", "psutil",
          "pytest", "megatron.core", "transformer_engine", "sglang", "pynvml"]:
    try:
        ok = u.find_spec(m) is not None
    except ModuleNotFoundError:
        ok = False
    print(f"  {m:18s} {'yes' if ok else 'MISSING'}")
PYEOF
if [[ ${PIPESTATUS[0]} -ne 0 ]]; then
  echo "RESULT: $PY cannot import torch"; exit 3
fi
if grep -q "cuda available: False" "$OUT/env.txt" && [[ -z "${RELAX_GPU_CHECK_ALLOW_CPU:-}" ]]; then
  echo "RESULT: no CUDA device visible; nothing to check (RELAX_GPU_CHECK_ALLOW_CPU=1 runs the suite anyway: all skip)"
  exit 2
fi
missing=$(grep -E "^  (transformers|fastapi|uvicorn|httpx|safetensors|pydantic|yaml|tabulate|psutil|pytest) +MISSING" "$OUT/env.txt" || true)
if [[ -n "$missing" ]]; then
  echo "RESULT: required Python packages are missing (install them from a wheelhouse, no network here):"
  echo "$missing"; exit 3
fi
"$PY" - <<'PYEOF'
from relax.metrics.gpu import device_metrics
m = device_metrics()
print("device metrics:", {k: v for k, v in m.items() if k != "gpus"})
PYEOF
TIMEOUT_OPT=()
grep -qE "^  pytest_timeout +yes" "$OUT/env.txt" && TIMEOUT_OPT=(--timeout=420)
timeout 450 "$PY" -m pytest -m gpu -p no:cacheprovider -q -rs "${TIMEOUT_OPT[@]}" \
  --junitxml="$OUT/junit.xml" tests/test_megatron_convert_gpu.py 2>&1 | tee "$OUT/pytest.txt"
rc=${PIPESTATUS[0]}
T1=$(date +%s)
echo
echo "== summary ($((T1 - T0)) s, pytest exit $rc)"
"$PY" - "$OUT/junit.xml" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception as e:
    print(f"no test report ({e})"); sys.exit(0)
for case in root.iter("testcase"):
    status = "passed"
    for tag in ("failure", "error", "skipped"):
        el = case.find(tag)
        if el is not None:
            status = f"{tag}: {(el.get('message') or '')[:100]}"
    print(f"  {case.get('name'):70s} {float(case.get('time', 0)):6.1f}s  {status}")
PYEOF
exit $rc
