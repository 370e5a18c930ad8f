#!/usr/bin/env bash
# One GPU call for issue 21: where the ~57 ms a denoising step takes beyond its transformer
# forward goes. 1. bench_video's stock arm over 12 steps with 4 profiled (the device's idle gaps
# and the CPU ops in them); 2. the parts of CogVideoXDPMScheduler.step alone at the 5B video's
# latent shape, the device idle before and after each: the CPU noise draw, its copy to the
# device, the whole step.
# Usage (repo root, on the H200, .site.tar.xz and .tao carried): bash tools/gpu_step_gap_check.sh COMMIT
set -uo pipefail
GPU_ENV_BYTECODE=1 source tools/gpu_env.sh "$1"
SECONDS=0
timeout 300 python3 -m bench.bench_video --work /tmp/bench-video --arms stock --steps 12 --profile-steps 4 \
  --json $OUT/gap.json > $OUT/gap.txt 2>&1; echo "gap rc=$? at ${SECONDS}s"
timeout 120 python3 - > $OUT/parts.txt 2>&1 <<'PY'
import time, torch
from diffusers import CogVideoXDPMScheduler
shape = (1, 13, 16, 60, 90)
def timed(fn, n=5):
    out = []
    for _ in range(n):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e3)
    return f"min {min(out):.2f} ms, median {sorted(out)[n // 2]:.2f} ms"
gen = torch.Generator("cpu").manual_seed(0)
print("cpu randn fp32:", timed(lambda: torch.randn(shape, generator=gen)))
noise = torch.randn(shape)
print("copy to device (pageable):", timed(lambda: noise.to("cuda")))
pinned = noise.pin_memory()
print("copy to device (pinned, non_blocking):", timed(lambda: pinned.to("cuda", non_blocking=True)))
sched = CogVideoXDPMScheduler(snr_shift_scale=1.0, timestep_spacing="trailing", rescale_betas_zero_snr=True,
                              prediction_type="v_prediction", beta_schedule="scaled_linear", beta_start=0.00085,
                              beta_end=0.012, clip_sample=False, set_alpha_to_one=True)
sched.set_timesteps(50, device="cuda")
ts = sched.timesteps
x = torch.randn(shape, device="cuda"); out = torch.randn(shape, device="cuda"); old = torch.randn(shape, device="cuda")
print("scheduler.step (2 draws):", timed(lambda: sched.step(out, old, ts[10], ts[9], x, generator=gen, return_dict=False)))
print("scheduler.step, a CUDA generator:", timed(lambda: sched.step(out, old, ts[10], ts[9], x,
      generator=torch.Generator("cuda").manual_seed(0), return_dict=False)))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    sched.step(out, old, ts[10], ts[9], x, generator=gen, return_dict=False); torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=14))
PY
echo "parts rc=$? at ${SECONDS}s"
grep -A7 "profiled" $OUT/gap.txt | cut -c1-240; grep "stock:" $OUT/gap.txt | cut -c1-300; head -5 $OUT/parts.txt
