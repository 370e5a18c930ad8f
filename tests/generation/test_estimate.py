"""Job estimates before anything loads: memory that cannot fit is refused, long attention is announced."""

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app
from sagevideo.generation.estimate import estimate_job, latent_tokens
from sagevideo.generation.generate import plan_batch
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import resolve_model

GB = 10**9


@pytest.fixture
def free_memory(monkeypatch):
    """Set what the machine has free (the refusal must not depend on the test machine)."""
    import sagevideo.generation.budget

    def set_free(n: int) -> None:
        monkeypatch.setattr(sagevideo.generation.budget, "available_bytes", lambda device="cpu": n)

    return set_free


def test_estimates_follow_the_tiny_models_measured_peaks():
    tiny = resolve_model("tiny")
    job = tiny.resolve(JobSpec(prompt="x", width=2048, height=2048, frames=1, steps=1))
    assert latent_tokens(tiny, job) == 128 * 128 + 226
    estimate = estimate_job(tiny, job, "sdpa", "float32")
    # measured on CPU (fp32): decoding 2048x2048x1 peaked at ~3.5 GB over the loaded process; 512x512x9 at ~1.2 GB
    assert 2.5 * GB < estimate.decode < 5 * GB and estimate.decode > estimate.denoise
    nine = estimate_job(tiny, tiny.resolve(JobSpec(prompt="x", width=512, height=512, frames=9)), "sdpa", "float32")
    assert 0.8 * GB < nine.decode < 1.8 * GB


def test_a_job_that_cannot_fit_is_refused_with_its_estimate(tmp_path, no_model_load, free_memory):
    free_memory(24 * GB)
    result = CliRunner().invoke(app, ["generate", "-p", "a fox", "--width", "8192", "--height", "8192",
                                      "--frames", "1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("sagevideo generate: error: job 1: needs about 56.1 GB at its peak (decoding the video; ")
    assert line.endswith("but the cpu has 24.0 GB free; use a smaller resolution or fewer frames")
    assert not (tmp_path / "out").exists()  # refused before even the output folder was made


def test_a_long_job_gets_its_measured_attention_time(tmp_path, no_model_load, free_memory, monkeypatch):
    import sagevideo.generation.estimate as estimate

    free_memory(100 * GB)
    monkeypatch.setattr(estimate, "_probe_call", lambda *args: 0.25)  # one call at 1,024 tokens, here
    batch = plan_batch("a fox", width=4096, height=4096, frames=1, out=tmp_path / "out", job_timeout=600)
    (note,) = [n for n in batch.notes if "attention alone" in n]
    # (65,762 / 1,024)² x 0.25 s x 2 layers x 2 steps = 4,124 s
    assert note.startswith("job 1: attention alone needs about 68.7 min here (65,762 tokens per call, 4 calls; ")
    assert note.endswith("; it will run past --job-timeout 600 s")
    small = plan_batch("a fox", out=tmp_path / "out")  # the tiny default size: nothing measured, no note
    assert not [n for n in small.notes if "attention alone" in n]


def test_each_family_counts_its_own_attention_tokens_and_forward_batch():
    """Wan's text is only in cross-attention and each guidance branch is its own forward; Open-Sora
    batches three branches; HunyuanVideo is guidance-distilled; CogVideoX batches CFG's two halves."""
    job = JobSpec(prompt="x", guidance=6.0)
    wan, opensora, hunyuan, cogvideox = (resolve_model(m) for m in ("tiny-wan", "tiny-opensora", "tiny-hunyuanvideo",
                                                                     "tiny"))
    w = wan.resolve(job)
    size = wan.spatial * wan.patch
    assert latent_tokens(wan, w) == ((w.frames - 1) // wan.temporal + 1) * (w.height // size) * (w.width // size)
    batches = [s.model_family.forward_batch(s, s.resolve(job)) for s in (wan, opensora, hunyuan, cogvideox)]
    assert batches == [1, 3, 1, 2]
    assert cogvideox.model_family.forward_batch(cogvideox, cogvideox.resolve(JobSpec(prompt="x", guidance=1.0))) == 1
    # the activations scale with the batch: Open-Sora's three branches hold 3x one branch's
    o = opensora.resolve(job)
    assert estimate_job(opensora, o, "sdpa", "float32").denoise == (
        3 * latent_tokens(opensora, o) * opensora.heads * opensora.head_dim * 4 * 16)


def test_bf16_steps_count_the_float8_copies_of_the_denoisers_matrices(tmp_path):
    """With --linear-bf16-steps the denoisers' matrices stay in bf16 beside their float8 copies
    (1 byte each); other components and 1-D weights are not copied. Headers only: no data read."""
    from types import SimpleNamespace

    import torch
    from safetensors.torch import save_file

    from sagevideo.generation.estimate import weights_bytes
    from sagevideo.jobs.recipe import Recipe

    for sub, tensors in {"transformer": {"a.weight": torch.zeros(64, 32), "a.bias": torch.zeros(64)},
                         "transformer_2": {"b.weight": torch.zeros(16, 16)},
                         "vae": {"c.weight": torch.zeros(10, 10)}}.items():
        (tmp_path / sub).mkdir()
        save_file(tensors, str(tmp_path / sub / "model.safetensors"))
    source = SimpleNamespace(is_tiny=False, path=tmp_path)
    plain = (64 * 32 + 64 + 16 * 16 + 10 * 10) * 2
    assert weights_bytes(source, "bfloat16") == plain == weights_bytes(source, "bfloat16", Recipe(linear="fp8"))
    edges = Recipe(linear="fp8", linear_bf16_steps=[0, -1])
    assert weights_bytes(source, "bfloat16", edges) == plain + 64 * 32 + 16 * 16
