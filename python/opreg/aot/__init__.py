"""Ahead-of-time compilation of Triton kernels for opreg's C++ launcher (``python -m opreg.aot``).

See :mod:`opreg.aot.compile` for the spec format. Build time only: nothing here runs when ops are
called.
"""
