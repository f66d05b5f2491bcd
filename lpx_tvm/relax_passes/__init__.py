"""Graph passes for LPX: ONNX import, canonicalization, BYOC patterns and partitioning.

Importing this package registers the ``lpx.`` patterns.
"""

from .canonicalize import canonicalize
from .errors import ModelError, PartitionError
from .importer import ImportedModel, import_onnx
from .partition import CpuOp, OffloadReport, offload_report, partition_for_lpx
from .patterns import RejectionLog, check_settings, pattern_table

__all__ = [
    "CpuOp",
    "ImportedModel",
    "ModelError",
    "OffloadReport",
    "PartitionError",
    "RejectionLog",
    "canonicalize",
    "check_settings",
    "import_onnx",
    "offload_report",
    "partition_for_lpx",
    "pattern_table",
]
