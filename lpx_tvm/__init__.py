"""lpx_tvm: a TVM-based compiler, cycle-exact simulator and runtime for the LPX processor.

Importing the package registers the ``"lpx"`` target tag and Relax pipeline, so
``tvm.compile(mod, target="lpx", relax_pipeline="lpx")`` works after ``import lpx_tvm``.
PyTorch models come in through :func:`from_torch` and ``torch.compile(m, backend="lpx")``
(see docs/pytorch.md); torch is optional and imported only when they are used.
"""

from .api import build, compile_model, load
from .errors import LPXError
from .frontends import DynamoBackend, dynamo_backend, from_torch, import_torch
from .machine.config import LPXConfig, load_config

__version__ = "0.1.0"
__all__ = [
    "LPXError", "LPXConfig", "load_config", "build", "compile_model", "load",
    "from_torch", "import_torch", "dynamo_backend", "DynamoBackend", "__version__",
]
