"""sagevideo: fast long-sequence video diffusion with SageAttention-style quantized attention.

The public surface is small and imported lazily: `import sagevideo` loads neither triton,
diffusers, torchao nor ray. Heavy modules load on first use of the name that needs them. Third-party
log lines that tell a user nothing (torchao's, when transformers or diffusers import it) are kept
off the console (`sagevideo.quiet`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sagevideo import quiet
from sagevideo.version import __version__

quiet.install()  # before transformers or diffusers import torchao and it logs its extensions (sagevideo.quiet)

# public name -> module that defines it
_LAZY = {
    "sageattn": "sagevideo.attention.functional",
    "scaled_dot_product_attention": "sagevideo.attention.functional",
    "record_backends": "sagevideo.attention.records",
    "last_backend": "sagevideo.attention.records",
    "generate": "sagevideo.generation.generate",
    "GenerateConfig": "sagevideo.jobs.config",
    "Recipe": "sagevideo.jobs.recipe",
    "calibrate": "sagevideo.experiments.calibrate",
    "install": "sagevideo.pipelines.install",
}

__all__ = ["GenerateConfig", "Recipe", "__version__", "calibrate", "generate", "install", "last_backend",
           "record_backends",
           "sageattn", "scaled_dot_product_attention"]

if TYPE_CHECKING:  # pragma: no cover
    from sagevideo.attention.functional import sageattn, scaled_dot_product_attention
    from sagevideo.attention.records import last_backend, record_backends
    from sagevideo.experiments.calibrate import calibrate
    from sagevideo.generation.generate import generate
    from sagevideo.jobs.config import GenerateConfig
    from sagevideo.jobs.recipe import Recipe
    from sagevideo.pipelines.install import install


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sagevideo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
