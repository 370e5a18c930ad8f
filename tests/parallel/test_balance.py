"""Head orders that balance Ulysses ranks by density (`parallel.balance`), against the identity order."""

import itertools

import pytest

from sagevideo.parallel.balance import balanced_head_order, group_sums, rank_spread


def test_two_dense_heads_go_to_different_ranks():
    densities = (0.9, 0.8, 0.1, 0.1)  # the identity puts both dense heads on rank 0: 1.7 against 0.2
    order = balanced_head_order(densities, 2)
    assert order == (0, 3, 1, 2)  # each rank's heads ascending; of the tied heads the lower goes first
    assert group_sums(densities, order, 2) == pytest.approx([1.0, 0.9])
    assert rank_spread(densities, range(4), 2) == pytest.approx(1.7 / 0.95)
    assert rank_spread(densities, order, 2) == pytest.approx(1.0 / 0.95)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_an_order_is_a_permutation_in_equal_groups_never_less_balanced_than_the_identity(world):
    """40 heads (Wan 14B) of one top_p's densities: the first six keep many tiles, the others few."""
    densities = [0.05 + 0.6 * (h < 6) + 0.01 * (h % 7) for h in range(40)]
    order = balanced_head_order(densities, world)
    assert order is not None and sorted(order) == list(range(40))
    per = 40 // world
    assert all(list(order[r * per:(r + 1) * per]) == sorted(order[r * per:(r + 1) * per]) for r in range(world))
    assert rank_spread(densities, order, world) < rank_spread(densities, range(40), world)
    # longest first is within the largest head of the best split (a known bound): here close to 1
    assert max(group_sums(densities, order, world)) <= sum(densities) / world + max(densities)


def test_the_best_split_of_a_small_case_is_found():
    densities = (0.7, 0.1, 0.3, 0.5, 0.2, 0.6)
    order = balanced_head_order(densities, 2)
    best = min(max(sum(densities[h] for h in g), sum(densities) - sum(densities[h] for h in g))
               for g in itertools.combinations(range(6), 3))
    assert max(group_sums(densities, order, 2)) == pytest.approx(best)


@pytest.mark.parametrize("densities, world", [((0.3, 0.3, 0.3, 0.3), 2), ((0.9, 0.1, 0.8, 0.2), 2),
                                              ((0.9, 0.1), 1), ((0.5, 0.2, 0.7, 0.1), 4),
                                              ((0.30, 0.28, 0.26, 0.26), 2)])
def test_no_order_where_the_identity_is_about_as_balanced(densities, world):
    """None: the heads' own order is kept (no gather, no scatter) where the busiest rank's load would drop
    by less than MIN_GAIN (the last case: 0.58 -> 0.56, 3.4 %; below it, the copies would cost more)."""
    assert balanced_head_order(densities, world) is None


def test_heads_that_do_not_split_are_refused():
    with pytest.raises(ValueError, match="5 heads do not split into 2 equal groups"):
        balanced_head_order((0.1,) * 5, 2)
