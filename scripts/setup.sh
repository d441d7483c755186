#!/usr/bin/env bash
# scripts/setup.sh: installs what building and testing opreg needs on a fresh Debian machine
# (system packages by name, PyTorch and Triton by exact version), then opreg itself, built
# against the installed torch (no build isolation). Sourced by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq cmake ninja-build g++ libgtest-dev nlohmann-json3-dev >/dev/null
fi
python3 -m pip install -q torch==2.13.0 triton==3.6.0 numpy scikit-build-core pytest \
  pytest-xdist ruff clang-format
python3 -m pip install -q --no-build-isolation .
