"""Model front ends beside ONNX: PyTorch through ``torch.export`` (:func:`from_torch`)
and ``torch.compile(model, backend="lpx")`` (:data:`dynamo_backend`).

torch is optional: these modules import it only when called.
"""

from .dynamo import DynamoBackend, LPXGraph, dynamo_backend
from .torch import ImportedTorch, from_torch, import_torch

__all__ = ["DynamoBackend", "ImportedTorch", "LPXGraph", "dynamo_backend", "from_torch", "import_torch"]
