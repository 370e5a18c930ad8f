"""Third-party log lines that tell a sagevideo user nothing, kept off the console.

transformers and diffusers import torchao whenever it is installed (their quantizer registries,
`transformers.quantizers.quantizer_torchao`, `diffusers.quantizers.torchao`), so every command that
loads a model or a metric network imported it, and torchao's import logged its optional
extensions that do not load on this torch ("Failed to load …_C_mxfp8…"), torch logged torchao's
enum registrations ("register_constant() … deprecated"), and diffusers logged the torchao tensor
types it could not import. sagevideo itself imports torchao only to apply FP8 linears.

Each such record is dropped by a filter on the logger that emits it, matching its message: every
other record of those loggers, and every sagevideo warning, still shows. `install()` runs on
`import sagevideo`, before any of those libraries is imported.
"""

from __future__ import annotations

import logging

# emitting logger -> message fragments of the records dropped (only records of that very logger)
CHATTER: dict[str, tuple[str, ...]] = {
    "torchao": ("Failed to load ",),  # its optional C++/CUDA extensions, built for another torch or GPU
    "torch.utils._pytree": ("register_constant() on Enum subclasses is deprecated",),  # torchao's enums
    "diffusers.quantizers.torchao.torchao_quantizer": ("Unable to import `torchao` Tensor objects",),
}


class DropChatter(logging.Filter):
    """Drops the records whose message contains one of `fragments`."""

    def __init__(self, fragments: tuple[str, ...]):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not format is none of ours: let logging report it
            return True
        return not any(fragment in message for fragment in self.fragments)


def install() -> None:
    """Put a `DropChatter` on each logger of CHATTER (once; calling again adds nothing)."""
    for name, fragments in CHATTER.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropChatter) for f in logger.filters):
            logger.addFilter(DropChatter(fragments))
