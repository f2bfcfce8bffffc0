#!/usr/bin/env bash
# The prepared GPU check, under 8 minutes on one GPU: the default study on CUDA in
# bfloat16 (tiny model), its timed pass and NVML telemetry, written to one JSON, then
# BENCHMARKS.md re-rendered with the GPU named.
#   bash benchmarks/gpu_check.sh [OUT.json]      (default: $OUT/gpu_check.json when $OUT is
#                                                 set, else benchmarks/gpu_check.json)
# PYTHON names the interpreter (default .venv/bin/python); it needs a CUDA build of torch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
out="${1:-${OUT:+$OUT/gpu_check.json}}"
out="${out:-$root/benchmarks/gpu_check.json}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active \
  --format=csv || echo "nvidia-smi unavailable; NVML figures come from nvidia-ml-py"
timeout 470 "$py" "$root/benchmarks/gpu_check.py" --out "$out" --timeout 420
md="${OUT:+$OUT/BENCHMARKS.md}"  # on a lent machine the report comes back beside the JSON
"$py" "$root/benchmarks/render.py" --gpu "$out" --out "${md:-$root/BENCHMARKS.md}"
echo "figures: $out"
