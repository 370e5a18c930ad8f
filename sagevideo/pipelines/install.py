"""Install sagevideo's attention into a diffusers CogVideoX transformer, and undo it.

`install(pipe_or_transformer)` swaps every `CogVideoXAttnProcessor2_0` for a
`SageCogVideoXAttnProcessor` through diffusers' own `attn_processors`/`set_attn_processor`,
and returns a handle whose `remove()` puts the original processor objects back (outputs are
then bit-identical to never having installed). Installing twice is an error, not a double wrap.
"""

from __future__ import annotations

from typing import Any

from sagevideo.pipelines.cogvideox import SageCogVideoXAttnProcessor

_HANDLE_ATTR = "_sagevideo_attention"


class InstalledAttention:
    """What `install` did to one transformer; `remove()` (or leaving a `with` block) undoes it.

    processors: name -> installed processor; originals: name -> processor it replaced.
    """

    def __init__(self, transformer: Any, originals: dict[str, Any], processors: dict[str, Any]):
        self.transformer = transformer
        self.originals = originals
        self.processors = processors
        self.removed = False

    @property
    def layers(self) -> list[str]:
        return list(self.processors)

    def remove(self) -> None:
        """Restore the original processors. A second call does nothing."""
        if self.removed:
            return
        current = self.transformer.attn_processors
        replaced = [name for name, proc in self.processors.items() if current.get(name) is not proc]
        if replaced or set(current) != set(self.processors):
            # e.g. fuse_qkv_projections() reinstalled stock processors: restoring ours' originals
            # on top would silently undo the user's change.
            raise RuntimeError(
                f"sagevideo: the attention processors were replaced after install (e.g. "
                f"{(replaced or sorted(set(current) ^ set(self.processors)))[0]}); not restoring"
            )
        self.transformer.set_attn_processor(dict(self.originals))
        delattr(self.transformer, _HANDLE_ATTR)
        self.removed = True

    def __enter__(self) -> InstalledAttention:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self.removed else f"{len(self.processors)} layers"
        return f"<InstalledAttention {type(self.transformer).__name__}: {state}>"


def install(pipe_or_transformer: Any, *, pv: str = "fp16", backend: str = "auto") -> InstalledAttention:
    """Route every attention layer of a CogVideoX transformer through `sagevideo.sageattn`.

    pipe_or_transformer: a pipeline with a `.transformer`, or the transformer itself.
    pv, backend: passed to `sageattn` by every layer (see its docstring).
    Raises RuntimeError when already installed, TypeError for unsupported models.
    """
    from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

    transformer = getattr(pipe_or_transformer, "transformer", pipe_or_transformer)
    if not hasattr(transformer, "attn_processors") or not hasattr(transformer, "set_attn_processor"):
        raise TypeError(
            f"sagevideo.install: {type(pipe_or_transformer).__name__} is neither a diffusers pipeline with a "
            "transformer nor a diffusers transformer with attention processors"
        )
    if getattr(transformer, _HANDLE_ATTR, None) is not None:
        raise RuntimeError(
            "sagevideo.install: sagevideo attention is already installed on this transformer; "
            "call .remove() on the handle install() returned before installing again"
        )
    originals = transformer.attn_processors
    for name, proc in originals.items():
        if isinstance(proc, SageCogVideoXAttnProcessor):
            raise RuntimeError(
                f"sagevideo.install: {name} already runs sagevideo attention; not wrapping twice"
            )
        if type(proc) is not CogVideoXAttnProcessor2_0:
            raise TypeError(
                f"sagevideo.install: {name} uses {type(proc).__name__}; sagevideo replaces "
                "CogVideoXAttnProcessor2_0 only "
                "(after fuse_qkv_projections(), call unfuse_qkv_projections() first)"
            )
    if not originals:
        raise TypeError(f"sagevideo.install: {type(transformer).__name__} has no attention processors")
    processors = {
        name: SageCogVideoXAttnProcessor(pv=pv, backend=backend, name=name.removesuffix(".processor"))
        for name in originals
    }
    transformer.set_attn_processor(dict(processors))
    handle = InstalledAttention(transformer, originals, processors)
    setattr(transformer, _HANDLE_ATTR, handle)
    return handle
