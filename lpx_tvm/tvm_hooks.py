"""What lpx_tvm registers with TVM: the ``"lpx"`` target tag and the Relax pipeline
``"lpx"``, so ``tvm.compile(mod, target="lpx", relax_pipeline="lpx")`` works after
``import lpx_tvm``.

Importing TVM takes seconds (it imports torch too), and ``lpx-tvm --help`` or a program
that only reads machine files needs neither: importing lpx_tvm calls
:func:`register_when_tvm_is_imported`, which registers at once if TVM is already
imported and otherwise as soon as anything imports it (lpx_tvm's compiler, or the
user's ``import tvm``), before any of it can be used. The pipeline's stages are imported
when the pipeline first runs: a program that only loads and runs an artifact never
imports the compiler.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


def register():
    """Register the target tag and the Relax pipeline (TVM must be importable)."""
    import tvm
    from tvm import relax

    from .runtime.compiled_region import TARGET_TAG

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


def register_when_tvm_is_imported():
    """:func:`register` now if ``tvm`` is imported, else right after its import."""
    if "tvm" in sys.modules:
        register()
    elif not any(isinstance(f, _AfterTvmImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTvmImport())


class _AfterTvmImport(importlib.abc.MetaPathFinder):
    """Finds ``tvm`` as the other finders do, and has its loader call :func:`register`
    once the package has been executed (then leaves ``sys.meta_path``)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "tvm":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            sys.meta_path.insert(0, self)
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            try:
                exec_module(module)
            except BaseException:
                sys.meta_path.insert(0, self)  # a later import that succeeds still registers
                raise
            register()

        spec.loader.exec_module = exec_then_register
        return spec
