"""`pipelines/sharding.shard_targets`: what a family's shard_* splits, by exact class, checked before
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
