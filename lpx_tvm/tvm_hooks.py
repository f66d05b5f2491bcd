"""What importing lpx_tvm registers with TVM: the ``"lpx"`` target tag and the Relax
pipeline ``"lpx"``, so ``tvm.compile(mod, target="lpx", relax_pipeline="lpx")`` works.

The pipeline's stages are imported when the pipeline first runs, not here: a program
that only loads and runs an artifact never imports the compiler.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .runtime.region import TARGET_TAG


def register():
    tvm.target.tag.register_tag(TARGET_TAG, {"kind": "llvm", "keys": ["lpx", "cpu"]}, override=True)
    if "lpx" in relax.pipeline.PIPELINE_MAP:
        return

    @relax.register_pipeline("lpx")
    def _lpx_pipeline(preset="tsp", precision="fp16"):
        @tvm.transform.module_pass(opt_level=0, name="LPXPipeline")
        def _pass(mod, _ctx):
            from .pipeline import lower_for_tvm_compile

            return lower_for_tvm_compile(mod, preset, precision)
        return _pass


register()
