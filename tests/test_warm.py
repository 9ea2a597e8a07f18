"""Warm node processes (duotf._node.warm): after a first run, the nodes of the next runs are
forked by a server that imported TensorFlow once, and are the same nodes as spawned ones to
everything that looks at them: their command line and environment in /proc, their module path,
temp folder, random state and exit status. On the embedded backend, whose engine worker is this
process; the shared suite runs every engine with them on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import psutil
import pytest

import duotf
from duotf.testing import poll_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm nodes are Linux's")

SPEC = duotf.ClusterSpec(workers=2)
#: a variable of the servers' own (DUOTF_WARM_*, part of what picks a server), at its default:
#: these tests' nodes get servers of their own, which the rest of the suite's nodes (in the
#: same environment otherwise, one server per engine worker) neither start, use nor end
OWN = {"DUOTF_WARM_IDLE": "900"}


def describe(args, ctx):
    """What a node sees of itself at the start of main."""
    import os
    import sys
    import tempfile

    import numpy as np
    import psutil

    me = psutil.Process()
    with open(f"/proc/{os.getpid()}/environ", "rb") as f:
        proc_env = dict(i.split(b"=", 1) for i in f.read().split(b"\0") if b"=" in i)
    return {
        "tf_before_main": "tensorflow" in sys.modules,
        "keras_before_main": "keras" in sys.modules,
        "hooks": [type(f).__name__ for f in sys.meta_path].count("_ApplyOnImport"),
        "parent": " ".join(me.parent().cmdline()),
        "cmdline": me.cmdline()[1:3],
        "proc_tags": (proc_env.get(b"DUOTF_JOB_ID", b"").decode(), proc_env.get(b"DUOTF_NODE_ID", b"").decode()),
        "tags": (os.environ["DUOTF_JOB_ID"], os.environ["DUOTF_NODE_ID"]),
        "own_session": os.getsid(0) == os.getpid(),
        "tmp": tempfile.gettempdir(),
        "cwd": os.getcwd(),
        "random": float(np.random.random()),
        "beside": __import__("beside_the_script").VALUE if args else None,
    }


def run_twice(env=None, args=None):
    """Runs of ``describe`` with ``env``: the first two spawn their nodes (the second starts the
    server), the third is forked; the first and the last are returned."""
    from duotf._node import warm

    results = []
    for _ in range(3):
        with duotf.run(describe, args, "local", SPEC, env=dict(OWN, **(env or {}))) as cluster:
            results.append((cluster.job_id, cluster.wait(timeout=120)))
        # a run right after a server started spawns its nodes beside it: wait for its import
        poll_for(lambda: all((warm._ask(name, "ping") or {}).get("imported", True)
                             for name in warm._servers_here()), 120, what="warm servers ready")
    return [results[0], results[-1]]


def test_a_second_run_is_forked_with_tensorflow_imported_and_looks_spawned(tmp_path):
    (tmp_path / "beside_the_script.py").write_text("VALUE = 'found'\n")
    env = {"PYTHONPATH": str(tmp_path), "TMPDIR": str(tmp_path)}
    (_, first), (job_id, second) = run_twice(env, args=True)
    for node_id, node in enumerate(second):
        assert node["tf_before_main"] and "duotf._node.warm" in node["parent"], node
        # what ps, the driver's kill by pid and the tests' leak checks read
        assert node["cmdline"] == ["-m", "duotf._node.child"]
        assert node["proc_tags"] == node["tags"] == (job_id, str(node_id))
        assert node["own_session"]
        # the node's own environment, not the server's: its PYTHONPATH and temp folder
        assert node["beside"] == "found" and node["tmp"] == str(tmp_path)
        assert node["cwd"].endswith(f"node-{node_id}")  # its working directory
    # a fresh process's random state in each: no two nodes, and no two runs, alike
    draws = [n["random"] for n in first + second]
    assert len(set(draws)) == len(draws)


#: a sitecustomize that makes a warm node server's import of TensorFlow start 3 s late
SLOW_SERVER_IMPORT = textwrap.dedent("""
    import sys, time

    class _Late:
        def find_spec(self, name, path=None, target=None):
            if name == "tensorflow" and "duotf._node.warm" in sys.orig_argv:
                sys.meta_path.remove(self)
                time.sleep(3)
            return None

    sys.meta_path.insert(0, _Late())
""")


def test_the_nodes_of_a_run_that_comes_while_the_server_imports_wait_for_it(tmp_path):
    """The second run starts the server; the third comes while it still imports (3 s late,
    then TensorFlow): its nodes are forked once the import ends, not spawned to import
    TensorFlow each beside it (the second run's later node may wait for it too)."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_SERVER_IMPORT)
    # a server of its own (a variable its import may read), which the sitecustomize slows
    env = {"PYTHONPATH": str(tmp_path), "TMPDIR": str(tmp_path), "DUOTF_WARM_CASE": str(tmp_path)}
    runs = []
    for _ in range(3):
        with duotf.run(describe, None, "local", SPEC, env=env) as cluster:
            runs.append(cluster.wait(timeout=120))
    for node in runs[0]:
        assert "duotf._node.warm" not in node["parent"], node
    for node in runs[2]:
        assert node["tf_before_main"] and "duotf._node.warm" in node["parent"], node


def test_keras_is_fixed_in_a_warm_node_and_waited_for_in_a_spawned_one():
    (_, _), (_, warm) = run_twice()
    (_, _), (_, cold) = run_twice({"DUOTF_WARM_NODES": "0"})
    for node in warm:
        assert node["keras_before_main"] and node["hooks"] == 0, node
    for node in cold:  # spawned, TensorFlow not imported: the fix waits for Keras's import
        assert not node["tf_before_main"] and not node["keras_before_main"], node
        assert node["hooks"] == 1 and "duotf._node.warm" not in node["parent"], node


def exits(args, ctx):
    import os

    os._exit(args)


@pytest.mark.parametrize("code", [3, 0])
def test_a_warm_node_exit_status_reaches_the_driver(code):
    run_twice()  # a server for this environment serves
    with duotf.run(exits, code, "local", duotf.ClusterSpec(workers=1), env=OWN) as cluster:
        with pytest.raises(duotf.errors.NodeError) as raised:
            cluster.wait(timeout=60)
    assert f"exited with code {code}" in str(raised.value)


def test_a_server_ends_with_the_process_that_started_it(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent("""
        import os
        import duotf

        def main(args, ctx):
            import sys
            before = "tensorflow" in sys.modules
            import tensorflow
            return before

        print(os.getpid())
        # the second run starts the server; a later one is forked by it (the third, unless on
        # busy cores the server's import, hurried by the node that waits for it, outlasts
        # warm.HOLD: that node is spawned, and the next one waits again)
        for run in range(6):
            with duotf.run(main, backend="local", spec=duotf.ClusterSpec(workers=1)) as c:
                warm = c.wait(timeout=120)[0]
            if warm:
                break
        print(warm)
    """))
    driver = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=280, env=dict(os.environ, **OWN))
    assert driver.returncode == 0, driver.stderr
    pid, warm = driver.stdout.split()
    assert warm == "True"  # a run was forked by the server

    def its_servers():
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            server = "duotf._node.warm_server"
            if server in cmdline and cmdline[cmdline.index(server) + 2] == pid:
                found.append(proc)
        return found

    poll_for(lambda: not its_servers(), 30, what="the driver's warm node server gone")


def test_the_nodes_of_two_spark_executors_share_a_server_and_a_hash_seed_does_not():
    # each executor's Python workers get a secret and a port of their own from Spark's JVM
    # (PYTHON_WORKER_FACTORY_*): no import reads them, so they pick no server; PYTHONHASHSEED,
    # which Python reads at start, does
    from duotf._node import warm

    env = {"PYTHONHASHSEED": "0", "PYTHON_UDF_BATCH_SIZE": "100", "TF_CPP_MIN_LOG_LEVEL": "1"}
    first = warm.address(dict(env, PYTHON_WORKER_FACTORY_SECRET="a" * 64), os.getcwd())
    assert warm.address(dict(env, PYTHON_WORKER_FACTORY_SECRET="b" * 64), os.getcwd()) == first
    assert warm.address(dict(env, PYTHON_WORKER_FACTORY_PORT="4"), os.getcwd()) == first
    assert warm.address(dict(env, PYTHONHASHSEED="1"), os.getcwd()) != first
    assert warm.address(dict(env, TF_CPP_MIN_LOG_LEVEL="3"), os.getcwd()) != first


def test_the_servers_of_a_host_are_capped(monkeypatch):
    from duotf._node import warm

    def mine():  # the servers this process (the embedded backend's engine worker) started
        return [name for name in warm._servers_here()
                if (warm._ask(name, "ping") or {}).get("owner") == os.getpid()]

    monkeypatch.setenv(warm.MAX, "1")
    names = []
    for level in ("2", "3"):  # two environments: two servers, one at a time
        run_twice({"TF_CPP_MIN_LOG_LEVEL": level})
        names.append(poll_for(lambda: [n for n in mine() if n not in names], 30,
                              what="a server listening")[0])
    poll_for(lambda: mine() == [names[1]], 30, what="the last one alone")


def test_a_warm_node_goes_with_its_agent(tmp_path):
    """An engine task killed with its executor or worker takes its node with it, forked or not
    (a spawned node's agent is its parent, a forked one's is not): the node hears its pipes
    from the agent close and ends itself."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        import duotf
        from duotf._node import warm as server
        from duotf.testing import poll_for

        def quick(args, ctx):
            return 1

        def main(args, ctx):
            import os, time
            with open(os.path.join(args, "node"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)

        for _ in range(2):  # the second run starts the server
            with duotf.run(quick, backend="local", spec=duotf.ClusterSpec(workers=1)) as c:
                c.wait(timeout=120)
        poll_for(lambda: all((server._ask(n, "ping") or {}).get("imported", True)
                             for n in server._servers_here()), 120, what="its server ready")
        cluster = duotf.run(main, sys.argv[1], backend="local", spec=duotf.ClusterSpec(workers=1))
        time.sleep(600)
    """))
    # a killed driver leaves its job's folders: in the test's own
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path,
                              env=dict(os.environ, TMPDIR=str(tmp_path), **OWN),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = int(poll_for(lambda: (tmp_path / "node").exists() and (tmp_path / "node").read_text(),
                           180, what="the node's pid"))
        assert "duotf._node.warm" in " ".join(psutil.Process(pid).parent().cmdline())  # forked
    finally:
        driver.kill()  # the agent (the embedded backend's, in the driver) dies without a word
        driver.wait()
    poll_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
             10, what="the node gone with its agent")
