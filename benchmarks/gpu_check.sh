#!/usr/bin/env bash
# The prepared GPU check, under 8 minutes (480 s, kill grace included) on one H100-class GPU:
# the driver first, then the default study on CUDA in bfloat16 (tiny model), its timed pass
# and NVML telemetry, written to one JSON (at every step, so a failure or an overrun still
# reports what was measured, the log's tail and the rules' logs), then BENCHMARKS.md
# re-rendered with the GPU named.
#   bash benchmarks/gpu_check.sh [OUT.json]      (default: $OUT/gpu_check.json when $OUT is
#                                                 set, else benchmarks/gpu_check.json)
# Beside OUT.json: OUT.fork.json (whether a forked worker can use CUDA: fork_cuda_probe.py),
# OUT.snakemake.log (the study's Snakemake log) and OUT_logs/ (the rules' logs). PYTHON names the interpreter (default .venv/bin/python); it needs a CUDA build of
# torch, and that build needs a driver new enough for its CUDA (CUDA 13 wheels: R580 or newer).
set -uo pipefail
start=$(date +%s)
budget=480   # seconds for the whole check: nvidia-smi, gpu_check.py with its kill grace, the render
grace=10     # after gpu_check.py's SIGTERM (it kills the study and writes the JSON), SIGKILL
render=10    # kept for the render at the end
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
out="${1:-${OUT:+$OUT/gpu_check.json}}"
out="${out:-$root/benchmarks/gpu_check.json}"
if ! timeout 20 nvidia-smi --query-gpu=name,driver_version,mig.mode.current,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
     --format=csv; then
  echo "gpu_check: nvidia-smi failed or hung: no NVIDIA driver loaded here (or no GPU); torch $(timeout 20 "$py" -c \
'import torch; print(torch.__version__, "built for CUDA", torch.version.cuda)' 2>/dev/null) needs one" >&2
fi
# Can a worker forked from the preloaded fork server use CUDA? (fleet.worker_start: auto spawns on
# GPU jobs until this says yes; fork_cuda_probe.py). At most 60 s, taken from the study's time.
timeout -k 5 60 "$py" "$root/benchmarks/fork_cuda_probe.py" --out "${out%.json}.fork.json" \
  || echo "gpu_check: the fork probe failed or hung (exit $?); see ${out%.json}.fork.json if written" >&2
limit=$(( start + budget - grace - render - $(date +%s) ))
# gpu_check.py's own deadline: the study's timeout is what is left before it (less its reserve for writing)
timeout -k "$grace" "$limit" "$py" "$root/benchmarks/gpu_check.py" --out "$out" --deadline "$(( start + budget - grace - render - 10 ))"
rc=$?
[ "$rc" -eq 124 ] && echo "gpu_check: gpu_check.py stopped at the outer limit ($limit s); $out holds what it had written" >&2
[ "$rc" -eq 137 ] && echo "gpu_check: gpu_check.py was killed ${grace} s after the outer limit; $out holds what it had written" >&2
if [ -s "$out" ]; then
  md="${OUT:+$OUT/BENCHMARKS.md}"  # on a lent machine the report comes back beside the JSON
  timeout "$render" "$py" "$root/benchmarks/render.py" --gpu "$out" --out "${md:-$root/BENCHMARKS.md}"
  echo "figures: $out"
fi
exit "$rc"
