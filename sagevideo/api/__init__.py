"""User-facing Python API: the attention function, backend records, generation."""
