#!/usr/bin/env bash
# The prepared GPU check, under 8 minutes on one H100-class GPU: the driver first, then
# the default study on CUDA in bfloat16 (tiny model), its timed pass and NVML telemetry,
# written to one JSON (at every step, so a failure or an overrun still reports what was
# measured and the log's tail), then BENCHMARKS.md re-rendered with the GPU named.
#   bash benchmarks/gpu_check.sh [OUT.json]      (default: $OUT/gpu_check.json when $OUT is
#                                                 set, else benchmarks/gpu_check.json)
# PYTHON names the interpreter (default .venv/bin/python); it needs a CUDA build of torch,
# and that build needs a driver new enough for its CUDA (CUDA 13 wheels: R580 or newer).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
out="${1:-${OUT:+$OUT/gpu_check.json}}"
out="${out:-$root/benchmarks/gpu_check.json}"
if ! nvidia-smi --query-gpu=name,driver_version,mig.mode.current,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
     --format=csv; then
  echo "gpu_check: nvidia-smi failed: no NVIDIA driver loaded here (or no GPU); torch $("$py" -c \
'import torch; print(torch.__version__, "built for CUDA", torch.version.cuda)' 2>/dev/null) needs one" >&2
fi
timeout 470 "$py" "$root/benchmarks/gpu_check.py" --out "$out" --timeout 420
rc=$?
[ "$rc" -eq 124 ] && echo "gpu_check: gpu_check.py overran 470 s; $out holds what it had written" >&2
if [ -s "$out" ]; then
  md="${OUT:+$OUT/BENCHMARKS.md}"  # on a lent machine the report comes back beside the JSON
  "$py" "$root/benchmarks/render.py" --gpu "$out" --out "${md:-$root/BENCHMARKS.md}"
  echo "figures: $out"
fi
exit "$rc"
