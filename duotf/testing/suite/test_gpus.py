"""GPUs per node on the suite's engines, none of which has GPUs: a spec asking for them fails
before anything starts, naming the engine's setting (the clusters with GPUs, fake ones, are in
tests/test_gpus.py and the GPU block of docs/guides/gpus.md)."""

from __future__ import annotations

import time

import pytest

import duotf
from duotf.testing.suite import mains


def test_a_spec_asking_for_gpus_fails_up_front_naming_the_setting_to_add(backend, engine, tmp_path):
    spec = duotf.ClusterSpec(workers=2, gpus_per_node=1)
    t0 = time.monotonic()
    with pytest.raises(duotf.ConfigError) as run_error:
        duotf.run(mains.describe_main, {"marker": str(tmp_path)}, backend, spec)
    with pytest.raises(duotf.ConfigError) as parallel_error:
        duotf.run_parallel(mains.describe_main, [{"marker": str(tmp_path)}] * 2, backend, spec)
    assert time.monotonic() - t0 < 15
    for err in (run_error.value, parallel_error.value):
        message = str(err)
        assert "gpus_per_node=1" in message and engine.gpu_setting in message, message
        assert "gpus_per_node=0" in message, message
    assert not list(tmp_path.iterdir()), "a node ran although its GPUs were refused"
