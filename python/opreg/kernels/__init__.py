"""Triton kernels of opreg's shipped ops. Compiled ahead of time at build time (kernels.toml);
the same functions also run through Triton's JIT or interpreter, e.g. in tests."""
