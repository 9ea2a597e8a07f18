"""The plan of a balanced feed, by example: every target the same rows once, partitions that
run together feeding different targets, and each worker dealt the rows of its own host
(tests/test_dealing_properties.py states the same for any counts)."""

from __future__ import annotations

import pytest

from duotf._driver.planner import balance, local_order


@pytest.mark.parametrize("counts, targets", [
    ([10, 3, 0, 25, 7], 2), ([20_000] * 13, 2), ([5, 0, 0, 1, 9, 4, 4], 3), ([7], 4), ([0, 3, 1], 2),
])
def test_balance_gives_every_target_the_same_rows_once(counts, targets):
    plan, per, dropped = balance(counts, targets)
    assert per == sum(counts) // targets and dropped == sum(counts) % targets
    got = {t: 0 for t in range(targets)}
    seqs = {t: [] for t in range(targets)}
    for pid, n in enumerate(counts):
        covered = []
        for target, a, b, seq in plan[pid]:
            assert 0 <= a < b <= n
            got[target] += b - a
            covered.append((a, b))
            seqs[target].append(seq)
        # a partition's ranges are consecutive, from its first row on
        if covered:
            assert [a for a, _ in covered] == [0] + [b for _, b in covered[:-1]]
    assert got == {t: per for t in range(targets)}
    # every target's ranges are numbered 0, 1, 2, ... in partition order: the order it queues them
    assert all(s == list(range(len(s))) for s in seqs.values())


def test_balance_feeds_different_targets_from_partitions_that_run_together():
    plan, _, _ = balance([1000] * 8, 2)
    # engines start tasks in partition order: partitions 0 and 1 run first, then 2 and 3...
    assert [plan[p][0][0] for p in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert all(len(plan[p]) == 1 for p in range(8))
    plan, _, _ = balance([1000] * 8, 2, drop_remainder=False)
    assert [plan[p] for p in range(3)] == [[(0, 0, 1000, 0)], [(1, 0, 1000, 0)], [(0, 0, 1000, 1)]]


def _crossing(plan, hosts, names):
    """Rows the plan sends to a target on another host than the partition's."""
    return sum(stop - start for pid, ranges in plan.items() for t, start, stop, _ in ranges
               if hosts[pid] not in names[t])


def test_local_order_deals_each_worker_the_rows_of_its_own_host():
    names = [{"10.0.0.2", "a"}, {"10.0.0.3", "b"}]
    # partitions 0 and 1 on b, 2 and 3 on a: the plain order crosses hosts with half the rows
    counts, hosts = [100] * 4, ["b", "b", "a", "a"]
    assert _crossing(balance(counts, 2)[0], hosts, names) == 200
    plan, per, dropped = balance(counts, 2, order=local_order(counts, hosts, names))
    assert (per, dropped, _crossing(plan, hosts, names)) == (200, 0, 0)
    # a host holding more than its worker's share: only the excess crosses, and the unknown
    # partition fills the other worker's share
    counts, hosts = [100, 100, 100, 50, 50], ["a", "a", "a", None, "10.0.0.3"]
    plan, per, _ = balance(counts, 2, order=local_order(counts, hosts, names))
    assert per == 200 and _crossing(plan, hosts, names) == 100 + 50  # a's excess, the unknown one
    # two workers on one host share its partitions by rows
    order = local_order([100] * 4, ["a"] * 4, [{"a"}, {"a"}])
    assert sorted(order) == [0, 1, 2, 3]
