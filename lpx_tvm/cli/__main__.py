"""``python -m lpx_tvm.cli``: the ``lpx-tvm`` command."""

import sys

from .main import main

sys.exit(main())
