#!/usr/bin/env python3
"""The kernels at the edges, as a user meets them (GPU): large magnitudes, one NaN query row, more
than 2^31 elements, peaky attention. One line per case, for this checkout or for an earlier commit
prepared by `bench_ab_commit.py --prepare` (`--package sagevideo_base`), so that a fix is shown
against the code before it with the same script.

    python -m bench.edge_cases [--package sagevideo_base] [--cases large,nan-row,peaky,2^31] [--json F] \
        [--append-results [PATH]]

Each >2^31 case runs in its own subprocess: an illegal memory access ends the CUDA context.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if not __package__:  # run as a file (python bench/edge_cases.py): `bench` from the repo root, as with -m
    sys.path.insert(0, str(ROOT))
from bench.results import Run, add_results_option, start_run, variant  # noqa: E402

BIG = {"2^31-gluon": ((1, 66, 262144, 128), "fp8"), "2^31-plain-d64": ((1, 132, 262144, 64), "fp8"),
       "2^31-plain-d128-fp16": ((1, 66, 262144, 128), "fp16")}


def _api(package: str):
    sys.path[:0] = [str(ROOT), str(ROOT / ".bench-base")]
    try:  # this layout, or the one before the rooms were renamed (an earlier commit as the base)
        return (importlib.import_module(f"{package}.attention.functional"),
                importlib.import_module(f"{package}.attention.records"))
    except ImportError:
        return importlib.import_module(f"{package}.api.attention"), importlib.import_module(f"{package}.api.backends")


def _inputs(shape, seed=0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3)]


def _cosine_fp32(q, k, v, out) -> float:
    """Worst cosine over heads against fp32 SDPA."""
    import torch.nn.functional as F

    worst = 1.0
    for h in range(q.shape[1]):
        ref = F.scaled_dot_product_attention(*(t[:, h : h + 1].float() for t in (q, k, v)))
        cos = F.cosine_similarity(ref.flatten(2), out[:, h : h + 1].float().flatten(2), dim=-1)
        worst = min(worst, cos.min().item())
    return worst


def run_case(package: str, case: str) -> list[dict]:
    import torch

    attention, backends = _api(package)
    rows = []
    if case == "large":
        for d, pv in ((64, "fp8"), (64, "fp16"), (128, "fp8"), (128, "fp16")):
            q, k, v = _inputs((1, 8, 17776, d))
            for scale in (100.0, 1000.0):
                out = attention.sageattn(q * scale, k * scale, v, pv=pv, backend="triton")
                rows.append({"case": f"q,k x{scale:g} d{d}", "pv": pv, "ran": backends.last_backend().label,
                             "nonfinite": int((~torch.isfinite(out)).sum())})
    elif case == "nan-row":
        for d, pv in ((64, "fp8"), (64, "fp16"), (128, "fp8"), (128, "fp16")):
            q, k, v = _inputs((1, 4, 4096, d))
            q[0, 2, 1000, 5] = float("nan")
            out = attention.sageattn(q, k, v, pv=pv, backend="triton")
            rows.append({"case": f"one NaN in q, d{d}", "pv": pv, "ran": backends.last_backend().label,
                         "nonfinite_rows": int((~torch.isfinite(out)).any(-1).sum()), "sdpa_nonfinite_rows": 1})
    elif case == "peaky":
        for label, sq, sk in (("q x1000", 1000, 1), ("k x1000", 1, 1000), ("q,k x30", 30, 30), ("q,k x1", 1, 1)):
            q, k, v = _inputs((1, 8, 4096, 64))
            q, k = q * sq, k * sk
            for pv in ("fp8", "fp16"):
                out = attention.sageattn(q, k, v, pv=pv, backend="triton")
                rows.append({"case": f"peaky {label}", "pv": pv, "ran": backends.last_backend().label,
                             "cos_worst": round(_cosine_fp32(q, k, v, out), 5)})
    elif case in BIG:
        shape, pv = BIG[case]
        q, k, v = _inputs(shape)
        try:
            out = attention.sageattn(q, k, v, pv=pv, backend="triton")
            torch.cuda.synchronize()
            b, h, n = shape[0] - 1, shape[1] - 1, shape[2] - 1
            ref = torch.softmax(k[b, h].float() @ q[b, h, n].float() * shape[3] ** -0.5, 0) @ v[b, h].float()
            cos = torch.nn.functional.cosine_similarity(ref, out[b, h, n].float(), dim=0).item()
            rows.append({"case": case, "pv": pv, "ran": backends.last_backend().label,
                         "nonfinite": int((~torch.isfinite(out)).sum()), "last_row_cos": round(cos, 5)})
        except RuntimeError as exc:
            rows.append({"case": case, "pv": pv, "error": str(exc).splitlines()[0][:120]})
    return rows


def result_rows(run: Run, rows: list[dict]) -> Run:
    """The cases as results-file rows, named as the 2026-12-01 runs' converted rows are: shape = the
    case, variant sagevideo[pv=PV], one row per measured count or cosine (the backend that ran in
    extra), a failed case as `error` = 1 with its message."""
    for row in rows:
        name = variant("sagevideo", **({"pv": row["pv"]} if row.get("pv") else {}))
        for metric in ("nonfinite", "nonfinite_rows", "sdpa_nonfinite_rows"):
            run.add(row["case"], name, metric, row.get(metric), unit="count", ran=row.get("ran"))
        for metric in ("cos_worst", "last_row_cos"):
            run.add(row["case"], name, metric, row.get(metric), ran=row.get("ran"))
        if "error" in row:
            run.add(row["case"], name, "error", 1, unit="count", error=row["error"])
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="sagevideo", choices=("sagevideo", "sagevideo_base"))
    parser.add_argument("--cases", default="large,nan-row,peaky," + ",".join(BIG))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a single case, in this process
    parser.add_argument("--json")
    add_results_option(parser)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_case(args.package, args.one)))
        return 0
    rows = []
    for case in args.cases.split(","):
        done = subprocess.run([sys.executable, __file__, "--package", args.package, "--one", case],
                              capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
        rows += json.loads(lines[-1]) if done.returncode == 0 and lines else [
            {"case": case, **({"pv": BIG[case][1]} if case in BIG else {}),
             "error": (done.stderr.strip().splitlines() or ["?"])[-1][:160]}]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.append_results:
        import torch

        run = start_run("edge_cases", torch.cuda.get_device_name(), argv)
        if args.package == "sagevideo_base":  # the code measured is the base commit's
            run.commit = (ROOT / ".bench-base" / "COMMIT").read_text().strip()
        added = result_rows(run, rows).append(args.append_results)
        print(f"edge_cases: {added} rows appended to {args.append_results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
