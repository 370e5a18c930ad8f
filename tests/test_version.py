"""sagevideo/version.py: the version and the installed packages' versions."""

from importlib import metadata

from sagevideo.version import __version__, package_versions


def test_package_versions_reads_metadata_and_says_none_for_a_missing_package():
    found = package_versions(("torch", "no-such-package-sagevideo"))
    assert found == {"torch": metadata.version("torch"), "no-such-package-sagevideo": None}
    assert __version__.count(".") == 2
