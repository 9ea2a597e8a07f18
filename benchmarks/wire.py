"""The feed across hosts: what the wire costs, as a share of a plain socket copy.

    python -m benchmarks.wire [--rows 100000 --epochs 20 --rounds 3 --streams 2]
                              [--drains arrays dataset] [--json PATH]

Two separate hosts on this one machine (``tests/hosts.py``: network namespaces on a bridge, each
with its own address, hostname and ``/dev/shm``; root only), and a Dask cluster whose scheduler
(and the driver) is on the bridge and whose workers are on the hosts, two worker processes a
host (started by one ``dask worker`` process). duotf's two nodes go to the two workers of host 0,
the *node host* (duotf spreads a job's nodes over hosts; here its Dask backend is shown host 0's
workers alone, :func:`node_host_backend`). Measured, for MNIST-like rows (784 float32 and an
int64 label, 3,144 bytes), in rounds that alternate the order of the cases:

- **cross-host feed**: the rows persisted on a worker of host 1, the *feeding host*. Dask runs a
  task where the data it needs already is, and work stealing is off (the scheduler's
  ``distributed.scheduler.work-stealing``), so every feeding task runs on host 1 and every row
  crosses the bridge to the nodes, over TCP (a ring needs one ``/dev/shm``).
- **cross-host feed, TLS**: the cross-host feed with ``duotf.run(..., tls=True)``
  (``DUOTF_TLS=1`` in the driver): every feeding connection encrypted (goal: at least 0.7 of
  the cross-host feed's rate).
- **same-host feed**: the same rows persisted on a worker of host 0: the feeding tasks run
  beside the nodes and hand them frames through shared memory rings.
- **plain socket copy**: the same number of bytes from host 1 to host 0 over ``--streams``
  TCP connections (as many as the nodes by default), from one sender process to one receiver
  process, a thread a connection, ``sendall`` and ``recv_into`` of 4 MiB buffers (a feed
  frame's size, reused), no framing: the most the bridge carries between these two namespaces.

Each feed runs once for each of ``--drains``, how its nodes take the rows, in batches of 100:

- **arrays**: ``feed.next_batch(100)`` of the columns as numpy arrays (views of the received
  frames), as a program that feeds TF itself takes them: what the feed costs up to the node,
  the measure of the wire's cost that the copy is beside (it reads into a buffer, no more).
- **dataset**: a Python loop over ``feed.dataset(100)`` (``benchmarks/feed.py``'s
  ``drain_main``): TensorFlow's per-batch cost is in it too, the same on either path.

A feed's rate is measured as ``benchmarks/feed.py`` measures it (its ``run_duotf``): every row
fed, from ``train`` (called once both nodes had imported TF) to the last batch a node read.
The copy's rate is the bytes over the time from the receiver's ``accept`` to its last byte.
Each round prints each case, the cross-host feed's share of the copy (goal: at least 50 %) and
of the same-host feed, and what shows where the rows went: the
hosts of the nodes (their hostnames) and of the feeding tasks (Dask's task stream), and the bytes
that left the feeding host (its interface's counter) beside the bytes fed; a feed that ran
elsewhere than its case says stops the run.

Beside each rate, the CPU seconds a GB moved: of the nodes (every thread, from their feed's
start), of the threads that run the tasks of the Dask workers of the host that held the data
(the feeding tasks, and what computed the partitions they fed), and of the copy's sender and
receiver. On a machine whose CPUs are all busy, the rates follow these.

Each host's processes share one session (the feed's workers under one nanny, the copy's ends
one process a host), so that where Linux's autogroup scheduling shares busy CPUs between
sessions, the copy and the feed get the same share.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Tuple

import numpy as np

from benchmarks.feed import drain_main, quiet_tf, run_duotf, timed_drain
from benchmarks.record import Record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW_BYTES = 784 * 4 + 8
CHUNK = 20_000  # rows a Dask block, as benchmarks/feed.py's
BUFFER = 4 << 20  # the plain copy's send and receive buffers: a feed frame's size
NODE_HOST, FEEDING_HOST = 0, 1
GOAL = 0.5  # the cross-host feed's rate over the plain copy's
TLS_GOAL = 0.7  # the encrypted cross-host feed's rate over the plain feed's


def _cpu() -> float:
    """This process's CPU seconds so far (user and system)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def node_main(args, ctx):
    """``benchmarks.feed.drain_main``, or :func:`arrays_drain_main` where ``args["drain"]`` is
    "arrays" (TF imported all the same, as in a TF program); beside what it returns, the node's
    hostname and the CPU seconds it spent from its feed's start to its end (every thread)."""
    import socket as _socket

    __import__("tensorflow")  # before the count starts: drain_main's import is then a no-op
    cpu = _cpu()
    out = (arrays_drain_main if args.get("drain") == "arrays" else drain_main)(args, ctx)
    out["cpu"] = _cpu() - cpu
    out["host"] = _socket.gethostname()
    return out


def arrays_drain_main(args, ctx):
    """``benchmarks.feed.drain_main`` with the rows taken as numpy arrays, as a program that
    feeds TF itself takes them: ``next_batch(100)`` of the columns (views of the received
    frames), no TensorFlow. What the feed costs up to the node, without TF's per-batch cost."""
    def batch_rows(feed):
        while not feed.should_stop():
            yield len(feed.next_batch(args["batch"])["y"])

    return timed_drain(args, ctx, batch_rows, input_mapping={"0": "x", "1": "y"})


# -- the plain socket copy ---------------------------------------------------------------------
def _threads(target, args: list) -> None:
    """``target(*a)`` for each ``a`` of ``args``, each in a thread of its own; wait for all."""
    import threading

    threads = [threading.Thread(target=target, args=a) for a in args]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def receive(port: int, streams: int, nbytes: int) -> None:
    """Take ``streams`` connections on ``port`` and read ``nbytes`` from each into a buffer of
    its own, over and over, a thread a connection; print the bytes, the times of the first
    accept and of the last byte, and this process's CPU seconds meanwhile, as JSON."""
    listener = socket.create_server(("0.0.0.0", port))
    print("listening", flush=True)
    conns = [listener.accept()[0] for _ in range(streams)]
    start, cpu = time.time(), _cpu()  # (the sender connects them all before it sends)

    def read(conn):
        view = memoryview(bytearray(BUFFER))
        got = 0
        while got < nbytes:
            k = conn.recv_into(view, min(len(view), nbytes - got))
            if not k:
                raise SystemExit(f"the sender closed after {got} of {nbytes} bytes")
            got += k
        conn.close()

    _threads(read, [(conn,) for conn in conns])
    print(json.dumps({"bytes": nbytes * streams, "start": start, "end": time.time(),
                      "cpu": _cpu() - cpu}), flush=True)


def send(host: str, port: int, streams: int, nbytes: int) -> None:
    """Send ``nbytes`` to ``host:port`` on each of ``streams`` connections with ``sendall`` of
    one buffer, over and over, a thread a connection; print this process's CPU seconds."""
    socks = [socket.create_connection((host, port)) for _ in range(streams)]
    cpu = _cpu()
    view = memoryview(np.random.default_rng(0).bytes(BUFFER))

    def write(sock):
        left = nbytes
        while left:
            n = min(left, len(view))
            sock.sendall(view[:n])
            left -= n
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the receiver's close
        sock.close()

    _threads(write, [(sock,) for sock in socks])
    print(json.dumps({"cpu": _cpu() - cpu}), flush=True)


def _log_lines(path: str) -> List[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def socket_copy(net, nbytes: int, streams: int, tag: str) -> Tuple[float, dict]:
    """Bytes/s of a plain copy of ``nbytes`` from the feeding host to the node host over
    ``streams`` connections side by side, from one sender process to one receiver process
    (one process a host, as the feed's workers: on a busy machine each session gets its
    share of the CPUs); and the CPU seconds a GB of the ``"sender"`` and the ``"receiver"``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    share = nbytes // streams
    port = 17100
    logs = [os.path.join(net.folder, f"{end}-{tag}.log") for end in ("receive", "send")]
    receiver = net.start(NODE_HOST, [sys.executable, "-m", "benchmarks.wire", "--receive", str(port),
                                     str(streams), str(share)], env=env, log=logs[0])
    deadline = time.monotonic() + 120
    while "listening" not in _log_lines(logs[0]):
        if time.monotonic() > deadline or receiver.poll() is not None:
            raise RuntimeError("the receiver did not start:\n" + "\n".join(_log_lines(logs[0])[-20:]))
        time.sleep(0.05)
    sender = net.start(FEEDING_HOST, [sys.executable, "-m", "benchmarks.wire", "--send",
                                      net.ips[NODE_HOST], str(port), str(streams), str(share)],
                       env=env, log=logs[1])
    for proc in (receiver, sender):
        if proc.wait(600):
            raise RuntimeError(f"the plain copy failed: see {' and '.join(logs)}")
    got, sent = (json.loads(_log_lines(log)[-1]) for log in logs)
    assert got["bytes"] == share * streams, got
    gb = got["bytes"] / 1e9
    return share * streams / (got["end"] - got["start"]), {"receiver": got["cpu"] / gb,
                                                           "sender": sent["cpu"] / gb}


# -- the feeds ---------------------------------------------------------------------------------
def placed_data(client, rows: int, worker: str, seed: int):
    """MNIST-like arrays (x, y), as ``benchmarks.feed.dask_data`` makes them, persisted on
    ``worker`` alone; ``seed`` makes their blocks (and their keys) differ from another call's."""
    import dask.array as da
    from distributed import wait

    x = da.random.default_rng(seed).random((rows, 784), chunks=(CHUNK, 784), dtype=np.float32)
    y = da.arange(seed * rows, (seed + 1) * rows, chunks=CHUNK, dtype=np.int64) % 10
    x, y = client.persist([x, y], workers=[worker], allow_other_workers=False)
    wait([x, y])
    return x, y


def holders(client, data) -> set:
    """The workers holding any block of ``data``."""
    names = {a.name for a in data}
    return {w for key, where in client.who_has().items()
            if (key[0] if isinstance(key, (list, tuple)) else key) in names for w in where}


def sent_bytes(net, host: int) -> int:
    """The bytes host ``host``'s interface has sent so far (its counter, in its namespace)."""
    out = subprocess.run(["ip", "-n", net.names[host], "-j", "-s", "link", "show", "eth0"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


def task_threads_cpu(net, host: int) -> Dict[Tuple[int, int], float]:
    """CPU seconds so far of every thread but the main one of every process on host ``host``,
    by (pid, thread id): in a Dask worker, the threads that run its tasks (the feeding tasks,
    and what computes the partitions they feed), not its event loop (heartbeats, comms)."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in net.pids(host):
        try:
            tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
        except FileNotFoundError:  # gone meanwhile
            continue
        for tid in tids:
            if tid == pid:
                continue
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            found[pid, tid] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return found


def _spent(before: Dict[Tuple[int, int], float], after: Dict[Tuple[int, int], float]) -> float:
    """CPU seconds between two :func:`task_threads_cpu`, of the processes there at both (the
    workers, not the nodes they started meanwhile): the threads' new seconds, those of a
    thread that started meanwhile whole (a thread gone meanwhile, as a seceded node task's,
    counts for nothing)."""
    pids = {pid for pid, _ in before}
    return sum(cpu - before.get(key, 0.0) for key, cpu in after.items() if key[0] in pids)


def node_host_backend(client, net):
    """A Dask backend of ``client`` that places nodes on the node host's workers alone (duotf
    would spread two nodes over the two hosts); feeding tasks still run where Dask puts them."""
    from duotf.backends.dask.backend import DaskBackend

    class NodeHostBackend(DaskBackend):
        def _workers(self):
            return [w for w in super()._workers() if f"//{net.ips[NODE_HOST]}:" in w]

    return NodeHostBackend(client)


def feed(client, net, data, epochs: int, host_of: Dict[str, int], data_host: int,
         drain: str, tls: bool = False) -> Tuple[float, dict]:
    """The feed's rows/s (as ``benchmarks.feed.run_duotf`` measures it) and where it ran: the
    nodes' hosts, the feeding tasks' hosts, and the bytes the feeding host sent meanwhile;
    and the CPU seconds a GB fed of the nodes and of the task threads of the Dask workers of
    ``data_host`` (see :func:`task_threads_cpu`)."""
    from distributed import get_task_stream

    before, cpu = sent_bytes(net, FEEDING_HOST), task_threads_cpu(net, data_host)
    os.environ["DUOTF_TLS"] = "1" if tls else "0"  # read by duotf.run in this process
    try:
        with get_task_stream(client=client) as stream:
            rate, results = run_duotf(node_host_backend(client, net), data, epochs, ROW_BYTES, "",
                                      main=node_main, quiet=True, node_args={"drain": drain})
    finally:
        del os.environ["DUOTF_TLS"]
    sent = sent_bytes(net, FEEDING_HOST) - before
    cpu = _spent(cpu, task_threads_cpu(net, data_host))
    tasks: Dict[str, int] = {}
    for record in stream.data:
        key = str(record["key"])
        if "duotf-feed-" in key:
            host = net.hostnames[host_of[record["worker"]]]
            tasks[host] = tasks.get(host, 0) + 1
    gb = sum(r["rows"] for r in results) * ROW_BYTES / 1e9
    return rate, {"nodes": sorted(r["host"] for r in results), "tasks": tasks, "sent": sent,
                  "fed_bytes": gb * 1e9, "node_cpu": sum(r["cpu"] for r in results) / gb,
                  "feeding_cpu": cpu / gb, "faults": sum(r["faults"] for r in results) / gb}


def _where(info: dict) -> str:
    tasks = ", ".join(f"{n} on {h}" for h, n in sorted(info["tasks"].items()))
    return (f"nodes on {', '.join(info['nodes'])}; feeding tasks: {tasks}; "
            f"{info['sent'] / 1e6:,.0f} MB left the feeding host for {info['fed_bytes'] / 1e6:,.0f} MB fed; "
            f"CPU s a GB: nodes {info['node_cpu']:.2f}, feeding tasks {info['feeding_cpu']:.2f}; "
            f"the nodes' page faults a GB: {info['faults']:,.0f}")


def check_placement(case: str, info: dict, net) -> None:
    """Fail where a feed did not run where its case says: the nodes on the node host, the
    feeding tasks on the feeding host (cross-host) or on the node host (same-host)."""
    node_host = net.hostnames[NODE_HOST]
    case = placed(case)
    feeding = net.hostnames[FEEDING_HOST if case == "cross-host" else NODE_HOST]
    if set(info["nodes"]) != {node_host} or set(info["tasks"]) != {feeding}:
        raise RuntimeError(f"{case} feed ran elsewhere than planned: {_where(info)}")
    crossed = info["sent"] / info["fed_bytes"]
    if case == "cross-host" and crossed < 1.0:
        raise RuntimeError(f"only {crossed:.0%} of the bytes fed left the feeding host")
    if case == "same-host" and crossed > 0.05:
        raise RuntimeError(f"{crossed:.0%} of the bytes fed left the feeding host in the same-host feed")


PATHS = ("cross-host", "cross-host-tls", "same-host")
DRAINS = ("arrays", "dataset")
COPY = "socket copy"
PATH_LABELS = {"cross-host": "duotf feed, across hosts (TCP)",
               "cross-host-tls": "duotf feed, across hosts (TCP), TLS",
               "same-host": "duotf feed, on one host (shared memory)"}
DRAIN_LABELS = {"arrays": "next_batch(100), numpy", "dataset": "dataset(100), TF"}


def placed(path: str) -> str:
    """Where ``path``'s data is held: the TLS feed feeds the cross-host feed's rows."""
    return "cross-host" if path.startswith("cross-host") else path


def cases(drains) -> List[str]:
    """A round's cases: each path with each drain ("cross-host/arrays", ...), then the copy."""
    return [f"{path}/{drain}" for drain in drains for path in PATHS] + [COPY]


def label(case: str) -> str:
    if case == COPY:
        return "plain socket copy across hosts"
    path, drain = case.split("/")
    return f"{PATH_LABELS[path]}, {DRAIN_LABELS[drain]}"


def run(opts, record) -> None:
    from distributed import Client

    from tests import hosts

    why = hosts.unavailable()
    if why:
        raise SystemExit(f"benchmarks.wire needs separate hosts: {why}")
    # the nodes import this module's functions by name; the scheduler moves no task off the
    # worker that holds its data
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, os.environ.get("PYTHONPATH")] if p)
    os.environ["DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING"] = "False"
    with hosts.Network(2, cpus=[0, 1] if opts.pin else None) as net, \
            hosts.dask_cluster(net, threads=2, workers=2) as address, \
            Client(address) as client:
        client.wait_for_workers(4, timeout=120)
        host_of = {w: net.ips.index(w.split("://")[1].rsplit(":", 1)[0]) for w in client.nthreads()}
        holder = {"cross-host": min(w for w, h in host_of.items() if h == FEEDING_HOST),
                  "same-host": min(w for w, h in host_of.items() if h == NODE_HOST)}
        data = {path: placed_data(client, opts.rows, worker, seed)
                for seed, (path, worker) in enumerate(holder.items())}
        print(f"Across hosts: {net.hostnames[NODE_HOST]} ({net.ips[NODE_HOST]}: the nodes) and "
              f"{net.hostnames[FEEDING_HOST]} ({net.ips[FEEDING_HOST]}: the cross-host feed's "
              f"tasks){', each on a core of its own (CPU 0, CPU 1)' if opts.pin else ''}, Dask (2 "
              f"workers of 2 threads a host, work stealing off), 2 nodes taking "
              f"batches of 100 ({', '.join(DRAIN_LABELS[d] for d in opts.drains)}); {opts.rows} "
              f"MNIST-like rows x {opts.epochs} epochs ({opts.rows * opts.epochs * ROW_BYTES / 1e9:.2f}"
              f" GB) a run, {opts.rounds} rounds", flush=True)
        for path in PATHS:  # each path's first feed: shown, not counted
            rate, info = feed(client, net, data[placed(path)], 2, host_of, host_of[holder[placed(path)]],
                              opts.drains[0], tls=path.endswith("-tls"))
            check_placement(path, info, net)
            print(f"  warm-up, {path} feed (2 epochs): {rate:,.0f} rows/s; {_where(info)}", flush=True)
        got, cpu = rounds(opts, client, net, data, host_of, holder)
        for path, worker in holder.items():
            if holders(client, data[path]) != {worker}:
                raise RuntimeError(f"the {path} data moved: {holders(client, data[path])}")
    summary(got, cpu, opts, record)


def rounds(opts, client, net, data, host_of, holder):
    """The cases (:func:`cases`) ``opts.rounds`` times, each round in the other order; their
    rows/s, and the CPU seconds a GB of their parts, by case."""
    nbytes = opts.rows * opts.epochs * ROW_BYTES
    order = cases(opts.drains)
    got: Dict[str, List[float]] = {case: [] for case in order}
    cpu: Dict[str, Dict[str, List[float]]] = {case: {} for case in order}
    for r in range(opts.rounds):
        for case in (order if r % 2 == 0 else order[::-1]):
            if case == COPY:
                rate, parts = socket_copy(net, nbytes, opts.streams, f"{r}")
                rate /= ROW_BYTES
                where = (f"{opts.streams} connections, {net.hostnames[FEEDING_HOST]} -> "
                         f"{net.hostnames[NODE_HOST]}; CPU s a GB: receiver {parts['receiver']:.2f}, "
                         f"sender {parts['sender']:.2f}")
            else:
                path, drain = case.split("/")
                rate, info = feed(client, net, data[placed(path)], opts.epochs, host_of,
                                  host_of[holder[placed(path)]], drain, tls=path.endswith("-tls"))
                check_placement(path, info, net)
                where = _where(info)
                parts = {"nodes": info["node_cpu"], "feeding tasks": info["feeding_cpu"]}
            got[case].append(rate)
            for part, value in parts.items():
                cpu[case].setdefault(part, []).append(value)
            print(f"  round {r + 1}, {case:<18} {rate:>10,.0f} rows/s {rate * ROW_BYTES / 1e6:>6,.0f} "
                  f"MB/s; {where}", flush=True)
        for drain in opts.drains:
            cross, same = got[f"cross-host/{drain}"][-1], got[f"same-host/{drain}"][-1]
            print(f"  round {r + 1}, {drain}: cross-host / socket copy {cross / got[COPY][-1]:.2f} "
                  f"(goal >= {GOAL}), cross-host / same-host {cross / same:.2f}, TLS / plain "
                  f"{got[f'cross-host-tls/{drain}'][-1] / cross:.2f} (goal >= {TLS_GOAL})", flush=True)
    return got, cpu


def ratios(got: Dict[str, List[float]], drain: str) -> Tuple[List[float], List[float]]:
    """Per round, the cross-host feed's rate with ``drain`` over the plain copy's, and over
    the same-host feed's."""
    cross = got[f"cross-host/{drain}"]
    return ([a / c for a, c in zip(cross, got[COPY])],
            [a / b for a, b in zip(cross, got[f"same-host/{drain}"])])


def encrypted(got: Dict[str, List[float]], drain: str) -> List[float]:
    """Per round, the TLS cross-host feed's rate with ``drain`` over the plain one's."""
    return [a / b for a, b in zip(got[f"cross-host-tls/{drain}"], got[f"cross-host/{drain}"])]


def summary(got: Dict[str, List[float]], cpu: dict, opts, record) -> None:
    print("summary (medians of the rounds; rows of 3,144 bytes):")
    for case in got:
        rate = statistics.median(got[case])
        parts = ", ".join(f"{part} {statistics.median(v):.2f}" for part, v in cpu[case].items())
        print(f"  {label(case):<62} {rate:>10,.0f} rows/s {rate * ROW_BYTES / 1e6:>6,.0f} MB/s "
              f"(rounds: {', '.join(f'{x:,.0f}' for x in got[case])}); CPU s a GB: {parts}")
    for drain in opts.drains:
        copy, same = ratios(got, drain)
        median = statistics.median(copy)
        print(f"  {DRAIN_LABELS[drain]}: cross-host feed / plain socket copy: {median:.2f} (rounds: "
              f"{', '.join(f'{x:.2f}' for x in copy)}); goal >= {GOAL}: "
              f"{'met' if median >= GOAL else 'NOT met'}; TLS / plain cross-host feed: "
              f"{statistics.median(encrypted(got, drain)):.2f} (rounds: "
              f"{', '.join(f'{x:.2f}' for x in encrypted(got, drain))}); goal >= {TLS_GOAL}: "
              f"{'met' if statistics.median(encrypted(got, drain)) >= TLS_GOAL else 'NOT met'}; "
              f"cross-host / same-host: "
              f"{statistics.median(same):.2f} (rounds: {', '.join(f'{x:.2f}' for x in same)})")
    if record is not None:
        record_rows(record, got, cpu, opts)
        record.write(opts.json)


def record_rows(record, got, cpu, opts) -> None:
    """The rates, the goal, the ratios and the CPU a GB as rows of ``record``."""
    chart = "MNIST-like rows across hosts"
    for case in got:
        if case == COPY:
            record.add("rows/s", "rows/s", got[COPY], peer="plain socket copy", case="cross-host",
                       chart=chart, label=f"plain socket copy across hosts, {opts.streams} connections")
            continue
        path, drain = case.split("/")
        record.add("rows/s", "rows/s", got[case], peer="duotf", backend="dask", case=path, drain=drain,
                   chart=chart, label=label(case))
    record.add("rows/s", "rows/s", [GOAL * statistics.median(got[COPY])], peer="goal",
               case="cross-host", chart=chart, label="goal: 50% of the plain socket copy",
               reference=True)
    for drain in opts.drains:
        record.add("ratio", "x", ratios(got, drain)[0], peer="duotf", backend="dask", case="cross-host",
                   drain=drain, chart="cross-host feed over the plain socket copy",
                   label=f"{DRAIN_LABELS[drain]}: cross-host feed / plain socket copy, per round")
        record.add("ratio", "x", encrypted(got, drain), peer="duotf", backend="dask",
                   case="cross-host-tls", drain=drain, chart="TLS feed over the plain feed, across hosts",
                   label=f"{DRAIN_LABELS[drain]}: TLS cross-host feed / plain cross-host feed, per round")
    for case, parts in cpu.items():
        peer = "plain socket copy" if case == COPY else "duotf"
        for part, values in parts.items():
            record.add("CPU seconds a GB", "s/GB", values, peer=peer,
                       backend="dask" if peer == "duotf" else None, case=case,
                       chart="CPU a GB moved", label=f"{label(case)}: {part}")


def cli(argv=None) -> None:
    quiet_tf()
    parser = argparse.ArgumentParser(description="duotf's feed across hosts beside a plain socket copy")
    parser.add_argument("--rows", type=int, default=100_000, help="MNIST-like rows in the data")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the cases, alternating")
    parser.add_argument("--drains", nargs="+", choices=DRAINS, default=list(DRAINS),
                        help="how the nodes take batches of 100 rows, each a case of its own: "
                             "next_batch(100) as numpy arrays (arrays: the feed's own cost), a "
                             "Python loop over feed.dataset(100) (dataset: TF's per-batch cost too)")
    parser.add_argument("--pin", action="store_true",
                        help="each host on a core of its own (the nodes' host on CPU 0, the "
                             "feeding host on CPU 1), as two machines of one core; by default "
                             "both share every core")
    parser.add_argument("--streams", type=int, default=2,
                        help="connections of the plain copy (default: as many as the nodes)")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the rates and the run's command, settings and machine to "
                             "PATH (benchmarks/record.py)")
    # the plain copy's two ends, run on the hosts by this module itself
    parser.add_argument("--receive", nargs=3, type=int, metavar=("PORT", "STREAMS", "BYTES"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--send", nargs=4, metavar=("HOST", "PORT", "STREAMS", "BYTES"),
                        help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.receive:
        receive(*opts.receive)
        return
    if opts.send:
        send(opts.send[0], *(int(x) for x in opts.send[1:]))
        return
    record = Record("wire", vars(opts)) if opts.json else None
    run(opts, record)


if __name__ == "__main__":
    cli()
