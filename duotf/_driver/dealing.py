"""Dealing a feed's rows out to the nodes: the plan of each epoch.

:func:`balance` gives every node the same number of rows, partition by partition;
:func:`local_order` lets a node take first the partitions whose kept frames its host holds;
:func:`shuffle_seed` settles the seed of a shuffled feed. Pure functions of the counts, the
hosts and the arguments: :mod:`duotf._driver.planner` runs the jobs that feed what they plan.
"""

from __future__ import annotations

import logging
import secrets
from typing import Dict, List, Optional, Sequence, Set, Tuple

from duotf.errors import ConfigError

logger = logging.getLogger("duotf.feed")

__all__ = ["balance", "local_order", "shuffle_seed"]


def balance(counts: List[int], targets: int, drop_remainder: bool = True,
            order: Optional[Sequence[int]] = None):
    """Give every target the same number of rows: ``(plan, rows_per_target, dropped)``.

    Rows are dealt in an interleaved partition order, partitions ``0, T, 2T, ...`` first, then
    ``1, T + 1, ...`` and so on (``T`` targets): target 0 gets the first ``total // T`` rows of
    that order, target 1 the next, and so on. Engines start tasks in partition order, so the
    tasks that run at the same time feed different targets, and no node waits while another is
    fed by every free slot. The ``total % T`` rows left over (fewer than the number of targets)
    are the last of that order, and are dropped so that every synchronous worker runs the same
    number of steps; with ``drop_remainder=False`` partitions go whole to targets in turn
    instead (uneven).

    The plan maps each partition to its ranges ``(target, start, stop, seq)``: ``seq`` numbers
    the ranges of one target in partition order, and a node queues its ranges in that order,
    whichever feeding task comes first (:class:`duotf._transport.server.FeedServer`), so what a
    worker reads, and in what order, follows from the data and the spec alone.

    ``order``: deal the partitions in this order instead (a shuffled feed's epoch:
    :func:`duotf._transport.shuffle.partition_order`); each target still reads its ranges in
    partition order.
    """
    total = sum(counts)
    plan: Dict[int, List[Tuple[int, int, int]]] = {}
    if not drop_remainder:
        turn = {pid: i for i, pid in enumerate(order if order is not None else range(len(counts)))}
        for pid, n in enumerate(counts):
            plan[pid] = [(turn[pid] % targets, 0, n)] if n else []
        return _sequenced(plan), None, 0
    per = total // targets
    if per == 0:
        raise ConfigError(
            f"{total} rows cannot be shared by {targets} synchronous workers: each needs at "
            "least one row. Feed more data, or pass balance=False."
        )
    if order is None:
        order = sorted(range(len(counts)), key=lambda pid: (pid % targets, pid))
    start = 0
    for pid in order:
        n = counts[pid]
        ranges = []
        pos = 0
        while pos < n:
            g = start + pos
            target = g // per
            if target >= targets:
                break  # the remainder
            stop = min(n, (target + 1) * per - start)
            ranges.append((target, pos, stop))
            pos = stop
        plan[pid] = ranges
        start += n
    return _sequenced(dict(sorted(plan.items()))), per, total - per * targets


def local_order(counts: List[int], hosts: Sequence[Optional[str]], names: Sequence[Set[str]]) -> List[int]:
    """The partitions in an order that makes :func:`balance` deal each target rows held on
    its own host where the balance allows (``train(locality=True)``): ``hosts`` the host of
    each partition's data (None: not known), ``names`` each target's host names. A partition
    goes to the least loaded target of its host; then, target by target, its own partitions,
    followed by unplaced ones (unknown host, or a host without a target) while its share of
    ``sum(counts) // targets`` rows is not reached. Rows cross hosts only where a host holds
    more or fewer than its targets' shares."""
    targets = len(names)
    per = sum(counts) // max(targets, 1)
    home: List[List[int]] = [[] for _ in names]
    load = [0] * targets
    free: List[int] = []
    for pid, n in enumerate(counts):
        host = hosts[pid] if pid < len(hosts) else None
        mine = [t for t in range(targets) if host is not None and host in names[t]]
        if not mine:
            free.append(pid)
            continue
        t = min(mine, key=lambda t: (load[t], t))
        home[t].append(pid)
        load[t] += n
    order: List[int] = []
    dealt = 0
    for t in range(targets):
        for pid in home[t]:
            order.append(pid)
            dealt += counts[pid]
        while free and dealt < (t + 1) * per:
            pid = free.pop(0)
            order.append(pid)
            dealt += counts[pid]
    return order + free


def _sequenced(plan: Dict[int, List[Tuple[int, int, int]]]) -> Dict[int, List[Tuple[int, int, int, int]]]:
    """Number every target's ranges in partition order (a partition has at most one range per
    target): ``(target, start, stop) -> (target, start, stop, seq)``."""
    seqs: Dict[int, int] = {}
    out = {}
    for pid in sorted(plan):
        ranges = []
        for target, a, b in plan[pid]:
            ranges.append((target, a, b, seqs.get(target, 0)))
            seqs[target] = seqs.get(target, 0) + 1
        out[pid] = ranges
    return out


def shuffle_seed(shuffle, seed, buffer) -> Optional[int]:
    """The seed a train() call shuffles by: None without ``shuffle``; drawn when not given.
    ``buffer``: its ``shuffle_buffer``, checked."""
    if shuffle not in (True, False):
        raise ConfigError(f"shuffle={shuffle!r}: give True or False (and seed= for its order)",
                          param="shuffle")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError(f"seed={seed!r}: give a whole number, 0 or more", param="seed")
    if buffer is not None and (isinstance(buffer, bool) or not isinstance(buffer, int)
                               or buffer < 1 or not shuffle):
        raise ConfigError(f"shuffle_buffer={buffer!r}: give the rows of a node's shuffling "
                          "window, 1 or more, with shuffle=True", param="shuffle_buffer")
    if not shuffle:
        if seed is not None:
            raise ConfigError(f"seed={seed} without shuffle=True orders nothing: the feed is "
                              "shuffled only with shuffle=True", param="seed")
        return None
    if seed is None:
        seed = secrets.randbits(31)
        logger.info("duotf: shuffling the feed with seed %d (train(..., seed=%d) repeats its "
                    "order)", seed, seed)
    return seed
