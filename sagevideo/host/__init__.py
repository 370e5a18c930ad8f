"""The worker side of generation: `pipeline_host.PipelineHost` loads a pipeline once and runs jobs
(staging their outputs); `sharded` runs one job over the ranks of a process group; `deadline`
stops a job at its time limit."""
