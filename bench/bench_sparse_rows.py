#!/usr/bin/env python3
"""Tile selection on planted inputs at a real shape, judged exactly on sampled query tiles (CPU).

`bench_sparse_select` computes attention exactly for every query row, which at Wan's 75,600 tokens
takes a GPU and minutes. Here only `--samples` query tiles (seeded) are computed exactly, in fp64
against every key, so the real shape runs on a CPU in about a minute; the selections themselves are
made over the whole sequence as installed models make them. Per selection: density (the whole
mask's), attention mass kept (mean and worst row over the sampled rows, per head) and the output
cosine against dense attention per head (over the sampled rows' outputs). Selections:

- `oracle`: each sampled query tile keeps its round(density x key tiles) key tiles of most exact
  mass (an upper bound for any per-row selection of that size; other rows keep nothing);
- `dynamic`: one top-p for every head (`select_dynamic_at_density`);
- `dynamic-rows`: the per-row density installed models run (`select_dynamic_per_row`);
- `rows+probe`: the per-row density with `--probe-columns` key tiles per head forced for every query
  tile (`DynamicSelection.probe_columns`: those of most exact mass over the probe's fixed
  pseudo-random query rows, `tile_select.probe_rows`): global keys, which pooling averages away;
- `pairs+probe`: the same, chosen per pair of query tiles (2·block_m rows pooled as one) and the
  pair's list taken by both: what a selection at half the rows (half the scores and threshold
  searches) would cost in quality.

    python -m bench.bench_sparse_rows --heads 8 --density 0.15 --json rows.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as a file: `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_sparse_select import SHAPES, cell_for  # noqa: E402


def per_key_tile(probs, block_n: int):
    """probs (..., N) -> (..., N tiles, block_n), the last tile zero-padded."""
    import torch

    n = probs.shape[-1]
    tiles = -(-n // block_n)
    return torch.nn.functional.pad(probs, (0, tiles * block_n - n)).unflatten(-1, (tiles, block_n))


class SampledRows:
    """Exact attention of `tiles` (query tile indices) for every head: probabilities (fp64) and
    their mass per key tile, computed once and reused by every selection."""

    def __init__(self, inputs, tiles, block_m: int, block_n: int):
        import torch

        q, k = inputs.q[0].double(), inputs.k[0].double()
        self.n, self.block_m, self.block_n = k.shape[1], block_m, block_n
        self.n_tiles = -(-self.n // block_n)
        self.v = inputs.v[0].double()
        self.rows = {}
        for head in range(q.shape[0]):
            for tile in tiles.tolist():
                span = slice(tile * block_m, min(self.n, (tile + 1) * block_m))
                probs = torch.softmax((q[head, span] @ k[head].T) * inputs.sm_scale, dim=-1)
                self.rows[head, tile] = (probs, per_key_tile(probs, block_n).sum(-1))

    def oracle(self, density: float, heads: int, m_tiles: int):
        """bool (1, H, M, N): each sampled query tile's round(density x N) key tiles of most mass."""
        import torch

        keep = torch.zeros(1, heads, m_tiles, self.n_tiles, dtype=torch.bool)
        for (head, tile), (_, mass) in self.rows.items():
            keep[0, head, tile, mass.sum(0).topk(max(1, round(density * self.n_tiles))).indices] = True
        return keep

    def quality(self, keep) -> dict:
        """Mass kept (mean, worst row, per head) and output cosine per head of a (B or 1, H or 1, M, N) mask."""
        import torch

        heads = {}
        for (head, tile), (probs, mass) in self.rows.items():
            kept = keep[0, min(head, keep.shape[1] - 1), tile]
            masked = (per_key_tile(probs, self.block_n) * kept[None, :, None]).flatten(-2)[:, : self.n]
            masked = masked / masked.sum(-1, keepdim=True)
            entry = heads.setdefault(head, ([], [], []))
            entry[0].append(mass[:, kept].sum(-1))
            entry[1].append(masked @ self.v[head])
            entry[2].append(probs @ self.v[head])
        mass = {h: torch.cat(e[0]) for h, e in heads.items()}
        cos = {h: float(torch.nn.functional.cosine_similarity(torch.cat(e[1]).flatten(), torch.cat(e[2]).flatten(),
                                                              dim=0)) for h, e in heads.items()}
        every = torch.cat(list(mass.values()))
        return {"mass_mean": float(every.mean()), "mass_worst_row": float(every.min()),
                "mass_per_head": [round(float(m.mean()), 4) for m in mass.values()],
                "cos_worst_head": min(cos.values()), "cos_per_head": [round(c, 5) for c in cos.values()]}


def run(shape_name: str, density: float, *, heads: int | None, samples: int, probe_cols: int, seed: int = 0,
        pv: str = "fp8") -> list[dict]:
    import torch

    from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs
    from sagevideo.kernels.plans import tiles
    from sagevideo.kernels.tile_select import grid_tile_order, select_dynamic_at_density, select_dynamic_per_row

    batch, all_heads, grid, head_dim, prefix, suffix = SHAPES[shape_name]
    block_m, block_n = tiles(pv, head_dim)
    spec = PlantedSpec(batch, heads or all_heads, *grid, head_dim, text_prefix=prefix, text_suffix=suffix, seed=seed)
    inputs = planted_inputs(spec, order=grid_tile_order(*grid, *cell_for(max(block_m, block_n))))
    n = inputs.q.shape[2]
    m_tiles = -(-n // block_m)
    sampled = SampledRows(inputs, torch.randperm(m_tiles, generator=torch.Generator().manual_seed(seed))[:samples],
                          block_m, block_n)
    options = dict(block_m=block_m, block_n=block_n, sm_scale=inputs.sm_scale, dense_prefix=prefix,
                   dense_suffix=suffix)
    pairs = select_dynamic_per_row(inputs.q, inputs.k, density, probe_columns=probe_cols,
                                   **{**options, "block_m": 2 * block_m}).keep
    masks = {
        "oracle": sampled.oracle(density, spec.heads, m_tiles),
        "dynamic": select_dynamic_at_density(inputs.q, inputs.k, density, **options).keep,
        "dynamic-rows": select_dynamic_per_row(inputs.q, inputs.k, density, **options).keep,
        "rows+probe": select_dynamic_per_row(inputs.q, inputs.k, density, probe_columns=probe_cols, **options).keep,
        "pairs+probe": pairs.repeat_interleave(2, dim=2)[:, :, :m_tiles],  # each half takes its pair's list
    }
    rows = []
    for name, keep in masks.items():
        density_of = float(keep.float().mean()) if name != "oracle" else density
        row = {"shape": shape_name, "heads": spec.heads, "samples": samples, "selection": name, "target": density,
               "density": density_of, "probe_columns": probe_cols if name.endswith("+probe") else None,
               **sampled.quality(keep)}
        rows.append(row)
        print(f"{name:<13} density {row['density']:.3f}  mass mean {row['mass_mean']:.4f} worst row "
              f"{row['mass_worst_row']:.4f}  cos worst head {row['cos_worst_head']:.5f}  per head "
              f"{' '.join(f'{c:.4f}' for c in row['cos_per_head'])}", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="wan-720p")
    parser.add_argument("--density", type=float, default=0.15)
    parser.add_argument("--heads", type=int, default=8, help="planted heads (every 4th a temporal-stripe head)")
    parser.add_argument("--samples", type=int, default=24, help="query tiles computed exactly")
    parser.add_argument("--probe-columns", type=int, default=8, help="key tiles forced per head by the probe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = run(args.shape, args.density, heads=args.heads, samples=args.samples, probe_cols=args.probe_columns,
               seed=args.seed)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
