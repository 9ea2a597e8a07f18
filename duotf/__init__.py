"""duotf: distributed TensorFlow on the Spark and Dask clusters you already have.

``import duotf`` is light: it imports neither TensorFlow, pyspark nor distributed.
"""

from .api import run
from .cluster import Cluster, ClusterStatus, NodeInfo
from .context import NodeContext
from .doctor import DoctorReport, doctor
from .errors import (
    BackendError,
    ClusterClosedError,
    ConfigError,
    DuotfError,
    FeedError,
    FeedSchemaError,
    InsufficientSlotsError,
    NodeError,
    NodeFailedError,
    NodesStoppedError,
    NodeUnresponsiveError,
    ReservationTimeoutError,
    SchemaMismatchError,
    TensorBoardError,
    TFRecordCorruptError,
    UnsupportedProtocolError,
)
from .feed.columns import RaggedColumn
from .metrics import Report
from .parallel import RunResult, run_parallel
from .spec import ClusterSpec, Role
from .verbosity import set_verbose

from ._version import __version__ as _package_version

__version__ = _package_version

__all__ = [
    "run",
    "run_parallel",
    "set_verbose",
    "RunResult",
    "doctor",
    "DoctorReport",
    "Report",
    "Cluster",
    "ClusterStatus",
    "ClusterSpec",
    "NodeContext",
    "NodeInfo",
    "Role",
    "DuotfError",
    "ConfigError",
    "UnsupportedProtocolError",
    "BackendError",
    "InsufficientSlotsError",
    "ReservationTimeoutError",
    "NodeError",
    "NodeFailedError",
    "NodeUnresponsiveError",
    "NodesStoppedError",
    "ClusterClosedError",
    "FeedError",
    "FeedSchemaError",
    "RaggedColumn",
    "TFRecordCorruptError",
    "SchemaMismatchError",
    "TensorBoardError",
    "predict_udf",
]

_LAZY = {"predict_udf": "duotf.spark"}  # names whose module imports more than duotf needs


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'duotf' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
