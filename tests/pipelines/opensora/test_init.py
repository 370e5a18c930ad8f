"""Public names: importable from sagevideo.pipelines, without `import sagevideo` pulling in diffusers."""

import subprocess
import sys


def test_importing_the_packages_does_not_import_diffusers():
    code = (
        "import sys, sagevideo, sagevideo.pipelines, sagevideo.pipelines.opensora\n"
        "assert 'diffusers' not in sys.modules and 'transformers' not in sys.modules, 'eager import'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_public_names():
    from sagevideo.pipelines import OpenSoraPipeline, OpenSoraTransformer3DModel, convert_official_state_dict
    from sagevideo.pipelines.opensora import SageOpenSoraAttnProcessor, load_official_checkpoint
    from sagevideo.pipelines.opensora.processor import OpenSoraAttnProcessor  # where install() looks for the pair

    assert OpenSoraPipeline.__name__ == "OpenSoraPipeline"
    assert OpenSoraTransformer3DModel.__module__ == "sagevideo.pipelines.opensora.transformer"
    assert callable(convert_official_state_dict) and callable(load_official_checkpoint)
    assert OpenSoraAttnProcessor is not SageOpenSoraAttnProcessor
