"""Where each evaluation metric's weights live, and whether they are there. Nothing is downloaded.

One folder holds every metric's weights (`--weights DIR`, else `$SAGEVIDEO_WEIGHTS`, else
`~/.cache/sagevideo/weights`):

    DIR/clip-vit-base-patch32/   CLIP ViT-B/32 in Hugging Face form (config.json, model.safetensors,
                                 tokenizer and preprocessor files): CLIPSIM, CLIP-T
    DIR/lpips/alexnet-owt-7be5be79.pth     torchvision's ImageNet AlexNet (LPIPS backbone; LPIPS's
                                 linear layers ship inside torchmetrics)
    DIR/lpips/vgg16-397923af.pth           the same for `lpips_net="vgg"`
    DIR/inception/weights-inception-2015-12-05-6726825d.pth   torch-fidelity's FID Inception v3

`check(weights_dir)` says per metric what is present, missing and present but unloadable (each
present file is opened the safe way: safetensors headers, `torch.load(weights_only=True)`, JSON);
`sagevideo check-weights` prints it. A metric whose files are missing or broken is skipped by
`sagevideo eval` with one line, and the other metrics still run.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

WEIGHTS_ENV = "SAGEVIDEO_WEIGHTS"
CLIP_FOLDER = "clip-vit-base-patch32"
LPIPS_FILES = {"alex": "alexnet-owt-7be5be79.pth", "vgg": "vgg16-397923af.pth"}
INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"

# Every metric `sagevideo eval` knows, in report order.
METRICS = ("psnr", "ssim", "lpips", "clipsim", "clip_t", "fid", "kid")


def default_weights_dir() -> Path:
    """`$SAGEVIDEO_WEIGHTS`, else ~/.cache/sagevideo/weights."""
    env = os.environ.get(WEIGHTS_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sagevideo" / "weights"


@dataclass
class WeightStatus:
    """One metric's weights: the files it needs (relative to the weights folder) and which exist.

    alternatives: lists of files of which one suffices (model.safetensors or pytorch_model.bin).
    package_problem: a Python package the metric needs that cannot be imported ("" when fine).
    """

    metrics: tuple[str, ...]
    what: str
    source: str
    required: list[str] = field(default_factory=list)
    alternatives: list[list[str]] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    package_problem: str = ""
    broken: dict[str, str] = field(default_factory=dict)  # present file -> why it cannot be loaded

    @property
    def ok(self) -> bool:
        return not self.missing and not self.package_problem and not self.broken

    def skip_line(self, weights_dir: Path) -> str:
        """The one line `sagevideo eval` prints when it skips these metrics."""
        names = "/".join(self.metrics)
        if self.missing:
            return (
                f"{names}: skipped, weights missing in {weights_dir}: {', '.join(self.missing)} "
                "(run `sagevideo check-weights` for where to get them)"
            )
        if self.broken:
            name, why = next(iter(self.broken.items()))
            return f"{names}: skipped, {weights_dir / name} cannot be loaded ({why}); copy it again ({self.source})"
        return f"{names}: skipped, {self.package_problem}"


def _clip_status(root: Path) -> WeightStatus:
    folder = f"{CLIP_FOLDER}/"
    status = WeightStatus(
        metrics=("clipsim", "clip_t"),
        what="CLIP ViT-B/32 (Hugging Face form)",
        source=f"copy the files of the Hugging Face model openai/clip-vit-base-patch32 into {folder}",
        required=[folder + name for name in ("config.json", "preprocessor_config.json", "tokenizer_config.json")],
        alternatives=[
            [folder + "model.safetensors", folder + "pytorch_model.bin"],
            [folder + "tokenizer.json", folder + "vocab.json"],
        ],
    )
    # transformers >= 5 saves the image-processor settings into processor_config.json
    if (
        not (root / folder / "preprocessor_config.json").is_file()
        and (root / folder / "processor_config.json").is_file()
    ):
        status.required[1] = folder + "processor_config.json"
    return _fill(status, root)


def _lpips_status(root: Path, net: str) -> WeightStatus:
    name = f"lpips/{LPIPS_FILES[net]}"
    status = WeightStatus(
        metrics=("lpips",),
        what=f"LPIPS backbone: torchvision's ImageNet {'AlexNet' if net == 'alex' else 'VGG16'} weights",
        source=(
            f"the file torchvision caches as $TORCH_HOME/hub/checkpoints/{LPIPS_FILES[net]} after "
            f"torchvision.models.{'alexnet' if net == 'alex' else 'vgg16'}(weights='IMAGENET1K_V1'); "
            "LPIPS's own linear layers ship with torchmetrics"
        ),
        required=[name],
    )
    return _fill(status, root)


def _inception_status(root: Path) -> WeightStatus:
    status = WeightStatus(
        metrics=("fid", "kid"),
        what="FID Inception v3 (torch-fidelity's port of the TF 2015-12-05 graph)",
        source=f"torch-fidelity's release file {INCEPTION_FILE} (what it caches under $TORCH_HOME/hub/checkpoints/)",
        required=[f"inception/{INCEPTION_FILE}"],
        package_problem=fidelity_problem(),
    )
    return _fill(status, root)


def fidelity_problem() -> str:
    """Why torch-fidelity (needed for the Inception network) cannot be used here, or ""."""
    if importlib.util.find_spec("torch_fidelity") is None:
        return (
            "the Inception network needs the torch-fidelity package: pip install 'sagevideo[fid]' "
            "(it needs a torchvision built for your torch)"
        )
    try:
        import torch_fidelity  # noqa: F401
    except Exception as err:  # e.g. a torchvision wheel built for another torch
        return f"torch-fidelity is installed but cannot be imported ({type(err).__name__}: {err})"
    return ""


def _fill(status: WeightStatus, root: Path) -> WeightStatus:
    for name in status.required:
        (status.present if (root / name).is_file() else status.missing).append(name)
    for group in status.alternatives:
        found = [name for name in group if (root / name).is_file()]
        if found:
            status.present.append(found[0])
        else:
            status.missing.append(" or ".join(group))
    for name in status.present:
        problem = load_problem(root / name)
        if problem:
            status.broken[name] = problem
    return status


def load_problem(path: Path) -> str:
    """Why a weights or config file cannot be loaded, or "": safetensors by its header (offsets
    checked against the file size), torch files with `weights_only=True` (memory-mapped: no data
    read), JSON by parsing. Never unpickles anything but tensors and plain containers."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    f.get_slice(key).get_shape()
        elif suffix in (".pth", ".pt", ".bin"):
            import torch

            try:
                torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:
                if "mmap" not in str(err):
                    raise
                torch.load(path, map_location="cpu", weights_only=True)  # an older, non-zip torch file
        elif suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
    except Exception as err:  # every way a file can be broken: truncated, another format, foreign pickles
        return torch_load_reason(err)
    return ""


def torch_load_reason(err: BaseException) -> str:
    """A short reason for a failed load. torch's refusal of a pickle with other objects advises
    `weights_only=False`, which can run arbitrary code: that advice is never passed on."""
    text = str(err)
    if "Unsupported global" in text:
        return "it holds Python objects besides tensors, which are not unpickled here (a plain state dict is needed)"
    if type(err).__name__ == "UnpicklingError" or "weights_only" in text:
        return "not a readable torch weights file: corrupt, truncated or another format"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__)
    return f"{type(err).__name__}: {first.split('. ', 1)[0][:160]}"  # its first sentence


def check(weights_dir: str | Path | None = None, *, lpips_net: str = "alex") -> list[WeightStatus]:
    """Per metric group (CLIP, LPIPS, Inception): the files needed under `weights_dir`, present and missing."""
    root = Path(weights_dir).expanduser() if weights_dir is not None else default_weights_dir()
    return [_clip_status(root), _lpips_status(root, lpips_net), _inception_status(root)]


def status_for(metric: str, statuses: list[WeightStatus]) -> WeightStatus | None:
    """The weight status of `metric` (None for metrics without weights: psnr, ssim)."""
    return next((s for s in statuses if metric in s.metrics), None)


def report_lines(weights_dir: str | Path | None = None, *, lpips_net: str = "alex") -> tuple[list[str], bool]:
    """(lines for `sagevideo check-weights`, every metric usable)."""
    root = Path(weights_dir).expanduser() if weights_dir is not None else default_weights_dir()
    statuses = check(root, lpips_net=lpips_net)
    where = "--weights" if weights_dir is not None else f"${WEIGHTS_ENV} or the default"
    lines = [f"weights folder: {root} ({where}){'' if root.is_dir() else ' (does not exist yet)'}"]
    lines.append("psnr, ssim: no weights needed (always run)")
    for s in statuses:
        state = "ready" if s.ok else (
            "missing files" if s.missing else "broken files" if s.broken else "package missing"
        )
        lines.append(f"{', '.join(s.metrics)}: {state} - {s.what}")
        for name in s.present:
            if name in s.broken:
                lines.append(f"    BROKEN   {root / name} ({s.broken[name]})")
            else:
                lines.append(f"    present  {root / name}")
        for name in s.missing:
            lines.append(f"    MISSING  {root / name}")
        if s.missing or s.broken:
            lines.append(f"    get it:  {s.source}")
        if s.package_problem:
            lines.append(f"    package: {s.package_problem}")
    usable = [m for m in METRICS if (st := status_for(m, statuses)) is None or st.ok]
    lines.append(f"usable now: {', '.join(usable)}; nothing is ever downloaded")
    return lines, len(usable) == len(METRICS)
