"""`python -m opreg.aot SPEC --out DIR [--emit-cpp FILE]`: compile Triton kernels AOT."""

import sys

from opreg.aot.compile import main

sys.exit(main())
