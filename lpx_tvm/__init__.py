"""lpx_tvm: a TVM-based compiler, cycle-exact simulator and runtime for the LPX processor.

Importing the package registers the ``"lpx"`` target tag and Relax pipeline, so
``tvm.compile(mod, target="lpx", relax_pipeline="lpx")`` works after ``import lpx_tvm``
(registered when TVM is imported: the package itself imports neither TVM nor torch,
:mod:`lpx_tvm.tvm_hooks`).
PyTorch models come in through :func:`from_torch` and ``torch.compile(m, backend="lpx")``
(see docs/pytorch.md); torch is optional and imported only when they are used.

The compiler is imported when one of its entry points is first used: a program that
only loads and runs an artifact (:func:`load`) never imports it.
"""

import importlib

from . import tvm_hooks
from .errors import LPXError

__version__ = "0.1.0"

tvm_hooks.register_when_tvm_is_imported()

# Top-level names -> the module that defines them, imported on first use.
_LAZY = {
    "LPXConfig": "machine.config", "load_config": "machine.config",
    "build": "api", "compile_model": "api", "load": "runtime.compiled_model",
    "from_torch": "frontends.torch", "import_torch": "frontends.torch",
    "dynamo_backend": "frontends.dynamo", "DynamoBackend": "frontends.dynamo",
    "compile_llm": "llm.session", "LLMSession": "llm.session",
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "LPXError", "LPXConfig", "load_config", "build", "compile_model", "load",
    "from_torch", "import_torch", "dynamo_backend", "DynamoBackend", "compile_llm", "LLMSession", "__version__",
]
