#!/usr/bin/env bash
# Create .venv (if missing) and install PairFlow into it. `bash workflow/setup.sh test`
# also installs the test tools. Idempotent: a second run only checks.
# Every package comes at the exact version of envs/requirements.lock (pip constraints,
# compiled from pyproject.toml by workflow/checks/lock.py), whatever was released since.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=""
[ "${1:-}" = "test" ] && extra="[test]"
lock=envs/requirements.lock
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
# torch first, pinned: on this workplace's machines both come from local disk; a cluster
# user with their own CUDA build can skip this line (pyproject accepts torch>=2.4).
.venv/bin/pip install -q -c "$lock" torch==2.14.1 torchvision==0.29.1
.venv/bin/pip install -q -c "$lock" -e ".${extra}"
.venv/bin/python -c "import torch; print('pairflow setup: torch', torch.__version__)"
