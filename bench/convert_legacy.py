"""One-off: flatten docs/results/*.json(l) into bench/results.jsonl (removed with docs/results).

    python -m bench.convert_legacy            # rewrites bench/results.jsonl

Every key of every file is either turned into rows, kept under a row's `extra`, or listed in an
IGNORED set below (descriptions that docs/benchmarks.md already carries); `Take.done()` fails on
anything left over, so nothing is dropped silently.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

from bench.results import DEFAULT, Result, append

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "docs" / "results"

# Commits the docs name for a run (docs/benchmarks.md): the seventh session's table is the final
# run of f80f196; the 2026-12-01 A/B and edge-case "base" runs are 0a492ef.
COMMITS = {
    "2026-11-30-h200-final7-bench.json": "f80f196f7a34cf11901f381a04d21c94554c646a",
    "2026-11-30-h200-final7-sm90.json": "f80f196f7a34cf11901f381a04d21c94554c646a",
    "2026-12-01-h200-edge-base.json": "0a492ef56ab2f775f935c97b2765fe30dfffa578",
}


# The profiler's name for the zero-fill before the K/V statistics (0.001 ms), shortened.
FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
        "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
FILL_SHORT = "fill (at::native::FillFunctor<float>)"


class Take:
    """A dict whose keys must all be taken (or explicitly ignored) before `done()`."""

    def __init__(self, d: dict, where: str):
        self.d, self.where, self.left = d, where, set(d)

    def __call__(self, key, default=None):
        self.left.discard(key)
        return self.d.get(key, default)

    def has(self, key):
        return key in self.d

    def ignore(self, *keys):
        self.left -= set(keys)

    def done(self):
        if self.left:
            raise SystemExit(f"{self.where}: keys not converted: {sorted(self.left)}")


def v(name: str, **params) -> str:
    """variant name with its parameters: name[key=value,...] (None -> auto, bools -> on/off)."""
    def fmt(x):
        if x is None:
            return "auto"
        if isinstance(x, bool):
            return "on" if x else "off"
        return str(x)

    inner = ",".join(f"{k}={fmt(x)}" for k, x in params.items())
    return f"{name}[{inner}]" if inner else name


class Rows:
    def __init__(self, source: str, gpu: str, date: str, commit: str | None):
        self.source, self.gpu, self.date, self.commit = source, gpu, date, commit
        self.rows: list[Result] = []

    def add(self, bench, shape, variant, metric, value, *, unit=None, commit="file", **extra):
        if value is None:
            return
        if isinstance(value, bool):
            value, unit = float(value), unit or "bool"
        if isinstance(value, float) and math.isnan(value):  # JSON has no NaN: say that it was one
            metric, value, unit = f"{metric}_is_nan", 1.0, "bool"
        extra = {k: x for k, x in extra.items() if x not in (None, {}, [])}
        self.rows.append(Result(bench=bench, shape=str(shape), variant=variant, metric=metric, value=float(value),
                                gpu=self.gpu, date=self.date, source=self.source,
                                commit=self.commit if commit == "file" else commit, unit=unit, extra=extra))


# --- bench_attention.py: {"meta", "rows": [{shape, B, H, N, D, tops, ms, vs_cudnn, ...}]} ------

def bench_attention(out: Rows, o: dict, where: str, bench: str = "bench_attention"):
    top = Take(o, where)
    top("meta")  # same software in every file: torch 2.11.0+cu130, triton 3.6.0, cuDNN 9.19.0
    for row in top("rows"):
        r = Take(row, f"{where}/{row['shape']}")
        shape = r("shape")
        r.ignore("B", "H", "N", "D", "dtype")  # the shape name fixes them (scripts/bench_attention.py SHAPES)
        ms, tops, ratio, reps = r("ms"), r("tops"), r("vs_cudnn", {}), r("ms_reps", {})
        kernel = r("kernel", {})
        errors = r("errors", {})
        for key in ms:
            which = next((kernel[pv] for pv in kernel if key == f"sage-{pv}-kernel"), None)
            out.add(bench, shape, key, "ms", ms[key], reps=reps.get(key), kernel=which, error=errors.get(key))
            if not key.endswith("-quant"):  # attention FLOPs over the preparation's time: not a figure
                out.add(bench, shape, key, "tops", tops.get(key), kernel=which)
            out.add(bench, shape, key, "vs_cudnn", ratio.get(key))
        for pv, cos in r("cos_worst").items():
            out.add(bench, shape, f"sage-{pv}-call", "cos_worst", cos)
        for pv, kernels in r("prep_kernels_ms", {}).items():
            kernels = {FILL_SHORT if k == FILL else k: ms_ for k, ms_ in kernels.items()}
            out.add(bench, shape, f"sage-{pv}-prep", "ms", round(sum(kernels.values()), 4), kernels_ms=kernels)
        for pv, by_tiles in r("prep_tiles_per_program_ms", {}).items():
            for tiles, ms_ in by_tiles.items():
                out.add(bench, shape, v(f"sage-{pv}-prep", tiles_per_program=tiles), "ms", ms_)
        for pv, plans in r("sweep", {}).items():
            for p in plans:
                p = Take(dict(p), f"{where}/{shape}/sweep")
                ms_, tops_, prep = p("ms"), p("tops"), p("prep_ms")
                params = {k: p(k) for k in list(p.d) if k in p.left}
                name = v(f"sage-{pv}-kernel", **params)
                out.add(bench, shape, name, "ms", ms_, prep_ms=prep)
                out.add(bench, shape, name, "tops", tops_)
                p.done()
        r.done()
    top.done()


# --- bench_sm90.py: {"versions", "rows": [{shape, plan, ms, tops, vs_cudnn, cos_worst, ...}]} ---

def bench_sm90(out: Rows, o: dict, where: str, bench: str = "bench_sm90"):
    top = Take(o, where)
    top("versions")
    top("command")
    for row in top("rows"):
        r = Take(row, f"{where}/{row['shape']}")
        shape = r("shape")
        r.ignore("B", "H", "N", "D")
        plan = r("plan")
        ms, tops, ratio, reps = r("ms"), r("tops"), r("vs_cudnn"), r("ms_reps", {})
        errors = r("errors", {})
        for key in ms:
            out.add(bench, shape, key, "ms", ms[key], reps=reps.get(key), error=errors.get(key),
                    plan=plan if key == "triton-kernel" else None)
            out.add(bench, shape, key, "tops", tops.get(key))
            out.add(bench, shape, key, "vs_cudnn", ratio.get(key))
        for key, cos in r("cos_worst").items():  # "triton" = the triton-kernel timing's kernel
            out.add(bench, shape, key, "cos_worst", cos, plan=plan if key == "triton" and not ms else None)
        for key, diff in r("max_diff_vs_triton").items():
            out.add(bench, shape, key, "max_diff_vs_triton", diff)
        for key in set(errors) - set(ms):
            out.add(bench, shape, key, "error", 1, unit="count", error=errors[key])
        r.done()
    top.done()


# --- bench_plan_variants.py and the throwaway exploratory A/Bs: a list of per-shape rows -------

def plan_variants(out: Rows, rows: list, where: str, bench: str):
    for row in rows:
        r = Take(row, f"{where}/{row['shape']}")
        shape = r("shape")
        plans = r("plans", {})
        plan = r("plan")
        ms, tops, ratio = r("ms"), r("tops"), r("vs_cudnn")
        reps = r("ms_reps") or r("ms_all") or {}
        errors = r("errors", {})
        for key in ms:
            out.add(bench, shape, key, "ms", ms[key], reps=reps.get(key), plan=plans.get(key) or plan,
                    error=errors.get(key))
            out.add(bench, shape, key, "tops", tops.get(key))
            out.add(bench, shape, key, "vs_cudnn", ratio.get(key))
        for name in ("cos", "cos_worst"):
            for key, cos in r(name, {}).items():
                out.add(bench, shape, key, name, cos)
        for key, diff in r("maxdiff_vs_base", {}).items():
            out.add(bench, shape, key, "max_diff_vs_base", diff)
        r.done()


# --- bench_prep.py: a list of {shape, pv, warps, tiles_per_program, stats, ..., ms, total_ms} --

def bench_prep(out: Rows, rows: list, where: str):
    seen: dict = {}
    for row in rows:
        r = Take(row, f"{where}/{row['shape']}")
        shape, pv = r("shape"), r("pv")
        if r.has("fused_equals_three_launches"):
            out.add("bench_prep", shape, f"sage-{pv}-prep", "fused_equals_three_launches",
                    r("fused_equals_three_launches"))
            r.done()
            continue
        kernels, total, wall = r("ms"), r("total_ms"), r("wall_ms")
        params = {k: r(k) for k in ("warps", "tiles_per_program", "stats", "q_tiles", "fused") if r.has(k)}
        name = v(f"sage-{pv}-prep", **params)
        key = (shape, name)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:  # the same parameters timed again in one run
            name = v(f"sage-{pv}-prep", **params, repeat=seen[key])
        out.add("bench_prep", shape, name, "ms", total, kernels_ms=kernels)
        out.add("bench_prep", shape, name, "wall_ms", wall)
        r.done()


# --- bench_transformer.py: one forward, {config, sdpa_cudnn_s, sagevideo_s, speedup, ...} -------

def forward_shape(config: str) -> str:
    if config.startswith("CogVideoX-5B"):
        return "cogvideox-5b"
    if config.startswith("Open-Sora 2.0"):
        return "opensora-" + re.search(r"(\d+px)", config).group(1)
    raise SystemExit(f"unknown forward config {config!r}")


def bench_transformer(out: Rows, o: dict, where: str):
    t = Take(o, where)
    config = t("config")
    shape = forward_shape(config)
    t("gpu")
    plan = t("plan")
    sage = f"sagevideo-{plan.split('/')[0].split('-')[1]}"  # "int8-fp8/block" -> sagevideo-fp8
    b = "bench_transformer"
    out.add(b, shape, "sdpa-cudnn", "ms", t("sdpa_cudnn_s") * 1e3, config=config)
    out.add(b, shape, sage, "ms", t("sagevideo_s") * 1e3, plan=plan, backends=t("backends"))
    out.add(b, shape, sage, "speedup", t("speedup"))
    out.add(b, shape, sage, "output_cos_vs_sdpa", t("output_cos_vs_sdpa"))
    layers = t("per_layer_worst_cos")
    if layers:
        worst = min(layers, key=layers.get)
        out.add(b, shape, sage, "layer_cos_worst_min", layers[worst], layer=worst, per_layer=layers)
        out.add(b, shape, sage, "layer_cos_worst_mean", sum(layers.values()) / len(layers))
    t.done()


# --- bench_sp.py (two GPUs): {what, config, world, modes: {sage: {...}, sdpa: {...}}} -----------

def bench_sp(out: Rows, o: dict, where: str, **params):
    t = Take(o, where)
    t.ignore("what", "config", "gpu", "torch", "warmup", "repeats")  # CogVideoX-5B, 2x49 frames 480x720, bf16
    world = t("world")
    b, shape = "bench_sp", "cogvideox-5b"
    for mode, m in t("modes").items():
        if mode == "sage_vs_sdpa_cosine_1gpu":
            out.add(b, shape, v("sage-1gpu", **params), "cos_vs_sdpa", m)
            continue
        m = Take(m, f"{where}/{mode}")
        one, many = v(f"{mode}-1gpu", **params), v(f"{mode}-{world}gpu", **params)
        common = {"plan": m("plan"), "backend_requested": m("backend_requested")}
        out.add(b, shape, one, "ms", m("ms_1"), reps=[s * 1e3 for s in m("times_1")], backends=m("backends_1"),
                **common)
        out.add(b, shape, many, "ms", m("ms_n"), reps=[s * 1e3 for s in m("times_n")], backends=m("backends_n"),
                **common)
        out.add(b, shape, many, "speedup", m("speedup"))
        out.add(b, shape, many, "max_abs_diff_vs_1gpu", m("max_abs_diff"))
        out.add(b, shape, many, "cos_vs_1gpu", m("cosine"))
        for rank, ms in enumerate(m("ms_1_each_rank") or []):  # each GPU alone, at the same time
            out.add(b, shape, v(f"{mode}-1gpu", **params, rank=rank), "ms", ms)
        for label, gpus, each in (("kernels_1", 1, "kernels_1_each_rank"), ("kernels_n", world, "kernels_n_each_rank")):
            ranks = m(each) or []
            if not ranks or m(label) != ranks[0]:  # else the same figures as rank 0's
                for kind, ms in (m(label) or {}).items():
                    out.add(b, shape, v(f"{mode}-{gpus}gpu", **params, kernels=kind), "ms", ms)
            for rank, kinds in enumerate(ranks):
                for kind, ms in kinds.items():
                    out.add(b, shape, v(f"{mode}-{gpus}gpu", **params, rank=rank, kernels=kind), "ms", ms)
        m.done()
    out.add(b, shape, v("run", **params), "total_s", t("total_s"), unit="s")
    t.done()


# --- bench_batch.py (Ray, 1 vs 2 workers) --------------------------------------------------------

def bench_batch(out: Rows, o: dict, where: str):
    t = Take(o, where)
    b = "bench_batch"
    shape = "cogvideox-2b-25x480x720-16steps"
    info = {"model": t("model"), "job": t("job"), "device": t("device"), "pv": t("pv")}
    for run in t("runs"):
        r = Take(run, f"{where}/runs")
        name = v("ray", workers=r("workers"))
        records = [{k: rec[k] for k in ("job_id", "prompt", "status", "worker", "timings", "backends")}
                   for rec in r("records")]
        out.add(b, shape, name, "jobs", r("jobs"), unit="count", records=records, **info)
        out.add(b, shape, name, "done", r("done"), unit="count", errors=r("errors"), attention=r("attention"),
                fallbacks=r("fallbacks"))
        for metric in ("wall_s", "makespan_s", "mean_job_s", "max_load_s"):
            out.add(b, shape, name, metric, r(metric), unit="s",
                    per_worker=r("per_worker") if metric == "makespan_s" else None)
        for metric in ("jobs_per_min_wall", "steady_jobs_per_min"):
            out.add(b, shape, name, metric, r(metric), unit="jobs/min")
        r.done()
    for metric in ("ratio_wall", "ratio_makespan", "ratio_steady"):
        out.add(b, shape, v("ray", workers=2), metric, t(metric))
    t.done()


# --- bench_ab_commit.py (2026-12-01): this checkout vs a base commit, same run -----------------

def bench_ab_commit(out: Rows, rows: list, where: str):
    for row in rows:
        r = Take(row, f"{where}/{row['shape']}")
        shape, pv = r("shape"), r("pv")
        r.ignore("dims", "dtype", "gpu")  # bf16 everywhere; dims fixed by the shape name
        base = r("base_commit")
        ms, reps, ran, errors = r("ms"), r("ms_reps"), r("ran"), r("errors", {})
        for key, value in ms.items():
            side = key.split("-")[0]
            out.add("bench_ab_commit", shape, v(key, pv=pv), "ms", value, reps=reps.get(key), ran=ran.get(side),
                    error=errors.get(key), commit=base if side == "base" else None)
        r.done()


# --- edge_cases.py (2026-12-01) -----------------------------------------------------------------

def edge_cases(out: Rows, rows: list, where: str):
    for row in rows:
        r = Take(row, f"{where}/{row['case']}")
        case, pv, ran = r("case"), r("pv"), r("ran")
        name = v("sagevideo", pv=pv)
        for metric in ("nonfinite", "nonfinite_rows", "sdpa_nonfinite_rows"):
            out.add("edge_cases", case, name, metric, r(metric), unit="count", ran=ran)
        for metric in ("cos_worst", "last_row_cos"):
            out.add("edge_cases", case, name, metric, r(metric), ran=ran)
        if r.has("error"):
            out.add("edge_cases", case, name, "error", 1, unit="count", error=r("error"))
        r.done()


# --- single files -------------------------------------------------------------------------------

def dtype_seqlen(out: Rows, rows: list, where: str):
    """Throwaway script; (B, 24, N, 128) per docs/benchmarks.md."""
    for row in rows:
        r = Take(row, where)
        b_, n, dtype = r("B"), r("N"), r("dtype").removeprefix("torch.")
        shape = f"{b_}x24x{n}x128"
        ms, tops = r("ms"), r("tops")
        backend = r("backend")
        for key in ms:
            name = v(key, dtype=dtype)
            out.add("adhoc-dtype-seqlen", shape, name, "ms", ms[key], backend=backend if key == "sage" else None)
            out.add("adhoc-dtype-seqlen", shape, name, "tops", tops[key])
        out.add("adhoc-dtype-seqlen", shape, v("sage", dtype=dtype), "vs_cudnn", r("speedup"))
        r.done()


def sustained(out: Rows, o: dict, where: str):
    """Throwaway script: 3-call bursts and 57 back-to-back calls at Open-Sora 768px (1,24,76544,128)."""
    t = Take(o, where)
    raw = t("raw_s")
    for key, by in t("ms").items():
        for how, ms in by.items():
            out.add("adhoc-sustained", "opensora-768px", v(key, run=how), "ms", ms,
                    reps=[s * 1e3 for s in raw[key][how]])
    t.done()


def issue_pipes(out: Rows, o: dict, where: str):
    t = Take(o, where)
    t("device")
    shape = f"chains={t('chains')},iters={t('iters')}"
    for row in t("rows"):
        r = Take(row, where)
        mode = r("mode")
        out.add("bench_issue_pipes", shape, mode, "warp_instr_per_clk_per_sm", r("warp_instr_per_clk_per_sm"))
        out.add("bench_issue_pipes", shape, mode, "clocks_per_pattern", r("clocks_per_pattern"))
        r.done()
    out.add("bench_issue_pipes", shape, "ffma", "implied_clock_hz", t("implied_clock_hz"), unit="Hz")
    t.done()


def gluon_probe(out: Rows, o: dict, where: str):
    t = Take(o, where)
    versions = {"triton": t("triton"), "torch": t("torch")}
    t("gpu")
    for dtype, m in t("mma").items():
        name = v("warpgroup_mma", dtype=dtype.removeprefix("torch."))
        out.add("gluon_probe", "64x64x64", name, "ok", m["ok"])
        out.add("gluon_probe", "64x64x64", name, "max_abs_err", m["max_abs_err"])
    names = t("names")
    missing = [f"{mod}.{n}" for mod, d in names.items() if isinstance(d, dict) for n, ok in d.items() if not ok]
    out.add("gluon_probe", "api", "triton.experimental.gluon", "missing_names", len(missing), unit="count",
            names=names, **versions)
    t.done()


def manifest(out: Rows, records: list, where: str):
    """`sagevideo generate --gpus-per-job 2` manifest lines (tiny model)."""
    for rec in records:
        shape = f"{rec['model']}-{rec['frames']}x{rec['height']}x{rec['width']}-{rec['steps']}steps"
        name = v(f"{rec['attention']}-{rec['pv']}", job=rec["job_id"])
        keep = {k: rec[k] for k in ("prompt", "status", "backends", "worker", "created")}
        for i, (metric, value) in enumerate(rec["timings"].items()):
            out.add("generate", shape, name, metric, value, unit="s", **(keep if i == 0 else {}))


# --- dispatch -----------------------------------------------------------------------------------

def convert(path: Path) -> list[Result]:
    name = path.name
    gpu = "2x NVIDIA H200" if "-h200x2-" in name else "NVIDIA H200"
    out = Rows(name, gpu, name[:10], COMMITS.get(name))
    if path.suffix == ".jsonl":
        manifest(out, [json.loads(line) for line in path.read_text().splitlines() if line.strip()], name)
        return out.rows
    o = json.loads(path.read_text())
    if isinstance(o, dict) and "meta" in o:
        bench_attention(out, o, name)
    elif isinstance(o, dict) and "versions" in o:
        bench_sm90(out, o, name)
    elif name.endswith("-i2f-rejected.json"):
        t = Take(o, name)
        t.ignore("what", "command")
        bench_sm90(out, t("sm90"), name)
        bench_attention(out, t("bench_attention"), name)
        t.done()
    elif name.endswith("-sm90-first.json"):
        t = Take(o, name)
        t.ignore("command")
        bench_sm90(out, t("check"), name)  # --check: small odd shapes, cosines only
        bench_sm90(out, t("bench"), name)
        t.done()
    elif name.endswith("-sm90-one-consumer.json"):
        t = Take(o, name)
        t.ignore("commands")
        bench_sm90(out, t("run1"), name)
        bench_sm90(out, t("run2"), name)
        t.done()
    elif "ulysses" in name:
        if "modes" in o:
            bench_sp(out, o, name)
        else:
            t = Take(o, name)
            t.ignore("command")
            for part in [k for k in o if k.startswith("chunks")]:
                chunks, _, profile = part.removeprefix("chunks").partition("_")
                bench_sp(out, t(part), f"{name}/{part}", chunks=chunks, **({"profile": "on"} if profile else {}))
            t.done()
    elif name.endswith("-batch-throughput.json"):
        bench_batch(out, o, name)
    elif "-forward-" in name:
        bench_transformer(out, o, name)
    elif name.endswith("-dtype-seqlen-cudnn.json"):
        dtype_seqlen(out, o, name)
    elif "-exploratory-ab-" in name or name.endswith("-gluon-scores-by-add-ab.json"):
        plan_variants(out, o, name, bench="adhoc-ab")
    elif name.endswith(("-maxnreg-ab.json", "-plain-d128-r168.json")):
        plan_variants(out, o, name, bench="bench_plan_variants")
    elif "-prep-" in name or name.endswith("-fused-kv-rejected.json"):
        bench_prep(out, o, name)
    elif name.endswith("-opensora768-attention-sustained.json"):
        sustained(out, o, name)
    elif "-issue-pipes" in name:
        issue_pipes(out, o, name)
    elif name.endswith("-gluon-probe.json"):
        gluon_probe(out, o, name)
    elif "-ab-" in name and name.startswith("2026-12-01"):
        bench_ab_commit(out, o, name)
    elif "-edge-" in name:
        edge_cases(out, o, name)
    else:
        raise SystemExit(f"{name}: no converter")
    return out.rows


def derivable_ratio(row: Result, ms: dict) -> bool:
    """A vs_cudnn row equal to ms(cuDNN) / ms(variant) of the same run (`bench.results.speedup`)."""
    if row.metric != "vs_cudnn":
        return False
    mine = ms.get((row.source, row.bench, row.shape, row.variant))
    for baseline in ("sdpa-cudnn", "cudnn", re.sub(r"^[^[]+", "cudnn", row.variant)):
        theirs = ms.get((row.source, row.bench, row.shape, baseline))
        if mine and theirs and abs(theirs / mine - row.value) <= 1e-9 * abs(row.value):
            return True
    return False


def main() -> None:
    files = sorted(p for p in LEGACY.iterdir() if p.suffix in (".json", ".jsonl"))
    rows = [row for path in files for row in convert(path)]
    ms = {(r.source, r.bench, r.shape, r.variant): r.value for r in rows if r.metric == "ms"}
    kept = [r for r in rows if not derivable_ratio(r, ms)]
    print(f"{len(rows) - len(kept)} vs_cudnn rows left out: ms(cuDNN) / ms(variant) of the same run", file=sys.stderr)
    rows = kept
    counts = Counter((r.source, r.bench, r.shape, r.variant, r.metric) for r in rows)
    dupes = [k for k, n in counts.items() if n > 1]
    if dupes:
        raise SystemExit(f"rows not unique: {sorted(dupes)[:5]}")
    DEFAULT.write_text("")
    append(rows, DEFAULT)
    print(f"{len(rows)} rows from {len(files)} files -> {DEFAULT} ({DEFAULT.stat().st_size / 1024:.0f} KiB)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
