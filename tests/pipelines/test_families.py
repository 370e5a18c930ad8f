"""The model-family registry: one table, one folder per family, read by loading, install,
the runner and the --gpus-per-job check."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sagevideo.jobs.specs import InputError, JobSpec
from sagevideo.pipelines import families
from sagevideo.pipelines.families import degree_problems
from sagevideo.pipelines.loading import resolve_model


def test_every_registered_family_is_a_folder_with_its_family_module():
    assert [f.name for f in families.every()] == list(families.REGISTRY) == ["cogvideox", "opensora", "wan"]
    for family in families.every():
        assert isinstance(family, families.ModelFamily) and family.pipeline_classes
        assert families.REGISTRY[family.name] == f"sagevideo.pipelines.{family.name}.family"
    assert families.for_pipeline_class("CogVideoXPipeline") is families.get("cogvideox")
    assert families.for_pipeline_class("OpenSoraPipeline") is families.get("opensora")
    assert families.for_pipeline_class("StableDiffusionPipeline") is None
    assert families.for_tiny("tiny") is families.get("cogvideox")
    assert families.for_pipeline_class("WanPipeline") is families.get("wan")
    assert families.generated_pipeline_classes() == ["CogVideoXPipeline", "CogVideoXImageToVideoPipeline",
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
    from sagevideo.pipelines.opensora.attention import OpenSoraAttnProcessor, SageOpenSoraAttnProcessor

    assert _processor_routes() == {
        CogVideoXAttnProcessor2_0: SageCogVideoXAttnProcessor,
        OpenSoraAttnProcessor: SageOpenSoraAttnProcessor,
    }


def test_a_registered_family_that_does_not_generate_is_refused_by_name(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "OpenSoraPipeline"}))
    with pytest.raises(InputError, match=r"names 'OpenSoraPipeline' \(the Open-Sora 2.0 family is registered for "
                       r"install and sequence parallelism, not yet for generate\); sagevideo generate runs "
                       r"CogVideoXPipeline"):
        resolve_model(str(tmp_path))


def opensora_source(**fields):
    """An Open-Sora 2.0 source at the released config (no loader yet: built by hand)."""
    base = dict(name="opensora", path=None, fingerprint="0" * 12, pipeline_class="OpenSoraPipeline", heads=24,
                head_dim=128, spatial=8, temporal=4, patch=2, text_tokens=512, default_height=256,
                default_width=448, default_frames=129, default_steps=50, layers=19, family="opensora")
    return dataclasses.replace(resolve_model("tiny"), **{**base, **fields})


def test_opensora_job_constraints_and_degree_rule():
    source = opensora_source()
    fine = JobSpec(prompt="x", frames=129, height=256, width=448)
    assert source.problems(fine) == []
    bad = source.problems(JobSpec(prompt="x", frames=11, height=250, width=448))
    assert bad == [
        "height: 250 px is not a multiple of 16 (VAE 8x times patch 2); use e.g. 240 or 256",
        "frames: 11 is not 1 + a multiple of 4 (the VAE compresses time 4x after the first frame); use e.g. 9 or 13",
    ]
    family = families.get("opensora")
    # 33 latent frames x 16 x 28 tokens = 14784 image tokens (text is replicated, not split)
    assert family.degree_problem(source, fine, 8) is None
    assert family.degree_problem(source, fine, 5) == (
        "14784 image tokens are not divisible by 5; change frames/size or the degree"
    )
    # generate cannot run it yet, so --gpus-per-job refuses it before any per-job check
    with pytest.raises(InputError, match="sequence parallelism splits CogVideoX, Wan transformers only; opensora is a "
                       "OpenSoraPipeline"):
        families.degree_problems(source, [(fine, "job 1")], 2)


def test_other_models_and_transformers_are_refused():
    tiny = resolve_model("tiny")
    job = [(tiny.resolve(JobSpec(prompt="a cat")), "job 1")]
    assert degree_problems(tiny, job, 1) == [] and degree_problems(tiny, job, 2) == []
    with pytest.raises(InputError, match="sequence parallelism splits CogVideoX, Wan transformers only; tiny is a "
                       "OpenSoraPipeline"):
        degree_problems(dataclasses.replace(tiny, pipeline_class="OpenSoraPipeline"), job, 2)
