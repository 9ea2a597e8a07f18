"""A node's GPUs: the device addresses an engine scheduled for it, as the node process's
``CUDA_VISIBLE_DEVICES``.

An engine hands a node task the addresses of the GPUs it holds for that node (Spark: the
barrier task's ``gpu`` resource addresses; Dask: duotf's share of the worker's ``GPU``
resource; the local backend: its own list). Address ``i`` means the i-th device the engine's
process sees: the i-th entry of that process's ``CUDA_VISIBLE_DEVICES`` where one is set (YARN,
Kubernetes and dask-cuda give each executor or worker a list of its own), else device ``i`` of
the machine. The node process then sees exactly its devices, which TensorFlow numbers
``/GPU:0``, ``/GPU:1``, ... in that order.

This runs on the task side (the node agent), with the environment of the engine's process.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from duotf.errors import ConfigError

__all__ = ["visible_devices"]


def visible_devices(addresses: Sequence[str], visible: Optional[str]) -> List[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of a node given the engine's ``addresses`` for it
    and the engine process's own ``CUDA_VISIBLE_DEVICES`` (``visible``, None where unset).

    Raises :class:`ConfigError` where an address picks no visible device.
    """
    addresses = [str(a).strip() for a in addresses]
    if len(set(addresses)) != len(addresses):
        raise ConfigError(f"the engine gave this node the GPU addresses {addresses}, one of them "
                          "twice: check the GPU discovery script of the executors or workers")
    if visible is None:
        return addresses
    devices = [d.strip() for d in visible.split(",") if d.strip()]
    chosen = []
    for address in addresses:
        try:
            index = int(address)
        except ValueError:
            index = -1
        if not 0 <= index < len(devices):
            raise ConfigError(
                f"the engine gave this node GPU address {address!r}, but its process sees "
                f"CUDA_VISIBLE_DEVICES={visible!r} ({len(devices)} devices), and address i means "
                "the i-th visible device: make the GPU discovery script (Spark) or the "
                "--resources GPU=n of the worker (Dask) count the devices in "
                "CUDA_VISIBLE_DEVICES, numbered from 0")
        chosen.append(devices[index])
    return chosen
