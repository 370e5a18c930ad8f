"""Open-Sora timestep embedding: cos first, as the official code computes it."""

import torch

from sagevideo.pipelines.opensora.embeddings import timestep_embedding
from tests.helpers.opensora import ref_timestep_embedding


def test_timestep_embedding_cos_first():
    t = torch.tensor([0.0, 0.25, 0.731])
    emb = timestep_embedding(t)
    assert emb.shape == (3, 256)
    assert torch.all(emb[0, :128] == 1) and torch.all(emb[0, 128:] == 0)  # sigma 0: cos 1 first, then sin 0
    torch.testing.assert_close(emb, ref_timestep_embedding(t), atol=2e-4, rtol=0)  # fp32 args up to 1000
    # first frequency is 1: column 0 is cos(1000 sigma), column 128 sin(1000 sigma)
    torch.testing.assert_close(emb[:, 0], torch.cos(1000 * t), atol=1e-4, rtol=0)
    torch.testing.assert_close(emb[:, 128], torch.sin(1000 * t), atol=1e-4, rtol=0)
