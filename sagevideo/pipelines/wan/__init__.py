"""The Wan family (Wan 2.1 and Wan 2.2 through diffusers' `WanPipeline` and
`WanImageToVideoPipeline`): `family` (registered in `sagevideo.pipelines.families`), the built-in
tiny models `tiny-wan`, `tiny-wan22`, `tiny-wan-i2v` and `tiny-wan22-ti2v` (`tiny`), and Ulysses
sequence parallelism around the SDPA interception (`sequence_parallel`)."""
