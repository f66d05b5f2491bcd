"""lpx_tvm: a TVM-based compiler, cycle-exact simulator and runtime for the LPX processor."""

from .errors import LPXError
from .target.config import LPXConfig, load_config

__version__ = "0.1.0"
__all__ = ["LPXError", "LPXConfig", "load_config", "__version__"]
