"""`pipelines/sharding`: what a family's shard_* splits, by exact class, checked before
anything changes (each family's refusals: tests/pipelines/<family>/test_sequence_parallel.py)."""

from types import SimpleNamespace

import pytest

from sagevideo.pipelines.sharding import shard_targets
from tests.helpers.wan import tiny_wan


def _wan_classes():
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor, WanTransformer3DModel

    return (WanTransformer3DModel,), (WanAttnProcessor,)


def test_every_denoiser_once_transformer_first():
    first, second = tiny_wan(0), tiny_wan(1)
    held = SimpleNamespace(transformer=first, transformer_2=second)
    assert shard_targets("shard_x", held, *_wan_classes(), several=True) == [first, second]
    assert shard_targets("shard_x", SimpleNamespace(transformer=first, transformer_2=first), *_wan_classes()) == [first]
    with pytest.raises(TypeError, match=r"shard_x: SimpleNamespace holds 2 denoisers \(transformer, transformer_2\)"):
        shard_targets("shard_x", held, *_wan_classes())


def test_a_subclass_is_refused_by_name_and_module():
    from diffusers import WanTransformer3DModel

    from tests.helpers.wan import WAN_CONFIG

    class DerivedWan(WanTransformer3DModel):
        pass

    with pytest.raises(TypeError, match=r"shard_x: the transformer is a DerivedWan \(from "
                                        r"tests\.pipelines\.test_sharding\); shard_x splits "
                                        r"WanTransformer3DModel only, for Wan: .*sagevideo\.install"):
        shard_targets("shard_x", DerivedWan(**WAN_CONFIG), *_wan_classes(), known=", for Wan")


def test_install_sharded_removes_the_attention_when_a_hook_cannot_be_registered(monkeypatch):
    """Every family's shard_* ends in install_sharded: a failure registering hooks leaves nothing installed."""
    import sagevideo.pipelines.install as install
    from sagevideo.pipelines.sharding import install_sharded

    removed = []

    class Installed:
        def remove(self):
            removed.append("attention")

    class Hook:
        def remove(self):
            removed.append("hook")

    monkeypatch.setattr(install, "install_router", lambda *args, **kwargs: Installed())

    def hooks_of(transformer):
        if transformer == "second":
            raise RuntimeError("no such submodule")
        return [Hook()]

    with pytest.raises(RuntimeError, match="no such submodule"):
        install_sharded(object(), object(), ["first", "second"], hooks_of, pv=None, backend="auto")
    assert removed == ["hook", "attention"]
    handle = install_sharded(object(), object(), ["first"], hooks_of, pv=None, backend="auto")
    handle.remove()
    assert removed[2:] == ["hook", "attention"]


def test_ulysses_rank_checks_every_denoisers_heads(monkeypatch):
    import sagevideo.parallel.launch as launch
    from sagevideo.pipelines.sharding import ulysses_rank

    monkeypatch.setattr(launch, "rank_and_world", lambda group=None: (1, 4))
    heads = lambda n: SimpleNamespace(config=SimpleNamespace(num_attention_heads=n, num_heads=n))
    assert ulysses_rank([heads(8), heads(12)]) == (1, 4)
    with pytest.raises(ValueError, match="30 attention heads are not divisible by 4"):
        ulysses_rank([heads(8), heads(30)])
    assert ulysses_rank([heads(4)], heads="num_heads") == (1, 4)
