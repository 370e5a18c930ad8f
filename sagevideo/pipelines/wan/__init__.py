"""The Wan family (Wan 2.1 and Wan 2.2 A14B text-to-video through diffusers' `WanPipeline`):
`family` (registered in `sagevideo.pipelines.families`), the built-in tiny models `tiny-wan` and
`tiny-wan22` (`tiny`), and Ulysses sequence parallelism around the SDPA interception
(`sequence_parallel`)."""
