"""The driver side of generation: plan a batch (`plan`, with memory estimates from `estimate` and
`budget`), run it here or through `sagevideo.scheduling` (`run`), and the Python `generate`."""
