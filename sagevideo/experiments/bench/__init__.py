"""The benchmark library behind `sagevideo bench`: what users time on their own GPU.

- `attention`: attention calls at their shapes, SDPA's backends and sageattn side by side;
- `forward`: whole transformer forwards per speed recipe, side by side;
- `timing`: the round-robin timing, medians, cosines and options both share;
- `results`: the results file (one measured number per JSON line, `results.schema.json`) that
  `--append-results` writes and the maintainer benchmarks in the repository's `bench/` share.
"""
