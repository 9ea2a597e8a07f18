"""Spec, errors, port reservation and the public surface; no engine needed."""

from __future__ import annotations

import configparser
import inspect
import pathlib
import pickle
import re
import socket
import subprocess
import sys
import types

import pytest

import duotf
from duotf._node.agent import reserve_port


def test_roles_are_deterministic_and_tf_config_follows_tf_conventions():
    spec = duotf.ClusterSpec(workers=2, ps=1, chief=True, evaluator=True)
    assert [str(r) for r in spec.roles()] == ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]
    addrs = [f"h:{i}" for i in range(5)]
    assert spec.tf_cluster(addrs) == {"chief": ["h:0"], "worker": ["h:1", "h:2"], "ps": ["h:3"]}
    assert spec.tf_config(addrs, 4)["task"] == {"type": "evaluator", "index": 0}
    assert spec.tf_config(addrs, 2)["task"] == {"type": "worker", "index": 1}


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"workers": -1}, "workers must be an int >= 0"),
        ({"workers": 0}, "at least one worker or a chief"),
        ({"protocol": "tcp"}, "grpc, grpc+verbs"),
        ({"ps": 1.5}, "ps must be an int"),
    ],
)
def test_bad_spec_says_what_to_change(kwargs, words):
    with pytest.raises(duotf.ConfigError, match=words.replace("+", "\\+")):
        duotf.ClusterSpec(**kwargs)


def test_errors_pickle_with_their_attributes():
    err = duotf.NodeFailedError("worker:1 failed", node_id=1, role="worker:1", exitcode=-9,
                                remote_type="ValueError", remote_traceback="tb", host="h", pid=3)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is duotf.NodeFailedError and str(back) == "worker:1 failed"
    assert (back.node_id, back.exitcode, back.remote_traceback) == (1, -9, "tb")
    assert isinstance(back, duotf.NodeError) and isinstance(back, duotf.DuotfError)
    assert isinstance(duotf.ReservationTimeoutError("x"), TimeoutError)
    assert isinstance(duotf.UnsupportedProtocolError("x"), ValueError)


def test_import_is_light():
    """``import duotf``, and what every node process imports before its main (the package and
    ``duotf._node.child``), import no engine, TensorFlow, numpy, pandas, Arrow nor MLflow: each
    node start would pay for them."""
    code = (
        "import sys, duotf, duotf._node.child\n"
        "heavy = [m for m in ('tensorflow', 'pyspark', 'distributed', 'dask', 'numpy', 'pandas',\n"
        "                     'pyarrow', 'mlflow') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_exported_members():
    for name in duotf.__all__:
        assert hasattr(duotf, name), name
    public = {n for n in dir(duotf) if not n.startswith("_")}
    modules = {n for n in public if isinstance(getattr(duotf, n), types.ModuleType)}
    assert public - modules - {"__version__"} == set(duotf.__all__)


def test_every_error_is_exported_and_drawn_in_the_tree():
    import duotf.errors

    tree = duotf.errors.__doc__
    assert set(duotf.errors.__all__) <= set(duotf.__all__)
    drawn = re.findall(r"^\s*(?:[│ ]*[├└]── )?(\w+Error)\b", tree, re.MULTILINE)
    assert sorted(drawn) == sorted(duotf.errors.__all__), "the tree in duotf/errors.py"
    # the old homes of the file errors still work
    from duotf.io.example import SchemaMismatchError
    from duotf.io.tfrecord import TFRecordCorruptError

    assert TFRecordCorruptError is duotf.TFRecordCorruptError and isinstance(TFRecordCorruptError("x"), OSError)
    assert SchemaMismatchError is duotf.SchemaMismatchError and isinstance(SchemaMismatchError("x"), ValueError)


def test_package_is_typed():
    package = pathlib.Path(duotf.__file__).parent
    assert (package / "py.typed").is_file()
    setup_cfg = package.parent / "setup.cfg"
    if not setup_cfg.is_file():
        pytest.skip("not run from a source tree")
    config = configparser.ConfigParser()
    config.read(setup_cfg)
    assert "py.typed" in config["options.package_data"]["duotf"].split()


def test_run_has_no_input_mode():
    # The feed server always runs: there is no mode to choose.
    assert "input_mode" not in inspect.signature(duotf.run).parameters
    assert not hasattr(duotf, "InputMode")


def test_bad_run_arguments_fail_before_anything_starts():
    with pytest.raises(duotf.ConfigError, match="heartbeat_timeout"):
        duotf.run(lambda a, c: None, heartbeat_interval=2, heartbeat_timeout=3)
    with pytest.raises(duotf.ConfigError, match="callable"):
        duotf.run("main.py")
    for name in ("reservation_timeout", "heartbeat_interval", "heartbeat_timeout"):
        with pytest.raises(duotf.ConfigError, match=f"{name}=-1: give a finite number of seconds"):
            duotf.run(lambda a, c: None, **{name: -1})


def test_a_bad_timeout_in_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("DUOTF_RESERVATION_TIMEOUT", "-5")
    with pytest.raises(duotf.ConfigError, match="DUOTF_RESERVATION_TIMEOUT=-5.0"):
        duotf.run(lambda a, c: None)


@pytest.mark.parametrize("which", ["main", "args"])
def test_an_unpicklable_main_or_args_is_named(which):
    import threading

    lock = threading.Lock()
    main = (lambda a, c: lock) if which == "main" else (lambda a, c: None)
    args = {"lock": lock} if which == "args" else None
    with pytest.raises(duotf.ConfigError) as info:
        duotf.run(main, args, "local")
    assert str(info.value).startswith(f"{which} cannot be sent to the nodes: cloudpickle refused it")
    assert "lock" in str(info.value)


def test_reserved_port_is_held_but_tf_style_reuse_can_bind():
    held = reserve_port()
    port = held.getsockname()[1]
    try:
        plain = socket.socket()
        with pytest.raises(OSError):
            plain.bind(("0.0.0.0", port))  # another program cannot take it
        plain.close()
        reuse = socket.socket()
        reuse.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reuse.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reuse.bind(("0.0.0.0", port))  # gRPC sets both options, as here
        reuse.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # connections reach the real server, not the reservation
        reuse.close()
    finally:
        held.close()


def test_absolute_path_against_default_fs(tmp_path):
    from duotf.context import NodeContext

    def ctx(default_fs):
        return NodeContext(node_id=0, job_name="worker", task_index=0,
                           tf_config={"cluster": {"worker": ["h:1"]}, "task": {}},
                           working_dir=str(tmp_path), default_fs=default_fs, protocol="grpc",
                           host="h", port=1, job_id="j")

    import getpass

    assert ctx("file:///").absolute_path("m") == str(tmp_path / "m")
    assert ctx("hdfs://nn:8020").absolute_path("/data") == "hdfs://nn:8020/data"
    assert ctx("hdfs://nn:8020/").absolute_path("m") == f"hdfs://nn:8020/user/{getpass.getuser()}/m"
    assert ctx("hdfs://nn:8020").absolute_path("s3://b/k") == "s3://b/k"
