"""Installs evox_opreg_switch in every Python process started with this folder on PYTHONPATH and
``EVOX_OPREG_SWITCH=1``, so EvoX's tests and the processes they spawn (``torch.multiprocessing``)
all import EvoX with opreg's modules. Then runs the ``sitecustomize`` this one shadows, if any."""

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("EVOX_OPREG_SWITCH") == "1":
    import evox_opreg_switch

    evox_opreg_switch.install()


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_run_shadowed_sitecustomize()
