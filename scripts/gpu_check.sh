#!/usr/bin/env bash
# GPU checks for the cluster backends, on one GPU machine with PyTorch preinstalled and no network.
#   bash scripts/gpu_check.sh            (PY=/path/to/python chooses the interpreter)
# Runs the GPU tests under a 7.5-minute budget and prints a summary:
#   tests/trainers/test_megatron_convert_gpu.py (pytest -m gpu):
#   - CUDA weights -> HF names -> a CPU model (always, with CUDA)
#   - Megatron trainer step on tiny Qwen3 dense + MoE (log-probs equal transformers', a GRPO step moves them the
#     right way) and the single-GPU weight update path (trainer CUDA shard -> HF tensors -> our torch engine server
#     -> the same log-probs), when megatron-core is importable
#   - NVML device / process figures, when nvidia-ml-py is importable
#   - a real SGLang server on the GPU driven by our client (generate, pause, flush, update, continue), when sglang
#     is importable
#   tests/trainers/test_megatron_group_gpu.py (pytest -m gpu), when megatron-core is importable:
#   - the Megatron worker-group code at world size 1 (one GPU holds one rank): resources.actor.workers=1 builds a
#     MegatronGroup of one on NCCL; log-probs, loss, gradient norm, the shard gather into a transformers model and
#     the optimizer state wrapper checked against the torch trainer
#   - a `relax run` whose Actor (rank 0) is placed on the GPU through its placement group, trains over NCCL and
#     publishes through DCS, when the whole project environment is installed (Ray, TransferQueue, reasoning-gym;
#     not part of the wheel folder: skipped otherwise)
#   tests/metrics/test_gpu_metrics.py (NVML parsing and the CPU fallback; no GPU needed)
# Python packages the machine lacks are installed from a local wheel folder, never from the network: WHEELS=DIR,
# default ./wheels (`make gpu-wheels` fills it on a machine with network; copy it along with the repository). They
# go into a temporary --target folder on PYTHONPATH, so the machine's Python is left as it was.
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
OUT=$(mktemp -d)
WHEELS=${WHEELS:-$ROOT/wheels}
export PYTHONPATH="$ROOT:$OUT/site${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false PIP_NO_INDEX=1 PYTHONWARNINGS=ignore
T0=$(date +%s)
echo "== relax gpu_check: $(date -u +%FT%TZ) python=$PY"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"

probe() {  # module -> "yes"/"MISSING", one line each, plus torch's view of CUDA
  "$PY" - <<'PYEOF'
import importlib.util as u
import torch
print(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}")
for m in ["pytest", "pytest_timeout", "transformers", "tokenizers", "fastapi", "uvicorn", "httpx", "safetensors",
          "pydantic", "yaml", "tabulate", "psutil", "megatron.core", "pynvml", "transformer_engine", "sglang",
          "ray", "transfer_queue", "reasoning_gym"]:
    try:
        ok = u.find_spec(m) is not None
    except ModuleNotFoundError:
        ok = False
    print(f"  {m:18s} {'yes' if ok else 'MISSING'}")
PYEOF
}
probe > "$OUT/env.txt" || { cat "$OUT/env.txt"; echo "RESULT: $PY cannot import torch"; exit 3; }
if grep -q "cuda available: False" "$OUT/env.txt" && [[ -z "${RELAX_GPU_CHECK_ALLOW_CPU:-}" ]]; then
  cat "$OUT/env.txt"
  echo "RESULT: no CUDA device visible; nothing to check (RELAX_GPU_CHECK_ALLOW_CPU=1 runs the suite anyway: GPU tests skip)"
  exit 2
fi
# module name -> pip requirement (pinned as in pyproject.toml)
declare -A REQ=([pytest]=pytest==9.2.0 [pytest_timeout]=pytest-timeout==2.4.0 [transformers]=transformers==5.23.0
  [tokenizers]=tokenizers==0.23.3 [fastapi]=fastapi==0.165.0 [uvicorn]=uvicorn==0.54.0 [httpx]=httpx==0.28.1
  [safetensors]=safetensors==0.8.0 [pydantic]=pydantic==2.14.3 [yaml]=pyyaml==6.0.4 [tabulate]=tabulate==0.9.0
  [psutil]=psutil==7.2.2 [megatron.core]=megatron-core==0.16.0 [pynvml]=nvidia-ml-py==13.615.71)
want=()
for m in "${!REQ[@]}"; do grep -qE "^  $m +MISSING" "$OUT/env.txt" && want+=("${REQ[$m]}"); done
if [[ ${#want[@]} -gt 0 && -d "$WHEELS" ]]; then
  echo "installing from $WHEELS into $OUT/site: ${want[*]}"
  # megatron-core declares torch>=2.6: installed without dependencies so the machine's torch is used as it is
  nodeps=(); deps=()
  for r in "${want[@]}"; do [[ $r == megatron-core* ]] && nodeps+=("$r") || deps+=("$r"); done
  [[ ${#deps[@]} -gt 0 ]] && "$PY" -m pip install -q --no-index --find-links "$WHEELS" --target "$OUT/site" "${deps[@]}"
  [[ ${#nodeps[@]} -gt 0 ]] && "$PY" -m pip install -q --no-index --find-links "$WHEELS" --target "$OUT/site" --no-deps "${nodeps[@]}"
  probe > "$OUT/env.txt"
fi
cat "$OUT/env.txt"
missing=$(grep -E "^  (pytest|transformers|tokenizers|fastapi|uvicorn|httpx|safetensors|pydantic|yaml|tabulate|psutil) +MISSING" "$OUT/env.txt" || true)
if [[ -n "$missing" ]]; then
  echo "RESULT: required Python packages are missing (no network here: WHEELS=DIR with their wheels, see make gpu-wheels):"
  echo "$missing"; exit 3
fi
"$PY" - <<'PYEOF'
from relax.metrics.gpu import device_metrics
m = device_metrics()
print("device metrics:", {k: v for k, v in m.items() if k not in ("gpus", "cpu_util_pct_per_core")})
PYEOF
TIMEOUT_OPT=()
grep -qE "^  pytest_timeout +yes" "$OUT/env.txt" && TIMEOUT_OPT=(--timeout=420)
timeout 450 "$PY" -m pytest -p no:cacheprovider -q -rs "${TIMEOUT_OPT[@]}" --junitxml="$OUT/junit.xml" \
  tests/trainers/test_megatron_convert_gpu.py tests/trainers/test_megatron_group_gpu.py tests/metrics/test_gpu_metrics.py 2>&1 | tee "$OUT/pytest.txt"
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
counts = {}
for case in root.iter("testcase"):
    status = "passed"
    for tag in ("failure", "error", "skipped"):
        el = case.find(tag)
        if el is not None:
            status = f"{tag}: {(el.get('message') or '')[:90]}"
    counts[status.split(":")[0]] = counts.get(status.split(":")[0], 0) + 1
    print(f"  {case.get('name'):64s} {float(case.get('time', 0)):6.1f}s  {status}")
print("RESULT: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
PYEOF
rm -rf "$OUT/site"
exit $rc
