"""The numeric constants the kernels and the reference share, as plain Python numbers.

Importable without triton (the reference and the simulator use them); the Triton and Gluon kernels
wrap the ones they read in `tl.constexpr`/`gl.constexpr`.
"""

from __future__ import annotations

import math

LOG2E = 1.4426950408889634  # log2(e): sm_scale·log2(e) is folded into Q's scale, so softmax uses exp2
LN2 = 0.6931471805599453  # ln(2): the kernels' log2-unit LSE back to natural log

INT8_MAX = 127.0  # symmetric INT8 codes lie in [-127, 127]
FP8_MAX = 448.0  # largest finite float8 e4m3fn value
LOG2_FP8_MAX = math.log2(FP8_MAX)  # P is computed pre-scaled by 448 (this is folded into the row max)

# Floor of a row's score scale q_scale·k_scale (the smallest normal fp32): a product that underflows
# to 0 would turn masked scores into −inf·0 = NaN where the kernels scale after the max.
MIN_ROW_SCALE = 1.1754943508222875e-38
# A group whose max|x| is below this is quantized as if its max were this: its reciprocal scale
# (127/max, 448/max) then stays finite (an inf one turned codes into inf/NaN). Only denormal-range
# inputs (bf16) reach it; their codes shrink toward 0 and stay consistent with the scale.
TINY_AMAX = 2.0**-100

# 1.5·2^23. Adding it to an fp32 |y| < 2^22 rounds y to an integer (ties to even) and leaves that
# integer, two's complement, in the low mantissa bits; the constant's low byte is zero, so an INT8
# code is the low byte of the sum's bits: x·(127/max|x|) + ROUNDING_MAGIC is one FMA per element.
ROUNDING_MAGIC = 12582912.0
# The same number read the other way: for an int32 score |s| < 2^22, the fp32 whose bits are
# SCORE_BIAS_BITS + s is exactly SCORE_BIAS + s, so one integer add replaces an int-to-float
# conversion per score (the plain kernel's `scores_by_add`); the bias leaves again in the exponent's FMA.
SCORE_BIAS = ROUNDING_MAGIC
SCORE_BIAS_BITS = 0x4B400000
# Largest row scale c (log2 units per integer-score unit) for which a query tile takes the scores-by-add
# path: its exponent error, up to ~c, then stays under 2^-7 log2 units (0.5% of P, below e4m3's
# 2^-4 step). INT8's own score error is about 100·c, so inputs with a larger c (peaky attention) are
# far off already; their query tiles take the exact conversion instead of overflowing to inf.
SCORES_BY_ADD_MAX_SCALE = 2.0**-7

# Floor of a vector's norm in the tile selection's cosine (torch.nn.functional.cosine_similarity's
# eps, as `tile_select` calls it): a zero vector then has cosine 0, not NaN.
COSINE_EPS = 1e-12

NAN_BITS = 0x7FC00000  # fp32 quiet NaN
INF_BITS = 0x7F800000  # fp32 +inf; |x|'s bits at or above it: inf or NaN

# Element offsets from this size on take int64 math in the plain kernel (below it int32, which is
# faster: int64 per-head bases cost the 16-bit P·V kernel a few percent at the CogVideoX shapes).
WIDE_OFFSETS_FROM = 2**31
