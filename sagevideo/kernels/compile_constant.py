"""`constant_under_compile`: `torch.compiler.assume_constant_result` without importing Dynamo.

torch's decorator imports torch._dynamo (about a second on a 2-core CPU) to set one attribute on the
function. Modules that planning imports decorate at import (`kernels.plans`, `attention.sparse`), so
every `sagevideo` process paid that second, a Ray batch's driver that never compiles included.
tests/kernels/test_compile_constant.py checks that torch's decorator sets exactly this attribute and
that Dynamo then calls the function instead of tracing it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

DYNAMO_CONSTANT_ATTRIBUTE = "_dynamo_marked_constant"  # what torch._dynamo.decorators.assume_constant_result sets


def constant_under_compile(fn: F) -> F:
    """Mark `fn` as `torch.compiler.assume_constant_result` does: torch.compile calls it while tracing and
    keeps its result as a constant (it must not depend on anything that changes between calls)."""
    setattr(fn, DYNAMO_CONSTANT_ATTRIBUTE, True)
    return fn
