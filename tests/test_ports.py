"""duotf._transport.ports: the range of ports duotf listens on (``DUOTF_PORTS``)."""

from __future__ import annotations

import random
import socket

import pytest

import duotf
from duotf._driver.api import job_ports
from duotf._transport import ports


def _free_range(n: int) -> ports.PortRange:
    """``n`` consecutive ports no one holds now."""
    for _ in range(50):
        low = random.randrange(43000, 49000)
        if all(ports._free(p) for p in range(low, low + n)):
            return ports.PortRange(low, low + n - 1)
    raise AssertionError("no free range")


@pytest.mark.parametrize("text, expected", [("41000-41300", (41000, 41300)), (" 41000 ", (41000, 41000)),
                                            ("", None), (None, None)])
def test_a_range_is_low_dash_high(text, expected):
    got = ports.parse(text)
    assert (None if got is None else (got.low, got.high)) == expected


@pytest.mark.parametrize("text", ["41300-41000", "80-90", "41000-70000", "a-b", "41000-", "41000:41010"])
def test_a_malformed_range_names_the_setting(text):
    with pytest.raises(duotf.ConfigError, match=r"DUOTF_PORTS=.*low-high"):
        ports.parse(text)


def test_servers_take_the_free_ports_of_the_range_then_name_it_when_none_is_left():
    r = _free_range(3)
    held = socket.socket()
    held.bind(("0.0.0.0", r.low + 1))  # another program's
    taken = [ports.create_server(ports=r) for _ in range(2)]
    try:
        assert sorted(s.getsockname()[1] for s in taken) == [r.low, r.high]
        with pytest.raises(duotf.PortRangeError, match=f"DUOTF_PORTS={r}") as info:
            ports.create_server(ports=r, what="the feed server")
        assert (info.value.ports, info.value.what) == (str(r), "the feed server")
    finally:
        for s in taken + [held]:
            s.close()


def test_a_server_never_takes_a_port_a_reservation_holds():
    # the node's feed server beside its own TensorFlow port: with SO_REUSEADDR both could bind
    # (neither listening yet), and TensorFlow's server then failed ("Could not start gRPC server")
    r = _free_range(1)
    held = ports.reserve(ports=r)
    try:
        with pytest.raises(duotf.PortRangeError):
            ports.create_server(ports=r, what="a node's feed server")
    finally:
        held.close()


def test_reservations_never_share_a_port_though_each_lets_tensorflow_bind_it():
    # SO_REUSEPORT lets a second reserving socket bind a held port: in a range, each takes one
    # that no socket holds
    r = _free_range(4)
    held = [ports.reserve(ports=r) for _ in range(4)]
    try:
        assert sorted(s.getsockname()[1] for s in held) == list(range(r.low, r.high + 1))
        with pytest.raises(duotf.PortRangeError):
            ports.reserve(ports=r)
        # what TensorFlow's server does: a socket with both reuse options binds the held port
        tf_like = ports._reserving_socket()
        tf_like.bind(("0.0.0.0", held[0].getsockname()[1]))
        tf_like.listen()
        tf_like.close()
    finally:
        for s in held:
            s.close()


def test_a_reservation_waits_for_the_hosts_lock_held_by_another_process():
    # the agents of one host pick their TensorFlow ports one at a time: between the check that a
    # port is free and the reserving bind (which SO_REUSEPORT would let two sockets make), no
    # other process of the host picks
    import select
    import subprocess
    import sys

    r = _free_range(2)
    code = ("import sys; from duotf._transport import ports; "
            f"s = ports.reserve(ports=ports.PortRange({r.low}, {r.high})); "
            "print(s.getsockname()[1], flush=True); sys.stdin.read()")
    with ports._host_lock():
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert select.select([proc.stdout], [], [], 5)[0] == [], "reserved while the lock was held"
        except BaseException:
            proc.kill()
            raise
    try:
        assert select.select([proc.stdout], [], [], 30)[0], "no reservation once the lock was free"
        assert int(proc.stdout.readline()) in r
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_the_run_keyword_beats_the_drivers_environment_and_is_passed_to_the_nodes(monkeypatch):
    monkeypatch.setenv("DUOTF_PORTS", "41000-41010")
    assert job_ports({}, None) == {"DUOTF_PORTS": "41000-41010"}
    assert job_ports({"A": "1"}, "42000-42010") == {"A": "1", "DUOTF_PORTS": "42000-42010"}
    monkeypatch.delenv("DUOTF_PORTS")
    assert job_ports({}, None) == {}
    with pytest.raises(duotf.ConfigError, match="ports='9-8'"):
        job_ports({}, "9-8")


def test_a_run_whose_range_is_taken_on_the_driver_says_so_before_anything_starts():
    r = _free_range(1)
    held = socket.create_server(("0.0.0.0", r.low))
    try:
        with pytest.raises(duotf.PortRangeError, match="the rendezvous server"):
            duotf.run(lambda args, ctx: None, backend="local", ports=str(r))
    finally:
        held.close()


def test_a_range_full_on_the_nodes_host_fails_the_run_at_once_naming_it():
    # the driver takes the range's one free port: the node's TensorFlow port finds none
    r = _free_range(2)
    held = socket.create_server(("0.0.0.0", r.high))
    try:
        with pytest.raises(duotf.DuotfError, match=f"no free port for a node's TensorFlow server .* "
                                                   f"DUOTF_PORTS={r}"):
            duotf.run(lambda args, ctx: None, backend="local", ports=str(r), reservation_timeout=60)
    finally:
        held.close()


@pytest.mark.slow  # two doctor runs, each importing TensorFlow in its probes' node checks
def test_the_doctor_checks_the_range_on_every_probe_and_names_a_full_one():
    from duotf.backends.base import CheckStatus

    r = _free_range(40)
    report = duotf.doctor("local", duotf.ClusterSpec(workers=2), env={"DUOTF_PORTS": str(r)})
    check = report["port range"]
    assert check.status is CheckStatus.OK, report.table()
    assert f"2 probe tasks listened in DUOTF_PORTS={r}" in check.detail
    # a range of one port: the driver's rendezvous server takes it, no probe finds one
    one = _free_range(1)
    report = duotf.doctor("local", duotf.ClusterSpec(workers=2), env={"DUOTF_PORTS": str(one)})
    check = report["port range"]
    assert check.status is CheckStatus.FAIL and f"DUOTF_PORTS={one}" in check.detail, report.table()
    assert "widen the range" in check.fix


def test_run_parallel_passes_the_range_to_every_run():
    r = _free_range(20)
    def main(args, ctx):
        import os
        return args, os.environ.get("DUOTF_PORTS")

    runs = duotf.run_parallel(main, [1, 2], "local", ports=str(r), timeout=120)
    assert [run.value for run in runs] == [[(1, str(r))], [(2, str(r))]], runs


# -- DUOTF_BIND: the address to listen on ----------------------------------------------------------
@pytest.mark.parametrize("text", ["lo", "127.0.0.0/8", "127.0.0.1"])
def test_bind_takes_a_network_an_interface_or_an_address_of_this_host(text):
    assert ports.bind_address({"DUOTF_BIND": text}) == "127.0.0.1"
    assert ports.bind_address({}) is None and ports.bind_address({"DUOTF_BIND": " "}) is None


@pytest.mark.parametrize("text, words", [("10.254.253.0/24", "no address of"),
                                         ("not-an-interface0", "is no network, interface or address")])
def test_a_bind_that_names_nothing_here_says_the_hosts_addresses(text, words):
    with pytest.raises(duotf.ConfigError) as info:
        ports.bind_address({"DUOTF_BIND": text})
    assert words in str(info.value) and "lo 127.0.0.1" in str(info.value), str(info.value)
    assert info.value.param == "bind"


def test_servers_and_reservations_listen_on_the_bound_address_and_the_run_passes_it_on(monkeypatch):
    env = {"DUOTF_BIND": "lo"}
    with ports.create_server(env=env) as server, ports.reserve(env=env) as held:
        assert server.getsockname()[0] == held.getsockname()[0] == "127.0.0.1"
    with ports.create_server(env={}) as server:
        assert server.getsockname()[0] == "0.0.0.0"
    monkeypatch.setenv("DUOTF_BIND", "127.0.0.0/8")
    assert job_ports({}, None)["DUOTF_BIND"] == "127.0.0.0/8"  # the driver's, to the nodes
    assert job_ports({"DUOTF_BIND": "lo"}, None)["DUOTF_BIND"] == "lo"  # the job's own first


@pytest.mark.slow  # a doctor run, importing TensorFlow in its probes' node checks
def test_the_doctor_checks_the_bound_address_on_every_probe():
    from duotf.backends.base import CheckStatus

    report = duotf.doctor("local", duotf.ClusterSpec(workers=2), env={"DUOTF_BIND": "127.0.0.0/8"})
    check = report["bind address"]
    assert check.status is CheckStatus.OK, report.table()
    assert "2 probe tasks listened on DUOTF_BIND=127.0.0.0/8: 127.0.0.1" in check.detail
