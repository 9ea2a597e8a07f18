"""The shape of a TensorFlow cluster: roles, counts, protocol; role assignment and TF_CONFIG."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

from duotf._enum import StrEnum
from duotf.errors import ConfigError

__all__ = ["ClusterSpec", "Job", "KNOWN_PROTOCOLS", "Role"]

KNOWN_PROTOCOLS = ("grpc", "grpc+verbs", "grpc+gdr", "grpc+mpi")
"""Protocols a ClusterSpec accepts. Whether the installed TensorFlow can serve one is checked on
the nodes before any user code runs (stock TensorFlow 2.x serves only "grpc")."""


class Job(StrEnum):
    """A TensorFlow job: the ``type`` of a task in ``TF_CONFIG``."""

    CHIEF = "chief"
    WORKER = "worker"
    PS = "ps"
    EVALUATOR = "evaluator"


@dataclasses.dataclass(frozen=True)
class Role:
    """One node's place in the TF cluster."""

    job: Job
    index: int

    def __post_init__(self):
        object.__setattr__(self, "job", Job(self.job))  # "worker" -> Job.WORKER; a typo fails

    def __str__(self) -> str:
        return f"{self.job}:{self.index}"


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """The TensorFlow cluster to run.

    Parameters
    ----------
    workers:
        Number of ``worker`` tasks (``MultiWorkerMirroredStrategy`` replicas, or the workers of a
        parameter-server job).
    ps:
        Number of parameter servers. duotf runs ``tf.distribute.Server`` on them until shutdown;
        ``main`` is not called on ps nodes.
    chief:
        Add a ``chief`` task (``ParameterServerStrategy``'s coordinator, or a dedicated chief).
    evaluator:
        Add an ``evaluator`` task; TF keeps it out of the ``cluster`` part of TF_CONFIG.
    protocol:
        The server protocol: ``"grpc"`` or an RDMA variant such as ``"grpc+verbs"`` where the
        TensorFlow build has one.
    gpus_per_node:
        GPUs each node (every role) gets for itself: the engine schedules them (a Spark task
        resource, a Dask worker resource ``GPU``) and the node process sees only them
        (``CUDA_VISIBLE_DEVICES``, ``ctx.gpus``). 0 (the default) leaves GPUs alone: a node
        then sees whatever its executor or worker sees.
    """

    workers: int = 1
    ps: int = 0
    chief: bool = False
    evaluator: bool = False
    protocol: str = "grpc"
    gpus_per_node: int = 0

    def __post_init__(self):
        for name in ("workers", "ps", "gpus_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"ClusterSpec.{name} must be an int >= 0, got {value!r}")
        if self.workers + int(self.chief) == 0:
            raise ConfigError(
                "ClusterSpec needs at least one worker or a chief: set workers=1 or chief=True"
            )
        if self.protocol not in KNOWN_PROTOCOLS:
            raise ConfigError(
                f"ClusterSpec.protocol={self.protocol!r} is not a TensorFlow server protocol; "
                f"use one of {', '.join(KNOWN_PROTOCOLS)}"
            )

    @property
    def num_nodes(self) -> int:
        return int(self.chief) + self.workers + self.ps + int(self.evaluator)

    def roles(self) -> List[Role]:
        """Roles in node-id order: chief, workers, ps, evaluator. Deterministic."""
        roles = [Role(Job.CHIEF, 0)] if self.chief else []
        roles += [Role(Job.WORKER, i) for i in range(self.workers)]
        roles += [Role(Job.PS, i) for i in range(self.ps)]
        if self.evaluator:
            roles.append(Role(Job.EVALUATOR, 0))
        return roles

    def tf_cluster(self, addresses: List[str]) -> Dict[str, List[str]]:
        """The ``cluster`` dict of TF_CONFIG from node addresses given in node-id order.

        The evaluator is left out, as TensorFlow expects.
        """
        if len(addresses) != self.num_nodes:
            raise ValueError(f"expected {self.num_nodes} addresses, got {len(addresses)}")
        cluster: Dict[str, List[str]] = {}
        for role, address in zip(self.roles(), addresses):
            if role.job is not Job.EVALUATOR:
                cluster.setdefault(role.job, []).append(address)
        return cluster

    def tf_config(self, addresses: List[str], node_id: int) -> dict:
        """The TF_CONFIG of node ``node_id``."""
        return self.tf_configs(addresses)[node_id]

    def tf_configs(self, addresses: List[str]) -> List[dict]:
        """Every node's TF_CONFIG, by node id. One ``cluster`` dict, shared by them all: the
        cluster is built once, not once per node (at a thousand nodes, 4 s of the start)."""
        cluster = self.tf_cluster(addresses)
        return [{"cluster": cluster, "task": {"type": role.job, "index": role.index}}
                for role in self.roles()]


def parse_address(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def seconds(value, name: str, *, zero: bool = False) -> float:
    """``value`` as a number of seconds, or a :class:`ConfigError` naming ``name``: positive
    (or zero where ``zero``), finite."""
    import math

    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is not a number of seconds") from None
    if math.isnan(number) or math.isinf(number) or number < 0 or (number == 0 and not zero):
        least = "zero or more" if zero else "more than zero"
        raise ConfigError(f"{name}={value!r}: give a finite number of seconds, {least}")
    return number
