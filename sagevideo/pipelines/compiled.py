"""Code that torch.compile traced before `install` (or before `remove`), and making it trace again.

Dynamo does not guard on module hooks (`torch._dynamo.config.skip_nnmodule_hook_guards`), so a
block, a model or a wrapper compiled and run before sagevideo's hooks were added keeps running its
old code: attention inside it would run stock SDPA, unrecorded, although `install` succeeded (and
after `remove`, compiled code traced with the hooks would keep quantizing). `compiled_parts` finds
every compiled part of a denoiser — `module.compile()` (diffusers' `compile_repeated_blocks()`
included), `torch.compile(module)` wrappers in the module tree, a compiled `forward` assigned to a
module — and `retrace_compiled` clears torch.compile's in-memory code caches so that each traces
again, with the hooks as they now are, on its next call. Dynamo keys its caches by code object,
which every instance of a class shares, so no narrower reset exists: other compiled code in the
process traces again too (once; Inductor's on-disk caches still serve what did not change).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


class CompiledBeforeInstallWarning(UserWarning):
    """`install` found compiled code that had run without its hooks and made it trace again."""


def unwrap_compiled(module: Any) -> Any:
    """The module a `torch.compile(module)` wrapper (an OptimizedModule) holds; anything else as is."""
    while isinstance(module, torch._dynamo.eval_frame.OptimizedModule):
        module = module._orig_mod
    return module


def _is_compiled(module: torch.nn.Module) -> bool:
    if isinstance(module, torch._dynamo.eval_frame.OptimizedModule):
        return True
    if getattr(module, "_compiled_call_impl", None) is not None:  # module.compile()
        return True
    forward = vars(module).get("forward")  # module.forward = torch.compile(module.forward)
    return forward is not None and hasattr(forward, "_torchdynamo_orig_callable")


def compiled_parts(module: Any, wrapped: bool = False) -> list[str]:
    """Names of the compiled parts of `module`'s tree ("" for `module` itself; `wrapped`: it came
    inside a torch.compile wrapper). Empty when nothing in it was compiled."""
    names = [""] if wrapped else []
    if isinstance(module, torch.nn.Module):
        names += [name for name, sub in module.named_modules() if _is_compiled(sub) and name not in names]
    return names


def _dynamo_holds_code() -> bool:
    """Whether torch.compile has compiled anything in this process yet (else nothing can be stale)."""
    from torch._dynamo import convert_frame
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    codes = (ref() for ref in convert_frame.input_codes.seen)
    return any(code is not None and _debug_get_cache_entry_list(code) for code in codes)


def retrace_compiled(label: str, parts: list[str], action: str) -> bool:
    """Make torch.compile trace `label`'s compiled `parts` again on their next call; returns whether
    any compiled code had to go. action: what changed the hooks ("install" says so in a warning,
    once per call; "remove" restores silently)."""
    if not _dynamo_holds_code():
        return False
    torch._dynamo.reset_code_caches()
    if action == "install":
        shown = ", ".join(name or label for name in parts[:4])
        shown += f" and {len(parts) - 4} more" if len(parts) > 4 else ""
        warnings.warn(
            f"sagevideo.install: {label} was compiled and run before install ({shown}); so that its attention "
            "routes through sagevideo, torch.compile's in-memory code caches were cleared and compiled code in "
            "this process traces again on its next call (install before compiling to avoid the extra compile)",
            CompiledBeforeInstallWarning,
            stacklevel=4,
        )
    return True
