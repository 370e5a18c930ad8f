"""The worker side of generation: `pipeline_host.PipelineHost` loads a pipeline once and is the one
generation path every runner uses (batches here and on Ray, sequence-parallel ranks, calibration,
the attention probe); `sharded` is a rank's host; `deadline` stops a job at its time limit;
`failpoints` are the named, test-only process deaths checked along the path."""
