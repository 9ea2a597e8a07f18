"""Properties of the pure functions that plan and shuffle a feed, over data that Hypothesis
draws: :func:`~duotf._driver.dealing.balance`, :func:`~duotf._driver.dealing.local_order` and
the node's shuffling :class:`~duotf._transport.shuffle.Windows`. The examples of
tests/test_core.py and tests/test_shuffle.py show cases; these state what holds for any."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from duotf._driver.dealing import balance, local_order
from duotf._transport.shuffle import Windows, partition_order

counts_st = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=24)


def _check_ranges(plan, counts):
    """Every partition's ranges are in order, disjoint, inside it, and numbered per target in
    partition order; returns the rows each target gets."""
    got: Counter = Counter()
    seqs = defaultdict(list)
    for pid in sorted(plan):
        pos = 0
        for target, start, stop, seq in plan[pid]:
            assert pos <= start < stop <= counts[pid], (pid, plan[pid])
            pos = stop
            got[target] += stop - start
            seqs[target].append(seq)
    for target, numbers in seqs.items():
        assert numbers == list(range(len(numbers))), (target, numbers)
    return got


@settings(max_examples=150, deadline=None)
@given(counts=counts_st, targets=st.integers(min_value=1, max_value=8), seed=st.integers(0, 2**32 - 1),
       shuffled=st.booleans())
def test_balance_gives_every_target_the_same_rows_and_drops_fewer_than_one_each(
        counts, targets, seed, shuffled):
    total = sum(counts)
    if total < targets:
        return  # refused with a ConfigError (tests/test_core.py)
    order = partition_order(len(counts), seed, 1) if shuffled else None
    plan, per, dropped = balance(counts, targets, order=order)
    assert per == total // targets and dropped == total - per * targets < targets
    got = _check_ranges(plan, counts)
    assert all(got[t] == per for t in range(targets)), got
    assert set(got) <= set(range(targets))
    # a partition's rows are dealt from its start: only the dealing order's last rows drop
    assert sum(got.values()) == total - dropped


@settings(max_examples=100, deadline=None)
@given(counts=counts_st, targets=st.integers(min_value=1, max_value=8))
def test_an_unbalanced_plan_gives_each_partition_whole_to_one_target(counts, targets):
    plan, per, dropped = balance(counts, targets, drop_remainder=False)
    assert per is None and dropped == 0
    _check_ranges(plan, counts)
    for pid, n in enumerate(counts):
        assert plan[pid] == ([] if n == 0 else [(plan[pid][0][0], 0, n, plan[pid][0][3])])


@settings(max_examples=100, deadline=None)
@given(total=st.integers(min_value=1, max_value=60),
       cuts=st.lists(st.lists(st.integers(min_value=1, max_value=59), max_size=4), min_size=1, max_size=5),
       seed=st.integers(0, 1000))
def test_local_order_deals_every_row_on_its_own_host_where_hosts_hold_equal_shares(total, cuts, seed):
    # every target's host holds partitions of `total` rows in all, cut at random: the balance
    # allows every row to stay on its host, and local_order must find that order however the
    # partitions lie
    parts = []
    for t, points in enumerate(cuts):
        edges = [0, *sorted({c for c in points if c < total}), total]
        parts += [(t, b - a) for a, b in zip(edges, edges[1:])]
    random.Random(seed).shuffle(parts)
    counts = [n for _, n in parts]
    hosts = [f"host-{t}" for t, _ in parts]
    names = [{f"host-{t}", f"10.0.0.{t}"} for t in range(len(cuts))]
    order = local_order(counts, hosts, names)
    assert sorted(order) == list(range(len(counts)))
    plan, per, dropped = balance(counts, len(names), order=order)
    assert dropped == 0 and per == total
    for pid, ranges in plan.items():
        for target, *_ in ranges:
            assert hosts[pid] in names[target], (pid, hosts[pid], target)


@settings(max_examples=100, deadline=None)
@given(counts=counts_st, hosts=st.lists(st.sampled_from(["a", "b", "c", None]), max_size=24),
       targets=st.lists(st.sampled_from(["a", "b", "x"]), min_size=1, max_size=4))
def test_local_order_is_an_order_of_every_partition(counts, hosts, targets):
    order = local_order(counts, hosts, [{name} for name in targets])
    assert sorted(order) == list(range(len(counts)))


def _shuffled(chunks, window, key):
    windows = Windows()
    out = []
    for chunk in chunks:
        out += windows.add({"x": chunk, "s": [str(v) for v in chunk]}, (*key, window))
    out += windows.flush()
    return out


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(min_value=1, max_value=300), window=st.integers(min_value=1, max_value=64),
       cuts=st.lists(st.integers(min_value=1, max_value=299), max_size=12),
       seed=st.integers(0, 2**32 - 1))
def test_windows_permute_each_window_the_same_however_the_rows_arrive(rows, window, cuts, seed):
    data = np.arange(rows, dtype=np.int64)
    points = sorted({c for c in cuts if c < rows})
    chunks = np.split(data, points)
    key = (seed, 1, 0)
    out = _shuffled(chunks, window, key)
    whole = _shuffled([data], window, key)
    # the same rows in the same order whatever the chunks (frames) they came in
    assert [w["x"].tolist() for w in out] == [w["x"].tolist() for w in whole]
    # windows of `window` rows (the last the rest), each a permutation of its span of rows
    sizes = [len(w["x"]) for w in out]
    assert sizes == [window] * (rows // window) + ([rows % window] if rows % window else [])
    start = 0
    for w in out:
        span = data[start:start + len(w["x"])]
        assert sorted(w["x"].tolist()) == span.tolist()
        assert w["s"] == [str(v) for v in w["x"]]  # every column moved alike
        start += len(w["x"])
