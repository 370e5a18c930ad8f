"""Head orders that balance sequence-parallel ranks by attention work.

Under Ulysses each of P ranks attends to H/P heads over the whole sequence: rank r to the heads at
positions r·H/P .. (r+1)·H/P - 1 of a head order (the identity unless one is given). A block-sparse
call's work per head is about its density (kept tiles / all tiles); with one top_p per layer the
heads' densities differ, and the rank whose heads keep most tiles sets every rank's pace. A head
order from each head's measured density (`calibrate` writes them into the plan) gives each rank
about the same sum. Data movement only: attention is per head, so any order computes the same output.
"""

from __future__ import annotations

from collections.abc import Sequence

# An order costs one gather of the video q/k/v and one scatter of the output per layer: by bandwidth
# ~0.2 ms a layer at Wan 720p on 8 ranks, ~2 % of a step with guidance. Attention being ~80 % of a
# step, the busiest rank's load must drop by more than ~3 % for it to pay: below MIN_GAIN, no order.
MIN_GAIN = 0.05


def group_sums(densities: Sequence[float], order: Sequence[int], world: int) -> list[float]:
    """Each rank's density sum when rank r takes the heads order[r·H/P : (r+1)·H/P]."""
    per = len(order) // world
    return [sum(densities[h] for h in order[r * per : (r + 1) * per]) for r in range(world)]


def rank_spread(densities: Sequence[float], order: Sequence[int], world: int) -> float:
    """The most loaded rank's density sum over the ranks' mean (1 = balanced; 1 when nothing is kept)."""
    sums = group_sums(densities, order, world)
    mean = sum(sums) / world
    return max(sums) / mean if mean > 0 else 1.0


def balanced_head_order(densities: Sequence[float], world: int) -> tuple[int, ...] | None:
    """A head order whose `world` equal groups have about equal density sums, or None where it would
    lower the busiest group's sum by less than MIN_GAIN (one rank, or little to gain: the identity
    order then, which makes no copy).

    Longest first: the heads by descending density (ties: the lower head first) each go to the group
    of least sum that still has room (ties: the lower group); each group lists its heads ascending.
    ValueError unless `world` divides the heads."""
    heads = len(densities)
    if world < 1 or heads % world:
        raise ValueError(f"head order: {heads} heads do not split into {world} equal groups")
    if world == 1:
        return None
    per = heads // world
    groups: list[list[int]] = [[] for _ in range(world)]
    sums = [0.0] * world
    for head in sorted(range(heads), key=lambda h: (-densities[h], h)):
        target = min((r for r in range(world) if len(groups[r]) < per), key=lambda r: (sums[r], r))
        groups[target].append(head)
        sums[target] += densities[head]
    order = tuple(h for group in groups for h in sorted(group))
    if max(group_sums(densities, order, world)) > max(group_sums(densities, range(heads), world)) * (1 - MIN_GAIN):
        return None
    return order
