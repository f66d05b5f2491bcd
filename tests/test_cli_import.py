"""``lpx-tvm --help`` imports neither TVM nor torch (together they take seconds), and
TVM still knows the ``lpx`` target tag and Relax pipeline after ``import lpx_tvm``,
whichever of the two is imported first. Each check runs in a fresh process."""

import json
import subprocess
import sys

import pytest

HELP = """
import json, sys
from lpx_tvm import cli
for argv in [["--help"]] + [[name, "--help"] for name in cli.COMMANDS]:
    try:
        cli.main(argv)
    except SystemExit as e:
        assert e.code == 0, (argv, e.code)
print(json.dumps({m: m in sys.modules for m in ("tvm", "torch", "tvm_ffi")}))
"""

REGISTERED = """
import json
{imports}
from tvm import relax
print(json.dumps([list(tvm.target.Target("lpx").keys), "lpx" in relax.pipeline.PIPELINE_MAP]))
"""


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_help_of_every_command_imports_neither_tvm_nor_torch():
    loaded = json.loads(_run(HELP))
    assert loaded == {"tvm": False, "torch": False, "tvm_ffi": False}


@pytest.mark.parametrize("imports", ["import lpx_tvm\nimport tvm", "import tvm\nimport lpx_tvm"])
def test_tvm_knows_the_lpx_target_and_pipeline_after_import_lpx_tvm(imports):
    assert json.loads(_run(REGISTERED.format(imports=imports))) == [["lpx", "cpu"], True]
