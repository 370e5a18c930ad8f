"""Helpers shared by test modules of several folders (imported as `tests.helpers.<name>`; pytest's
`pythonpath = ["."]` puts the repository root on sys.path). Fixtures live in conftest.py files."""
