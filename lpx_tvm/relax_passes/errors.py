"""Errors raised by the graph front end: importing, canonicalizing and partitioning."""

from ..errors import LPXError


class ModelError(LPXError):
    """A model cannot be imported: missing file, not ONNX, dynamic shapes, unsupported op."""


class PartitionError(LPXError):
    """An option given to partitioning is invalid (for example an unknown precision)."""
