"""What a family's `shard_*` may split: exactly the transformer and attention-processor classes its
Ulysses hooks were written for, checked before anything is installed and before any rank communicates
(`shard_targets`); then the frame every `shard_*` shares: the heads' degree check (`ulysses_rank`)
and the install of its router and hooks, undone whole if a step fails (`install_sharded`).

Why exact classes, not isinstance: diffusers' derivatives of a supported transformer (ChronoEdit and
SkyReels-V2 copy Wan's with attention classes of their own, VACE adds control blocks with inputs of
their own) install and run on one process, but a family's hooks would leave their attention
unexchanged or their extra inputs unsplit: each rank would attend within its own tokens and return
a wrong prediction without an error, or fail with a shape error deep in the forward.
"""

from __future__ import annotations

from typing import Any


def _name(cls: type) -> str:
    return f"{cls.__name__} (from {cls.__module__})"


def shard_targets(function: str, pipe_or_transformer: Any, transformers: tuple[type, ...],
                  processors: tuple[type, ...], *, several: bool = False, known: str = "") -> list[Any]:
    """The denoisers `function` ("shard_wan") splits, `transformer` first (one module held under two
    names counted once): each exactly of a class in `transformers`, with every attention processor
    exactly of a class in `processors`. several: whether it splits more than one (Wan 2.2's
    `transformer_2`). known: what the refusal adds about related models it does not split.

    Raises TypeError naming what is supported, before anything changes.
    """
    from sagevideo.pipelines.install import denoisers_of

    found = denoisers_of(pipe_or_transformer)
    unique: dict[int, tuple[str, Any]] = {}
    for component, transformer in found.items():
        unique.setdefault(id(transformer), (component, transformer))
    supported = " or ".join(cls.__name__ for cls in transformers)
    fix = "run it unsplit on one process with sagevideo.install(...)"
    if len(unique) > 1 and not several:
        raise TypeError(
            f"{function}: {type(pipe_or_transformer).__name__} holds {len(unique)} denoisers "
            f"({', '.join(c for c, _ in unique.values())}); {function} splits one {supported}: pass it alone"
        )
    for component, transformer in unique.values():
        where = "the transformer" if transformer is pipe_or_transformer else component
        cls = type(transformer)
        if cls not in transformers:
            raise TypeError(
                f"{function}: {where} is a {_name(cls)}; {function} splits {supported} only{known}: its hooks "
                f"split exactly those models' tokens and attention, and another class, even one derived from them, "
                f"would attend within each rank's own tokens; {fix}"
            )
        prefix = "" if component == "transformer" else f"{component}."
        for key, processor in transformer.attn_processors.items():
            if type(processor) not in processors:
                allowed = ", ".join(p.__name__ for p in processors)
                raise TypeError(
                    f"{function}: {prefix}{key.removesuffix('.processor')} runs {_name(type(processor))}; "
                    f"{function} splits layers running diffusers' {allowed} only (another processor's attention "
                    f"is not exchanged between ranks); restore the stock processors, or {fix}"
                )
    return [transformer for _, transformer in unique.values()]


def ulysses_rank(denoisers: list[Any], group: Any = None, heads: str = "num_attention_heads") -> tuple[int, int]:
    """(this rank, the group's size) for splitting `denoisers`, after checking that the size divides
    each one's attention heads (`config.<heads>`; ValueError); token counts are checked at each
    forward, where they are known."""
    from sagevideo.parallel.launch import rank_and_world
    from sagevideo.parallel.ulysses import check_degree

    rank, world = rank_and_world(group)
    for transformer in denoisers:
        check_degree(getattr(transformer.config, heads), world, world)
    return rank, world


def install_sharded(pipe_or_transformer: Any, router: Any, denoisers: list[Any], hooks_of: Any, *, pv: str | None,
                    backend: str, routes: dict | None = None) -> Any:
    """The Ulysses install every family's `shard_*` ends with: `router` installed (`install_router`,
    the family's Ulysses processors as `routes`), then `hooks_of(transformer)` (the hook handles
    that split and gather its tokens) registered on each denoiser; a failure on the way removes
    what was added. Returns the `SequenceParallelHandle` that undoes it all. A block-sparse plan
    needs nothing more: after the all-to-all each rank selects tiles over its own heads of the whole
    sequence, as one process does (install's grid hook reads the unsplit input first)."""
    from sagevideo.parallel.ulysses import SequenceParallelHandle
    from sagevideo.pipelines.install import install_router

    attention = install_router(pipe_or_transformer, router, pv=pv or "fp16", backend=backend, routes=routes)
    hooks: list[Any] = []
    try:
        for transformer in denoisers:
            hooks += hooks_of(transformer)
    except BaseException:
        for hook in hooks:
            hook.remove()
        attention.remove()
        raise
    return SequenceParallelHandle(attention, hooks)
