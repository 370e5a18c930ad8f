"""Sequence parallelism inside one job (torch.distributed only; no Ray here).

`ulysses`: DeepSpeed-Ulysses-style all-to-all over heads around each attention call;
`launch`: process-group set-up from torchrun-style environment variables, and the rank/size
queries the model families' sharding hooks (`sagevideo.pipelines.<family>.sequence_parallel`) use.
torch.distributed is imported here and nowhere else in the package.
"""
