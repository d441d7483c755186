"""Makes Triton's interpreter run opreg's Philox kernels on the CPU: import before launching.

The kernels' three PTX instructions (mul.rn/add.rn/sub.rn.f32) get their IEEE meaning (numpy
float32 rounds each operation on its own, as they do), and scalar arguments, which Triton 3.6's
interpreter holds as 1-element arrays, become usable as loop bounds under numpy 2."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
from triton.runtime import interpreter

PTX = {"mul.rn.f32": np.multiply, "add.rn.f32": np.add, "sub.rn.f32": np.subtract}


class _Result:
    def __init__(self, handle):
        self.handle = handle

    def get_result(self, index):
        return self.handle


def _inline_asm(self, asm, constraints, values, type, is_pure, pack):
    data = PTX[asm.split()[0]](values[0].data, values[1].data).astype(np.float32)
    return _Result(interpreter.TensorHandle(data, values[0].dtype.scalar))


_patch_tensor = interpreter._patch_lang_tensor


def _patch_lang_tensor(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


interpreter.InterpreterBuilder.create_inline_asm = _inline_asm
interpreter._patch_lang_tensor = _patch_lang_tensor
