"""The model-family registry: one table, one folder per family, read by loading, install,
the runner and the --gpus-per-job check."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sagevideo.errors import InputError
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines import families
from sagevideo.pipelines.families import degree_problems
from sagevideo.pipelines.loading import resolve_model


def test_every_registered_family_is_a_folder_with_its_family_module():
    assert [f.name for f in families.every()] == list(families.REGISTRY) == [
        "cogvideox", "opensora", "hunyuanvideo", "wan", "hunyuanvideo15", "ltx"
    ]
    for family in families.every():
        assert isinstance(family, families.ModelFamily) and family.pipeline_classes
        assert families.REGISTRY[family.name] == f"sagevideo.pipelines.{family.name}.family"
    assert families.for_pipeline_class("CogVideoXPipeline") is families.get("cogvideox")
    assert families.for_pipeline_class("OpenSoraPipeline") is families.get("opensora")
    assert families.for_pipeline_class("StableDiffusionPipeline") is None
    assert families.for_tiny("tiny") is families.get("cogvideox")
    assert families.for_tiny("tiny-opensora") is families.get("opensora")
    assert families.for_pipeline_class("HunyuanVideoPipeline") is families.get("hunyuanvideo")
    assert families.for_tiny("tiny-hunyuanvideo") is families.get("hunyuanvideo")
    assert families.for_pipeline_class("WanPipeline") is families.get("wan")
    assert families.generated_pipeline_classes() == ["CogVideoXPipeline", "CogVideoXImageToVideoPipeline",
                                                     "OpenSoraPipeline", "HunyuanVideoPipeline",
                                                     "WanPipeline", "WanImageToVideoPipeline"]
    with pytest.raises(KeyError, match="no model family 'stablediffusion'"):
        families.get("stablediffusion")


def test_the_tiny_model_and_loaded_pipelines_know_their_family(tiny_pipe):
    source = resolve_model("tiny")
    assert source.family == "cogvideox" and source.model_family is families.get("cogvideox")
    assert families.of_pipeline(tiny_pipe) is families.get("cogvideox")
    with pytest.raises(TypeError, match="not a pipeline of a registered model family"):
        families.of_pipeline(object())


def test_install_routes_come_from_every_family():
    from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

    from sagevideo.pipelines.cogvideox.processor import SageCogVideoXAttnProcessor
    from sagevideo.pipelines.install import _processor_routes
    from sagevideo.pipelines.opensora.processor import OpenSoraAttnProcessor, SageOpenSoraAttnProcessor

    assert _processor_routes() == {
        CogVideoXAttnProcessor2_0: SageCogVideoXAttnProcessor,
        OpenSoraAttnProcessor: SageOpenSoraAttnProcessor,
    }


def test_a_registered_family_that_does_not_generate_is_refused_by_name(tmp_path, monkeypatch):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "OpenSoraPipeline"}))
    monkeypatch.setattr(families.get("opensora"), "generates", False)
    with pytest.raises(InputError, match=r"names 'OpenSoraPipeline' \(the Open-Sora 2.0 family is registered for "
                       r"install and sequence parallelism, not yet for generate\); sagevideo generate runs "
                       r"CogVideoXPipeline"):
        resolve_model(str(tmp_path))
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "LTX2Pipeline"}))
    with pytest.raises(InputError, match=r"names 'LTX2Pipeline' \(the LTX-Video / LTX-2 family is registered for "
                       r"install, not yet for generate\)"):
        resolve_model(str(tmp_path))


def test_other_models_and_transformers_are_refused():
    tiny = resolve_model("tiny")
    job = [(tiny.resolve(JobSpec(prompt="a cat")), "job 1")]
    assert degree_problems(tiny, job, 1) == [] and degree_problems(tiny, job, 2) == []
    with pytest.raises(InputError, match="sequence parallelism splits CogVideoX, Open-Sora 2.0, HunyuanVideo, Wan "
                       "transformers only; tiny is a CogVideoXVideoToVideoPipeline with a CogVideoXTransformer3DModel"):
        degree_problems(dataclasses.replace(tiny, pipeline_class="CogVideoXVideoToVideoPipeline"), job, 2)


def test_the_models_that_take_an_image_are_listed_from_the_registry():
    assert families.image_models_text() == (
        "tiny-cogvideox-i2v, tiny-opensora, tiny-wan-i2v, tiny-wan22-ti2v, or a CogVideoXImageToVideoPipeline, "
        "OpenSoraPipeline or WanImageToVideoPipeline folder"
    )


def test_is_exactly_takes_the_class_itself_not_a_subclass_and_imports_only_on_a_name_match():
    from collections import OrderedDict

    from sagevideo.pipelines.families import is_exactly

    class Derived(OrderedDict):
        pass

    assert is_exactly(OrderedDict(), "collections", "OrderedDict")
    assert not is_exactly(Derived(), "collections", "OrderedDict")
    assert not is_exactly(OrderedDict(), "no_such_module_anywhere", "Other")  # never imported: no ImportError
