"""duotf: distributed TensorFlow on the Spark and Dask clusters you already have.

``import duotf`` is light: it imports neither TensorFlow, pyspark nor distributed, nor numpy:
the names below come from their modules when first used. Every node process imports this
package first (``python -m duotf._node.child``), so what it imports here each node start pays for.
"""

from duotf._driver.doctor import DoctorReport, doctor  # light; and a function named as its module
from duotf.errors import (BackendError, ClusterClosedError, ConfigError, DuotfError, FeedError, FeedSchemaError, InsufficientSlotsError, NodeError, NodeFailedError, NodesStoppedError, NodeUnresponsiveError, PortRangeError, ReservationTimeoutError, SchemaMismatchError, TensorBoardError, TFRecordCorruptError, UnsupportedProtocolError)
from duotf.reports import StreamReport, TrainReport
from duotf.spec import ClusterSpec, Job, Role
from duotf._verbosity import set_verbose
from duotf._names import lazy as _lazy

from duotf._version import __version__ as _package_version

__version__ = _package_version

__all__ = [
    "run",
    "run_parallel",
    "set_verbose",
    "RunResult",
    "doctor",
    "DoctorReport",
    "Report",
    "TrainReport",
    "StreamReport",
    "Cluster",
    "ClusterStatus",
    "ClusterSpec",
    "NodeContext",
    "NodeInfo",
    "NodeState",
    "Role",
    "Job",
    "DuotfError",
    "ConfigError",
    "PortRangeError",
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

#: names imported when first used: their modules import numpy, pandas or an engine
_LAZY = {
    "run": "duotf._driver.api",
    "Cluster": "duotf._driver.cluster",
    "ClusterStatus": "duotf._driver.cluster",
    "NodeInfo": "duotf._driver.cluster",
    "NodeState": "duotf._driver.nodes",
    "NodeContext": "duotf.context",
    "RaggedColumn": "duotf._transport.columns",
    "Report": "duotf._driver.metrics",
    "RunResult": "duotf._driver.parallel",
    "run_parallel": "duotf._driver.parallel",
    "predict_udf": "duotf.spark",
}


__getattr__, __dir__ = _lazy(__name__, _LAZY, submodules=True)
