"""Sequence parallelism inside one job (torch.distributed only; no Ray here).

`ulysses`: DeepSpeed-Ulysses-style all-to-all over heads around each attention call;
`cogvideox`: sharding a CogVideoX transformer's video tokens across ranks;
`launch`: process-group set-up from torchrun-style environment variables.
"""
