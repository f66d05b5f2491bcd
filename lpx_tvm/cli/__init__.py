"""The ``lpx-tvm`` command line, one module per command (as tvmc's): each module
defines its command's arguments and its handler; :mod:`.main` collects them into
:data:`COMMANDS` and one parser, and turns library errors into one
``lpx-tvm: error:`` line. :mod:`.arguments` and :mod:`.reports` hold what the commands
share: the flags' parsers and the report printers.
"""

from .arguments import EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, _bundled_model, fill_inputs
from .demo import _profile_command
from .main import COMMANDS, build_parser, main
from .profiling import PROFILE_HEADS

__all__ = ["COMMANDS", "EXIT_INPUT", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "PROFILE_HEADS", "_bundled_model",
           "_profile_command", "build_parser", "fill_inputs", "main"]
