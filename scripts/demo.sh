#!/usr/bin/env bash
# scripts/demo.sh: installs opreg and runs its demo (an op defined in C++ with fallback, kernels
# and fake, called on each available device, showing which implementation served each call).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
cd /tmp && python3 -m opreg demo
