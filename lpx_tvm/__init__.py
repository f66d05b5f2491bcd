"""lpx_tvm: a TVM-based compiler, cycle-exact simulator and runtime for the LPX processor.

Importing the package registers the ``"lpx"`` target tag and Relax pipeline, so
``tvm.compile(mod, target="lpx", relax_pipeline="lpx")`` works after ``import lpx_tvm``.
"""

from .build import build
from .errors import LPXError
from .model import compile_model, load
from .target.config import LPXConfig, load_config

__version__ = "0.1.0"
__all__ = ["LPXError", "LPXConfig", "load_config", "build", "compile_model", "load", "__version__"]
