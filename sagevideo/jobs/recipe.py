"""`Recipe`: how the transformer runs around its attention (pydantic, no torch).

A batch's recipe is applied once per loaded pipeline, after its attention is installed, in the
order that composes (`sagevideo.pipelines.recipe.apply_recipe`): FP8 linears, then regional
compile, then the step-cache hooks (which wrap the compiled block forwards). The fields are
declared once, in `RecipeOptions`, which `Recipe` and the configs of generate, ab and calibrate
inherit (flat options `--compile`, `--linear`, `--linear-keep`, `--cache`, `--cache-threshold`,
`--compile-backend`); the `sagevideo.generate(..., recipe=Recipe(...))` keyword expands into
them, and a job file's `recipe:` section gives them too (`sagevideo.jobs.files`, `layer_recipe`).

A recipe has one text form, 'NAME=VALUE,...' with the settings that differ from the defaults
(e.g. 'compile=regional,linear=fp8,cache=first-block,cache_threshold=0.1'; several patterns or
steps joined by ';'): `parse_recipe` reads it, `format_recipe` (`Recipe.text()`) writes it, and
each reads back what the other wrote. `sagevideo ab --arm` and `generate(recipe=...)` take it, and
the bench's recipe names are presets of it (`sagevideo.experiments.bench.forward.recipe_name_text`).
`Recipe.label()` is a short display name for reports, not read back.

- compile: "none", or "regional": each transformer block's forward `torch.compile`d on its own
  (the model's `_repeated_blocks` where it declares them), one graph for all blocks, compiled
  code kept in a persistent cache folder (`sagevideo.pipelines.recipe.compile_cache_dir`).
- compile_backend: torch.compile's backend ("inductor"; "eager"/"aot_eager" trace without
  generating code, for machines without a C++ compiler and for tests).
- linear: "bf16" (as loaded), or "fp8": torchao's float8 dynamic activation + weight
  quantization with rowwise scales on the transformer blocks' nn.Linear layers (CUDA sm89+, bf16).
- linear_keep: layer-name patterns (fnmatch, matched against names inside the transformer such
  as "transformer_blocks.0.*") kept in bf16 with linear="fp8", e.g. the first and last block.
- linear_bf16_steps: denoising step indices (negative counts from the end, e.g. [0, -1]) whose
  forwards run the float8 layers with their bf16 weights again, with linear="fp8" (the bf16
  weights are kept beside the float8 ones: those layers' memory grows by half).
- cache: "none", or one of diffusers' step-caching hooks: "first-block" (FirstBlockCache: the
  rest of the blocks are skipped while the first block's residual changes less than
  cache_threshold), "taylorseer" (TaylorSeerCache: blocks' outputs predicted between full steps),
  "pyramid-broadcast" (PyramidAttentionBroadcast: attention outputs reused across steps).
- cache_threshold: first-block's relative-change threshold (default 0.05, diffusers' default);
  only first-block takes one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sagevideo.choices import Cache, Compile, CompileBackend, Linear
from sagevideo.jobs.specs import NotBool

DEFAULT_CACHE_THRESHOLD = 0.05  # diffusers' FirstBlockCacheConfig default
THRESHOLD_CACHES = ("first-block",)  # caches that take cache_threshold
COMPILE_INCOMPATIBLE_CACHES = ("pyramid-broadcast",)  # hooks inside the blocks: see Recipe.problems


# Each setting's type with its help, for `RecipeOptions`, whose fields `Recipe` and the configs of
# generate/ab/calibrate inherit.
CompileOption = Annotated[
    Compile, Field(description="regional: torch.compile each transformer block on its own (none: eager).")
]
CompileBackendOption = Annotated[
    CompileBackend,
    Field(description="torch.compile backend of --compile regional (eager, aot_eager: no code generation)."),
]
LinearOption = Annotated[
    Linear,
    Field(description="fp8: the transformer blocks' linears in torchao float8, rowwise (CUDA sm89+, bfloat16)."),
]
LinearKeepOption = Annotated[
    list[str],
    Field(description="With --linear fp8: layer names kept in bf16 (repeatable; fnmatch patterns on names inside "
          "the transformer, e.g. 'transformer_blocks.0.*')."),
]
LinearBf16StepsOption = Annotated[
    list[int],
    Field(description="With --linear fp8: denoising steps whose linears run in bf16 (one or more, negative counting "
          "from the end: --linear-bf16-steps 0 -1 is the first and last step). Keeps a bf16 copy of the float8 "
          "weights."),
]
CacheOption = Annotated[
    Cache, Field(description="Step caching through diffusers' hooks: first-block, taylorseer, pyramid-broadcast.")
]
CacheThresholdOption = Annotated[
    Annotated[float, NotBool, Field(gt=0, lt=10)] | None,  # NotBool: `cache_threshold: yes` is a mistake, not 1.0
    Field(description="Threshold of --cache first-block: relative change of the first block's "
          "residual below which the other blocks are skipped (default 0.05)."),
]


class RecipeOptions(BaseModel):
    """The recipe's settings as flat options, declared once: `Recipe` is made of them, and the
    configs of generate, ab and calibrate inherit them (their CLI options are made from these
    fields; `sagevideo.cli.common.config_parameters` shows them in their own help panel)."""

    cli_panel: ClassVar[str] = "Speed recipe (docs/recipe.md)"

    compile: CompileOption = "none"
    compile_backend: CompileBackendOption = "inductor"
    linear: LinearOption = "bf16"
    linear_keep: LinearKeepOption = []  # noqa: RUF012 (pydantic copies defaults)
    linear_bf16_steps: LinearBf16StepsOption = []  # noqa: RUF012
    cache: CacheOption = "none"
    cache_threshold: CacheThresholdOption = None

    @field_validator("linear_keep", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else list(value or ())

    @field_validator("linear_bf16_steps", mode="before")
    @classmethod
    def _steps(cls, value: Any) -> Any:
        """'0,-1' or '0;-1' (a job file's or recipe text's spelling), an int, or a list of them."""
        if isinstance(value, str):
            value = [v for v in value.replace(";", ",").split(",") if v.strip()]
        elif isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        return list(value or ())

    @property
    def recipe(self) -> Recipe:
        """These settings as one `Recipe`."""
        return recipe_of(self)


class Recipe(RecipeOptions):
    """The speed settings of a batch (see the module docstring); frozen, picklable (it travels to
    Ray workers and sequence-parallel ranks inside the `RunContext`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @property
    def is_plain(self) -> bool:
        """Whether the recipe changes nothing (eager, bf16 linears, no cache)."""
        return self.compile == "none" and self.linear == "bf16" and self.cache == "none"

    @property
    def threshold(self) -> float | None:
        """The cache threshold that applies (first-block's default when unset), None for other caches."""
        if self.cache not in THRESHOLD_CACHES:
            return None
        return DEFAULT_CACHE_THRESHOLD if self.cache_threshold is None else self.cache_threshold

    def problems(self) -> list[tuple[str, str, str]]:
        """(field, option with its value, what is wrong) for settings that contradict each other
        (what the machine can run is checked by `sagevideo.pipelines.recipe.recipe_problems`)."""
        found = []
        if self.cache_threshold is not None and self.cache not in THRESHOLD_CACHES:
            found.append(("cache_threshold", f"--cache-threshold {self.cache_threshold}",
                          f"only --cache first-block takes a threshold (--cache is {self.cache}); leave it out"))
        if self.linear_keep and self.linear != "fp8":
            found.append(("linear_keep", f"--linear-keep {self.linear_keep[0]}",
                          "keeps layers in bf16 only with --linear fp8; leave it out or add --linear fp8"))
        if self.linear_bf16_steps and self.linear != "fp8":
            found.append(("linear_bf16_steps", f"--linear-bf16-steps {self.linear_bf16_steps[0]}",
                          "runs steps in bf16 only with --linear fp8; leave it out or add --linear fp8"))
        if self.cache in COMPILE_INCOMPATIBLE_CACHES and self.compile != "none":
            # Its hooks sit on the attention layers inside each block, so they are traced into the
            # compiled block: its per-step state becomes guards and every change a recompile, until
            # torch's recompile limit leaves the blocks eager (slower than no compile at all).
            found.append(("cache", f"--cache {self.cache}",
                          f"does not compose with --compile {self.compile} (its hooks inside each block recompile "
                          "it as the cache's state changes); use --compile none with it, or --cache first-block"))
        return found

    def step_problem(self, steps: int) -> str | None:
        """Why linear_bf16_steps cannot apply to a job of `steps` denoising steps, or None."""
        outside = [s for s in self.linear_bf16_steps if not -steps <= s < steps]
        if outside:
            return (f"step {outside[0]} is not one of the job's {steps} steps (0..{steps - 1}, or -{steps}..-1 "
                    "from the end); fix --linear-bf16-steps or the job's steps")
        return None

    def bf16_steps_of(self, steps: int) -> list[int]:
        """linear_bf16_steps as step indices 0..steps-1 of a job of `steps` steps, sorted."""
        return sorted({s % steps for s in self.linear_bf16_steps})

    def settings(self) -> dict[str, Any]:
        """What the manifest records (`ManifestRecord.recipe`): every setting, threshold resolved."""
        data = self.model_dump()
        data["linear_keep"] = list(self.linear_keep)
        # Only when set: a recipe's settings are part of its jobs' ids, which stay what they were.
        if self.linear_bf16_steps:
            data["linear_bf16_steps"] = list(self.linear_bf16_steps)
        else:
            del data["linear_bf16_steps"]
        data["cache_threshold"] = self.threshold
        return data

    def text(self) -> str:
        """The recipe's text form (`format_recipe`), e.g. 'linear=fp8,cache=first-block'."""
        return format_recipe(self)

    def label(self) -> str:
        """A short name for reports (not read back: `text` is): e.g. 'regional+fp8+first-block@0.05', or 'eager'."""
        parts = []
        if self.compile != "none":
            backend = "" if self.compile_backend == "inductor" else f"/{self.compile_backend}"
            parts.append(self.compile + backend)
        if self.linear != "bf16":
            steps = ",".join(map(str, self.linear_bf16_steps))
            parts.append(self.linear + (f"[bf16 steps {steps}]" if steps else ""))
        if self.cache != "none":
            parts.append(self.cache + (f"@{self.threshold:g}" if self.threshold is not None else ""))
        return "+".join(parts) or "eager"


RECIPE_FIELDS: tuple[str, ...] = tuple(Recipe.model_fields)


def recipe_of(config: Any) -> Recipe:
    """The `Recipe` of a config with the recipe's fields as flat options (GenerateConfig, ...)."""
    if isinstance(config, Recipe):
        return config
    return Recipe(**{name: getattr(config, name) for name in RECIPE_FIELDS})


def layer_recipe(given: Recipe, file_settings: Mapping[str, Any]) -> tuple[Recipe, list[str]]:
    """(the recipe, conflicting fields) of options `given` (command line, API) under a job file's
    `recipe:` settings: a file's setting applies where the option is at its default (or equal);
    a field both set to different values is a conflict, left as `given` has it (the caller says
    where each came from: neither wins silently)."""
    update, conflicts = {}, []
    for name, value in file_settings.items():
        mine = getattr(given, name)
        if mine == value or mine == RecipeOptions.model_fields[name].default:
            update[name] = value
        else:
            conflicts.append(name)
    return Recipe(**{**given.model_dump(), **update}), conflicts


def expand_recipe(options: dict[str, Any]) -> dict[str, Any]:
    """Keyword options with a `recipe=` (a Recipe, a mapping of its fields, or 'NAME=VALUE,...'
    text) replaced by its flat fields; a flat field given beside it wins. TypeError for another type."""
    if "recipe" not in options:
        return options
    options = dict(options)
    recipe = options.pop("recipe")
    if recipe is None:
        return options
    if isinstance(recipe, str):
        recipe = parse_recipe(recipe)
    elif not isinstance(recipe, Recipe):
        if not hasattr(recipe, "keys"):
            kind = type(recipe).__name__
            raise TypeError(f"recipe: give a sagevideo.Recipe, a dict of its fields or its text, not {kind}")
        recipe = Recipe(**recipe)
    return {**{name: getattr(recipe, name) for name in RECIPE_FIELDS}, **options}


_LISTS = ("linear_keep", "linear_bf16_steps")  # several values, joined by ';' in the text form


def format_recipe(recipe: Recipe) -> str:
    """The text form of `recipe` (see the module docstring): its settings that differ from the
    defaults, in field order; '' for the plain recipe. `parse_recipe` reads it back."""
    parts = []
    for name in RECIPE_FIELDS:
        value = getattr(recipe, name)
        if value == RecipeOptions.model_fields[name].default:
            continue
        shown = ";".join(map(str, value)) if name in _LISTS else repr(value) if isinstance(value, float) else value
        parts.append(f"{name}={shown}")
    return ",".join(parts)


def parse_recipe(text: str) -> Recipe:
    """A recipe from its text form, e.g. 'compile=regional,linear=fp8,cache=first-block,cache_threshold=0.1'
    (dashes or underscores in names; 'linear_keep=a;b' for several patterns, 'linear_bf16_steps=0;-1'
    for several steps; empty text: the plain recipe). Raises ValueError naming the bad part."""
    data: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in RECIPE_FIELDS:
            raise ValueError(f"{part!r}: give NAME=VALUE with NAME one of {', '.join(RECIPE_FIELDS)}")
        value = value.strip()
        data[name] = [v for v in value.split(";") if v] if name in _LISTS else value
    try:
        return Recipe(**data)
    except Exception as err:  # a pydantic ValidationError: say it in one line
        errors = getattr(err, "errors", None)
        if callable(errors):
            first = errors()[0]
            raise ValueError(f"{first['loc'][0]}: {first['msg']}") from None
        raise
