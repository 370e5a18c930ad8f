"""Job files (YAML, TOML, text): what they mean, and clear errors, by line, before any model loads."""

import json
import textwrap

import pytest

import sagevideo
from sagevideo.errors import InputError
from sagevideo.generation.generate import plan_batch
from sagevideo.jobs.files import read_job_file

SHOTS_YAML = """\
# a studio's shot list
defaults:
  steps: 1
  resolution: 48x32
  negative_prompt: blurry
jobs:
  - prompt: a red panda eating bamboo
    output: shot-010
    seed: 3
  - prompt: waves on black rocks
    resolution: 32x64
    attention: full
  - a bare prompt is a job too
"""

SHOTS_TOML = """\
[defaults]
steps = 1
resolution = "48x32"
negative_prompt = "blurry"

[[jobs]]
prompt = "a red panda eating bamboo"
output = "shot-010"
seed = 3

[[jobs]]
prompt = "waves on black rocks"
resolution = [32, 64]
attention = "full"

[[jobs]]
prompt = "a bare prompt is a job too"
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def jobs_of(plan):
    return [
        (pj.job.prompt, pj.job.seed, pj.job.steps, pj.job.width, pj.job.height, pj.job.attention, pj.job.pv)
        for pj in plan.jobs
    ]


def test_yaml_defaults_and_overrides(tmp_path, no_model_load):
    plan = plan_batch(job_file=write(tmp_path, "shots.yaml", SHOTS_YAML), out=tmp_path / "out")
    assert jobs_of(plan) == [
        ("a red panda eating bamboo", 3, 1, 48, 32, "sage", "fp16"),
        ("waves on black rocks", 0, 1, 32, 64, "full", None),  # its resolution replaces the default
        ("a bare prompt is a job too", 0, 1, 48, 32, "sage", "fp16"),
    ]
    assert {pj.job.negative_prompt for pj in plan.jobs} == {"blurry"}
    assert plan.jobs[0].output == "shot-010.mp4"  # exactly the name given
    assert plan.jobs[2].output.startswith("a-bare-prompt-is-a-job-too-")
    assert [pj.backend for pj in plan.jobs] == ["reference", None, "reference"]
    assert plan.jobs[0].label.endswith("shots.yaml line 7 (job 1)")


def test_toml_means_the_same_as_yaml(tmp_path, no_model_load):
    from_yaml = plan_batch(job_file=write(tmp_path, "shots.yaml", SHOTS_YAML), out=tmp_path / "out")
    from_toml = plan_batch(job_file=write(tmp_path, "shots.toml", SHOTS_TOML), out=tmp_path / "out")
    assert [pj.job_id for pj in from_toml.jobs] == [pj.job_id for pj in from_yaml.jobs]


def test_text_file_and_yaml_list_and_path_argument(tmp_path, no_model_load):
    text = write(tmp_path, "prompts.txt", "# shots\na cat\n\n a dog \n")
    bare = write(tmp_path, "list.yml", "- a cat\n- prompt: a dog\n")
    assert [j[0] for j in jobs_of(plan_batch(text, out=tmp_path / "o"))] == ["a cat", "a dog"]
    assert [j[0] for j in jobs_of(plan_batch(str(bare), out=tmp_path / "o"))] == ["a cat", "a dog"]
    with pytest.raises(InputError, match="job file missing.yaml does not exist"):
        plan_batch("missing.yaml", out=tmp_path / "o")  # a file name, not a prompt to render


def test_precedence_job_over_file_defaults_over_options(tmp_path, no_model_load):
    path = write(tmp_path, "s.yaml", "defaults:\n  seed: 5\njobs:\n  - prompt: a\n  - prompt: b\n    seed: 7\n")
    plan = plan_batch(job_file=path, out=tmp_path / "o", seed=1, steps=3)
    assert [(pj.job.seed, pj.job.steps) for pj in plan.jobs] == [(5, 3), (7, 3)]
    assert any("s.yaml sets seed for 2 of 2 job(s); there it wins over seed=1" in n for n in plan.notes)


def test_plan_path_is_relative_to_the_job_file_recorded_and_applied(tmp_path):
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "p.json").write_text(json.dumps({"version": 1, "default": {"mode": "int8-fp16"}}))
    path = write(tmp_path, "s.yaml", "jobs:\n  - prompt: a cat\n    plan: plans/p.json\n    output: cat\n")
    plan = plan_batch(job_file=path, out=tmp_path / "o")
    (pj,) = plan.jobs
    assert pj.job.plan == str(plans / "p.json") and len(pj.plan_sha256) == 16

    (record,) = sagevideo.generate(path, out=tmp_path / "o", progress=False)
    assert (record["plan"], record["plan_sha256"], record["outputs"]) == (pj.job.plan, pj.plan_sha256, ["cat.mp4"])
    assert record["backends"]["counts"] == {"reference/fp16": 4}  # the plan ran: 2 layers x 2 steps
    assert (tmp_path / "o" / "cat.mp4").is_file()

    # A changed job keeping its output name takes the name (the earlier render is kept under another);
    # the old job's record no longer counts.
    (plans / "p.json").write_text(json.dumps({"version": 1, "default": {"mode": "int8-fp8"}}))
    (again,) = sagevideo.generate(path, out=tmp_path / "o", progress=False)
    assert again["job_id"] != record["job_id"] and again["created"] >= record["created"]
    assert again["backends"]["counts"] == {"reference/fp8": 4}
    (plans / "p.json").write_text(json.dumps({"version": 1, "default": {"mode": "int8-fp16"}}))
    plan = plan_batch(job_file=path, out=tmp_path / "o")
    from sagevideo.generation.resume import decide
    from sagevideo.outputs.manifest import Manifest

    (decision,) = decide(plan, Manifest(plan.manifest_path).records()).decisions
    assert decision.kind != "skip"  # cat.mp4 is the fp8 job's now: the fp16 job is not done


BAD_FILES = [
    # (file name, content, expected message: a regex matched against the whole error)
    ("unknown-field.yaml", "jobs:\n  - prompt: a\n    stpes: 3\n",
     r"line 3 \(job 1\): stpes: unknown field; remove it or check its spelling \(did you mean 'steps'\?\)"),
    ("wrong-type.yaml", "jobs:\n  - prompt: a\n    steps: many\n",
     r"line 3 \(job 1\): steps: Input should be a valid integer.* \(got 'many'\)"),
    ("prompt-not-text.yaml", "jobs:\n  - prompt: 123\n",
     r"line 2 \(job 1\): prompt: Input should be a valid string \(got 123\)"),
    ("bool-steps.yaml", "jobs:\n  - prompt: a\n    steps: yes\n",
     r"line 3 \(job 1\): steps: expected a number, got true"),
    ("bad-frames.yaml", "jobs:\n  - prompt: a\n  - prompt: b\n    frames: 10\n",
     r"line 4 \(job 2\): frames: 10 is not 1 \+ a multiple of 4 .*use 1 \+ a multiple of 8, e\.g\. 9 or 17"),
    ("bad-size.yaml", "jobs:\n  - prompt: a\n    resolution: 720x50\n",
     r"line 3 \(job 1\): height: 50 px is not a multiple of 16 .*use e\.g\. 48 or 64"),
    ("bad-resolution.yaml", "jobs:\n  - prompt: a\n    resolution: big\n",
     r"line 3 \(job 1\): resolution: resolution 'big' is not WIDTHxHEIGHT; give WIDTHxHEIGHT in pixels"),
    ("resolution-and-height.yaml", "jobs:\n  - prompt: a\n    resolution: 64x64\n    height: 32\n",
     r"\(job 1\): resolution: give either resolution or height/width, not both"),
    ("duplicate-output.yaml", "jobs:\n  - prompt: a\n    output: shot\n  - prompt: b\n    output: Shot\n",
     r"line 5 \(job 2\): output: 'Shot' is already the output of .*line 3 \(job 1\); give each job its own"),
    ("unsafe-output.yaml", "jobs:\n  - prompt: a\n    output: ../../etc/passwd\n",
     r"line 3 \(job 1\): output: output '../../etc/passwd' is not a plain file name; use ASCII letters "
     r"\(A-Z, a-z\), digits"),
    ("accented-output.yaml", "jobs:\n  - prompt: a\n    output: café\n",  # a letter, but not an ASCII one
     r"output: output 'café' is not a plain file name; use ASCII letters \(A-Z, a-z\), digits"),
    ("hidden-output.yaml", "jobs:\n  - prompt: a\n    output: .bashrc\n", r"output: output '.bashrc' is not a plain"),
    ("empty-jobs.yaml", "defaults:\n  steps: 2\njobs: []\n", r"line 3 \(jobs\): 'jobs' is empty; add at least one job"),
    ("no-jobs.yaml", "defaults:\n  steps: 2\n", r"no 'jobs' list; add jobs: with at least one job"),
    ("empty-file.yaml", "", r"no 'jobs' list"),
    ("yaml-syntax.yaml", "jobs:\n  - prompt: a\n  - prompt: two: colons\n",
     r"line 3, column 16: YAML syntax error: mapping values are not allowed here; check the indentation, "
     r"and quote text that contains ': '"),
    ("toml-syntax.toml", "[[jobs]]\nprompt = a cat\n",
     r"toml-syntax\.toml line 2, column 10: TOML syntax error: Invalid value; check that text is quoted"),
    ("toml-field.toml", "[defaults]\nsteps = 2\n\n[[jobs]]\nprompt = \"a\"\n\n[[jobs]]\nprompt = \"b\"\nseed = -4\n",
     r"line 9 \(job 2\): seed: Input should be greater than or equal to 0 \(got -4\)"),
    ("missing-prompt.yaml", "jobs:\n  - prompt: a\n  - seed: 1\n",
     r"line 3 \(job 2\): prompt: missing; every job needs a prompt"),
    ("negative-steps.yaml", "jobs:\n  - prompt: a\n    steps: -2\n",
     r"line 3 \(job 1\): steps: Input should be greater than or equal to 1 \(got -2\)"),
    ("unknown-attention.yaml", "jobs:\n  - prompt: a\n    attention: fast\n",
     r"line 3 \(job 1\): attention: Input should be 'sage' or 'full' \(got 'fast'\)"),
    ("duplicate-key.yaml", "jobs:\n  - prompt: a\n    seed: 1\n    seed: 2\n",
     r"line 4: 'seed' appears twice in the same table \(first on line 3\); keep one"),
    ("unknown-section.yaml", "job:\n  - prompt: a\n",
     r"line 1 \(top level\): 'job': unknown section; use 'recipe', 'defaults' and 'jobs' \(did you mean 'jobs'\?\)"),
    ("missing-plan.yaml", "jobs:\n  - prompt: a\n    plan: nope.json\n",
     r"line 3 \(job 1\): plan: .*nope\.json does not exist; give the path of an attention-plan JSON"),
    ("plan-not-json.yaml", "jobs:\n  - prompt: a\n    plan: missing-plan.yaml\n", r"plan: .*: not valid JSON"),
    ("default-output.yaml", "defaults:\n  output: same\njobs:\n  - prompt: a\n",
     r"line 2 \(defaults\): output: cannot be a default \(every job would get the same output\)"),
    ("job-not-a-table.yaml", "jobs:\n  - [a, b]\n", r"line 2 \(job 1\): a job must be a prompt or a table of fields"),
    ("yaml-in-txt.txt", "# my shots\njobs:\n  - prompt: a\n", r"line 2: looks like a YAML/TOML job file"),
    # The safe loader builds no Python objects from tags.
    ("python-tag.yaml", "jobs:\n  - prompt: !!python/object/apply:os.system [ls]\n",
     r"line 2, column 13: YAML tag not allowed: could not determine a constructor"),
]


@pytest.mark.parametrize("name, content, message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_job_files_are_refused_with_line_and_fix(tmp_path, no_model_load, name, content, message):
    if name == "plan-not-json.yaml":
        write(tmp_path, "missing-plan.yaml", "not: json")
    path = write(tmp_path, name, content)
    with pytest.raises(InputError, match=message):
        plan_batch(job_file=path, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before even the output folder was made


def test_a_bad_default_is_reported_once_at_its_line(tmp_path, no_model_load):
    path = write(tmp_path, "d.yaml", "defaults:\n  frames: 10\n  steps: 0\njobs:\n  - a\n  - b\n  - c\n")
    with pytest.raises(InputError) as err:
        plan_batch(job_file=path, out=tmp_path / "out")
    assert str(err.value).splitlines() == [  # each bad default once, the model's rule on frames too
        f"{path} line 3 (defaults): steps: Input should be greater than or equal to 1 (got 0)",
        f"{path} line 2 (defaults): frames: 10 is not 1 + a multiple of 4 (the VAE compresses time 4x); "
        "use 1 + a multiple of 8, e.g. 9 or 17",
    ]
    path.write_text("defaults:\n  frames: 10\njobs:\n  - a\n  - b\n  - c\n")
    with pytest.raises(InputError) as err:  # a model rule on an inherited value: one line, at the default
        plan_batch(job_file=path, out=tmp_path / "out")
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{path} line 2 (defaults): frames: 10 is not 1 + a multiple of 4")


def test_every_problem_of_a_file_at_once(tmp_path, no_model_load):
    path = write(tmp_path, "many.yaml", "jobs:\n  - prompt: a\n    seed: -1\n  - prompt: b\n    pv: fp4\n")
    with pytest.raises(InputError) as err:
        plan_batch(job_file=path, out=tmp_path / "out")
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and "line 3 (job 1): seed" in lines[0] and "line 5 (job 2): pv" in lines[1]


def test_read_job_file_keeps_lines_for_inherited_fields(tmp_path):
    path = write(tmp_path, "s.yaml", SHOTS_YAML)
    items = read_job_file(path).items
    (fields, origin) = items[2]
    assert fields == {
        "steps": 1, "resolution": "48x32", "negative_prompt": "blurry", "prompt": "a bare prompt is a job too"
    }
    assert origin.at("height") == f"{path} line 4 (defaults)" and origin.at("prompt") == f"{path} line 13 (job 3)"


def test_a_bad_default_hides_no_job_problem_and_a_bad_resolution_hides_no_field(tmp_path, no_model_load):
    path = write(
        tmp_path,
        "all.yaml",
        "defaults:\n  steps: -3\n  guidance: .nan\njobs:\n  - prompt: a fox\n    resolution: 12x\n    seed: -1\n"
        "    frames: 0\n  - prompt: ok\n    pv: fp9\n",
    )
    with pytest.raises(InputError) as err:
        plan_batch(job_file=path, out=tmp_path / "out")
    assert str(err.value).splitlines() == [
        f"{path} line 2 (defaults): steps: Input should be greater than or equal to 1 (got -3)",
        f"{path} line 3 (defaults): guidance: Input should be a finite number (got nan)",  # not "<= 100"
        f"{path} line 6 (job 1): resolution: resolution '12x' is not WIDTHxHEIGHT; give WIDTHxHEIGHT in pixels, "
        "e.g. 720x480, or [720, 480]",
        f"{path} line 7 (job 1): seed: Input should be greater than or equal to 0 (got -1)",
        f"{path} line 8 (job 1): frames: Input should be greater than or equal to 1 (got 0)",
        f"{path} line 10 (job 2): pv: Input should be 'fp16' or 'fp8' (got 'fp9')",
    ]


def test_bad_options_are_named_as_options_beside_the_file_problems(tmp_path, no_model_load):
    path = write(tmp_path, "s.yaml", "jobs:\n  - prompt: a\n    seed: -1\n  - prompt: b\n")
    with pytest.raises(InputError) as err:
        plan_batch(job_file=path, out=tmp_path / "out", steps=0, frames=8)
    assert str(err.value).splitlines() == [
        "--steps 0: Input should be greater than or equal to 1",
        f"{path} line 3 (job 1): seed: Input should be greater than or equal to 0 (got -1)",
        "--frames 8: 8 is not 1 + a multiple of 4 (the VAE compresses time 4x); use 1 + a multiple of 8, e.g. 1 or 9",
    ]


# --- the recipe: section ---------------------------------------------------------------------------

RECIPE_YAML = """\
recipe:
  cache: first-block
  cache-threshold: 5        # dashes or underscores, as --cache-threshold
  compile: regional
  compile_backend: eager    # eager traces without a C++ compiler
defaults:
  steps: 3
jobs:
  - prompt: a red panda
"""

RECIPE_TOML = """\
[recipe]
cache = "first-block"
cache_threshold = 5.0
compile = "regional"
compile-backend = "eager"

[defaults]
steps = 3

[[jobs]]
prompt = "a red panda"
"""


def test_a_recipe_section_is_the_batchs_recipe_in_yaml_and_toml(tmp_path):
    path = write(tmp_path, "r.yaml", RECIPE_YAML)
    (record,) = sagevideo.generate(path, out=tmp_path / "o", progress=False)
    assert record["status"] == "done", record["error"]
    got = record["recipe"]
    assert (got["cache"], got["cache_threshold"], got["compile"], got["compile_backend"], got["compiled_blocks"]) == (
        "first-block", 5.0, "regional", "eager", 2)
    assert (got["cache_forwards"], got["cache_skipped"]) == (3, 2)  # the recipe really ran, not only recorded
    from_toml = plan_batch(job_file=write(tmp_path, "r.toml", RECIPE_TOML), out=tmp_path / "o")
    assert from_toml.settings.recipe.settings() == {k: got[k] for k in from_toml.settings.recipe.settings()}
    assert [pj.job_id for pj in from_toml.jobs] == [record["job_id"]]  # the same recipe: the same job
    assert read_job_file(path).recipe.at("compile") == f"{path} line 4 (recipe)"


def test_the_files_recipe_fills_options_left_at_their_default_and_a_different_value_is_an_error(
    tmp_path, no_model_load
):
    path = write(tmp_path, "r.yaml", RECIPE_YAML)
    alone = plan_batch(job_file=path, out=tmp_path / "o")
    given = plan_batch(job_file=path, out=tmp_path / "o", linear_keep=[], cache="first-block", cache_threshold=5)
    assert given.settings.recipe == alone.settings.recipe  # the same value in both places: no conflict
    plain = plan_batch(job_file=path, out=tmp_path / "o", use_file_recipe=False)  # ab's full-precision arms
    assert plain.settings.recipe.is_plain and plain.jobs[0].job_id != alone.jobs[0].job_id
    with pytest.raises(InputError) as err:
        plan_batch(job_file=path, out=tmp_path / "o", cache="taylorseer", compile_backend="aot_eager")
    assert str(err.value).splitlines() == [
        f"{path} line 2 (recipe): cache: the job file's recipe sets 'first-block' and --cache taylorseer is given "
        "too; set it in one place (the file's recipe applies where the option is left out)",
        f"{path} line 5 (recipe): compile_backend: the job file's recipe sets 'eager' and --compile-backend "
        "aot_eager is given too; set it in one place (the file's recipe applies where the option is left out)",
    ]
    with pytest.raises(InputError, match="the job file's recipe sets 'first-block' and --cache taylorseer"):
        sagevideo.generate(path, out=tmp_path / "o", recipe="cache=taylorseer")  # the API's recipe= alike


RECIPE_PROBLEMS = [
    # (file name, content, the error's lines)
    ("values.yaml", "recipe:\n  compile: always\n  linear_keep: [1]\n  cache_threshold: yes\njobs:\n  - a\n", [
        "line 2 (recipe): compile: Input should be 'none' or 'regional' (got 'always')",
        "line 3 (recipe): linear_keep.0: Input should be a valid string (got 1)",
        "line 4 (recipe): cache_threshold: expected a number, got true (got True)",
    ]),
    ("names.yaml", "recipe:\n  cach: first-block\n  steps: 3\n  cache: none\n  linear-keep: a\n  linear_keep: b\n"
     "jobs:\n  - a\n", [
        "line 2 (recipe): cach: unknown recipe setting; use compile, compile_backend, linear, linear_keep, "
        "linear_bf16_steps, cache, cache_threshold (did you mean 'cache'?)",
        "line 3 (recipe): steps: a job field, not a recipe setting; put it under defaults: (every job) or on a job",
        "line 6 (recipe): linear_keep: given twice (also as linear-keep); keep one",
        "line 5 (recipe): linear_keep: keeps layers in bf16 only with --linear fp8; leave it out or add --linear fp8",
    ]),
    ("not-a-table.toml", "recipe = \"linear=fp8\"\n\n[[jobs]]\nprompt = \"a\"\n", [
        "line 1 (recipe): 'recipe' must be a table of settings (compile, compile_backend, linear, linear_keep, "
        "linear_bf16_steps, cache, cache_threshold), got a string",
    ]),
    ("contradiction.toml", "[recipe]\ncache = \"taylorseer\"\ncache_threshold = 0.2\n\n[[jobs]]\nprompt = \"a\"\n", [
        "line 3 (recipe): cache_threshold: only --cache first-block takes a threshold (--cache is taylorseer); "
        "leave it out",
    ]),
    ("cpu-fp8.yaml", "recipe:\n  linear: fp8\njobs:\n  - a\n", [
        "line 2 (recipe): linear: float8 linears need a CUDA GPU with FP8 tensor cores (sm89+), not cpu; or use "
        "--linear bf16",
    ]),
]
MISPLACED = ("a recipe setting, which applies to the whole batch (once per loaded model, part of every job's id); "
             "put it in the file's top-level recipe: section ([recipe] in TOML)")
RECIPE_PROBLEMS += [
    ("misplaced.yaml", "compile: regional\ndefaults:\n  cache: first-block\n  steps: 0\njobs:\n  - prompt: a\n"
     "    linear-keep: x\n    seed: -1\n", [
        f"line 1 (top level): compile: {MISPLACED}",
        f"line 3 (defaults): cache: {MISPLACED}",
        "line 4 (defaults): steps: Input should be greater than or equal to 1 (got 0)",
        f"line 7 (job 1): linear-keep: {MISPLACED}",
        "line 8 (job 1): seed: Input should be greater than or equal to 0 (got -1)",  # the job's own problems too
    ]),
    ("misplaced.toml", "[defaults]\ncompile_backend = \"eager\"\n\n[[jobs]]\nprompt = \"a\"\n"
     "cache = \"first-block\"\n", [
        f"line 2 (defaults): compile_backend: {MISPLACED}",
        f"line 6 (job 1): cache: {MISPLACED}",
    ]),
]


@pytest.mark.parametrize("name, content, lines", RECIPE_PROBLEMS, ids=[p[0] for p in RECIPE_PROBLEMS])
def test_recipe_problems_are_said_at_their_lines_with_the_others_before_loading(
    tmp_path, no_model_load, name, content, lines
):
    path = write(tmp_path, name, content)
    with pytest.raises(InputError) as err:
        plan_batch(job_file=path, out=tmp_path / "out", device="cpu")
    assert str(err.value).splitlines() == [f"{path} {line}" for line in lines]
    assert not (tmp_path / "out").exists()


JOB_FILES_AS_TEXT = [
    ("shots.txt", "defaults: {steps: 2}\njobs:\n  - prompt: a red fox\n", 1,
     "'defaults: {steps: 2}' (and 1 more such line)"),
    ("shots", "# notes\n[defaults]\nsteps = 2\n\n[[jobs]]\nprompt = \"a\"\n", 2, "'[defaults]' (and 1 more such line)"),
    ("list.txt", "- prompt: a red fox\n  seed: 3\n- prompt: waves\n", 1,
     "'- prompt: a red fox' (and 1 more such line)"),
    ("quoted-keys.txt", "\"jobs\": [\"a fox\"]\n", 1, "'\"jobs\": [\"a fox\"]'"),
    ("flow.md", "{jobs: [a fox, waves]}\n", 1, "'{jobs: [a fox, waves]}'"),
]


@pytest.mark.parametrize("name, content, line, shown", JOB_FILES_AS_TEXT, ids=[f[0] for f in JOB_FILES_AS_TEXT])
def test_a_job_file_under_another_extension_is_refused_not_made_into_prompt_videos(
    tmp_path, no_model_load, name, content, line, shown
):
    path = write(tmp_path, name, content)
    for given in ({"job_file": path}, {"prompts_file": path}):  # the CLI's argument and the API's prompts_file
        with pytest.raises(InputError) as err:
            plan_batch(**given, out=tmp_path / "out")
        assert str(err.value) == (
            f"{path} line {line}: looks like a YAML/TOML job file ({shown}) but is read as one prompt per line, as any "
            "file not named .yaml/.yml/.toml is; if it is a job file, name it .yaml (or .toml), if these are prompts, "
            "put such a line in quotes")
    assert not (tmp_path / "out").exists()


def test_prompts_that_merely_mention_jobs_or_defaults_are_prompts(tmp_path, no_model_load):
    path = write(tmp_path, "prompts.txt", "jobs:the film\n\"defaults: a fox\"\n  jobs = a title card\nsteve jobs: a "
                 "biopic\n- a bullet prompt\n")
    plan = plan_batch(job_file=path, out=tmp_path / "out")
    assert [pj.job.prompt for pj in plan.jobs] == ["jobs:the film", '"defaults: a fox"', "jobs = a title card",
                                                    "steve jobs: a biopic", "- a bullet prompt"]


ARM_FIELDS = ("attention", "pv", "plan")


@pytest.mark.parametrize(("name", "text"), [
    ("arms.yaml", "defaults:\n  pv: fp8\njobs:\n  - prompt: a\n    attention: full\n  - b\n"),
    ("arms.toml",
     "[defaults]\npv = \"fp8\"\n\n[[jobs]]\nprompt = \"a\"\nattention = \"full\"\n\n[[jobs]]\nprompt = \"b\"\n"),
])
def test_fields_set_in_names_where_a_file_sets_them(tmp_path, name, text):
    from sagevideo.jobs.files import fields_set_in

    assert fields_set_in(write(tmp_path, name, text), ARM_FIELDS) == ["defaults.pv", "job 1: attention"]


def test_fields_set_in_passes_over_text_and_unparsable_files(tmp_path):
    from sagevideo.jobs.files import fields_set_in

    assert fields_set_in(write(tmp_path, "prompts.txt", "attention: full\n"), ARM_FIELDS) == []
    assert fields_set_in(write(tmp_path, "broken.toml", "[[jobs]]\nattention = full\n"), ARM_FIELDS) == []
    assert fields_set_in(tmp_path / "missing.yaml", ARM_FIELDS) == []


def test_toml_is_read_with_tomli_where_tomllib_is_missing(tmp_path, monkeypatch):
    """Python 3.10 has no tomllib: its backport tomli reads TOML job files (and the fields ab checks)."""
    import importlib
    import sys

    from sagevideo.jobs.files import fields_set_in

    reader = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    monkeypatch.setitem(sys.modules, "tomllib", None)  # `import tomllib` raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "tomli", reader)  # the backport: the same API
    path = write(tmp_path, "jobs.toml", "[[jobs]]\nprompt = \"a\"\nattention = \"full\"\n")
    assert fields_set_in(path, ARM_FIELDS) == ["job 1: attention"]
    assert [value["prompt"] for value, _ in read_job_file(path).items] == ["a"]


def test_toml_without_tomllib_or_tomli_is_refused_not_passed_over(tmp_path, monkeypatch):
    import sys

    from sagevideo.jobs.files import fields_set_in

    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    path = write(tmp_path, "jobs.toml", "[[jobs]]\nprompt = \"a\"\nattention = \"full\"\n")
    with pytest.raises(InputError, match=r"needs tomllib \(Python 3.11\+\) or tomli: pip install tomli"):
        fields_set_in(path, ARM_FIELDS)
    with pytest.raises(InputError, match="pip install tomli"):
        read_job_file(path)
