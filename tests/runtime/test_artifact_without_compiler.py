"""A loaded artifact runs without the compiler: in a fresh process, ``lpx_tvm.load`` and
``run`` import none of the compiler's packages, and give the outputs the compiled model
gave. (Which package may import which is tests/test_import_map.py's; this checks what a
real process loads, lazy imports included.)"""

import json
import pathlib
import subprocess
import sys

import numpy as np

import lpx_tvm
from lpx_tvm.runtime.compiled_model import CompiledModel

COMPILER = ("lpx_tvm.target", "lpx_tvm.tir_schedules", "lpx_tvm.relax_passes", "lpx_tvm.tune",
            "lpx_tvm.pipeline", "lpx_tvm.api", "lpx_tvm.frontends")

SCRIPT = """
import json, sys
import numpy as np
import lpx_tvm
model = lpx_tvm.load(sys.argv[1])
y = model.run({"x": np.load(sys.argv[2])})["y"]
np.save(sys.argv[3], y)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("lpx_tvm"))))
"""


def test_a_loaded_artifact_imports_no_compiler_code(tmp_path):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "e2e"))
    import test_build  # the small CNN

    model = lpx_tvm.compile_model(test_build.small_cnn(), preset="mini", precision="fp32")
    assert isinstance(model, CompiledModel)
    x = np.random.default_rng(4).standard_normal((1, 3, 12, 12)).astype(np.float32)
    want = model.run({"x": x})["y"]
    model.save(tmp_path / "art")
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "art"), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "lpx_tvm.runtime.artifact" in loaded and "lpx_tvm.sim.simulator" in loaded
    bad = [m for m in loaded if m.startswith(COMPILER)]
    assert not bad, f"loading an artifact imported compiler modules: {bad}"
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)
