"""PyTorch models in: ``torch.export`` -> Relax -> :func:`lpx_tvm.pipeline.compile_model`.

``from_torch(module, example_inputs)`` exports the module with the example inputs'
static shapes, imports the exported program with TVM's
``tvm.relax.frontend.torch.from_exported_program`` (parameters and buffers bound as
constants, so the LPX patterns see constant weights) and compiles it like an ONNX
model. PyTorch is an optional dependency: it is imported when one of these functions
is called, never when :mod:`lpx_tvm` is imported.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from ..relax_passes.errors import ModelError
from ..relax_passes.tvm_output import quiet_tvm

__all__ = ["ImportedTorch", "from_torch", "import_torch"]


@dataclass
class ImportedTorch:
    """A Relax module imported from a PyTorch module, and its interface.

    Attributes
    ----------
    mod : tvm.IRModule
        ``main`` takes the tensor inputs in ``inputs`` order; weights are constants.
    inputs : list of (str, tuple of int, str)
        Input name (the ``forward`` argument's name in the exported program), static
        shape and numpy dtype name.
    outputs : list of str
        ``output_0``, ``output_1``, ...: the module's tensor outputs, flattened in
        ``torch.utils._pytree`` order (a tuple, a dict's values, a ``ModelOutput``'s
        fields).
    exported_program : torch.export.ExportedProgram
        The program the module was imported from.
    """

    mod: object
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    exported_program: object = None


def require_torch():
    """Import torch, or raise a :class:`ModelError` saying how to install it."""
    try:
        import torch
    except ImportError:
        raise ModelError(
            "PyTorch is not installed; install the extra with: pip install 'lpx-tvm[torch]'"
        ) from None
    return torch


def import_torch(module, example_inputs) -> ImportedTorch:
    """Export a PyTorch module and import it into Relax.

    Parameters
    ----------
    module : torch.nn.Module
        The model, in the mode it should run in (call ``.eval()`` for inference).
    example_inputs : torch.Tensor, numpy.ndarray, or a tuple/list of them
        The positional inputs of ``forward``. Their shapes and dtypes are the compiled
        model's: LPX schedules are static.

    Raises
    ------
    ModelError
        torch is missing, ``module`` is not an ``nn.Module``, an input is not a tensor,
        ``torch.export`` cannot export the module, or TVM cannot import an op.
    """
    torch = require_torch()
    name = type(module).__name__
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"from_torch expects a torch.nn.Module, got {name}")
    args = _example_tuple(torch, example_inputs, name)
    with warnings.catch_warnings():
        # torch 2.13 warns about its own pytree internals (LeafSpec) as it copies a program
        warnings.filterwarnings("ignore", message=r".*LeafSpec", category=FutureWarning)
        try:
            with torch.no_grad():
                exported = torch.export.export(module, args)
        except Exception as e:  # torch.export raises many unrelated types
            raise ModelError(
                f"torch.export could not export {name}: {type(e).__name__}: {first_line(e)}"
            ) from e
        mod = exported_to_relax(exported, name)
    inputs = _user_inputs(exported, args, name)
    outputs = [f"output_{i}" for i in range(len(_user_output_specs(exported)))]
    return ImportedTorch(mod=mod, inputs=inputs, outputs=outputs, exported_program=exported)


def from_torch(module, example_inputs, preset="tsp", precision="fp16"):
    """Compile a PyTorch module for LPX.

    Returns a :class:`lpx_tvm.runtime.compiled_model.CompiledModel`: ``run(inputs)`` takes
    ``{name: array}`` or a list of arrays in input order and returns
    ``{"output_0": array, ...}``; ``report`` is the last run's report.
    """
    from ..pipeline import compile_model

    check_options(preset, precision)
    return compile_model(import_torch(module, example_inputs), preset, precision)


def check_options(preset, precision):
    """Fail before exporting when the preset or precision is invalid."""
    from ..precision import Precision
    from ..machine.config import load_config

    Precision.parse(precision)
    load_config(preset)


@quiet_tvm()  # its notes on each 2-D index_put (a decoder's cache updates), among others
def exported_to_relax(exported, name: str):
    """An ``ExportedProgram`` to a Relax module whose weights are constants, its calls
    named by the torch module they came from (see :func:`layer_name`)."""
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    from ..layer_names import attach

    try:
        # tvm.relax.frontend.torch.from_exported_program, keeping the importer: its table
        # of fx nodes gives each node's result, so the report can name layers by module.
        exported = exported.run_decompositions()
        importer = ExportedProgramImporter()
        mod = importer.from_exported_program(exported, False, True, False, CONVERT_MAP)
    except ModelError as e:  # a converter of ours refusing an op
        raise ModelError(f"{name}: {e}") from None
    except AssertionError as e:
        text = first_line(e)
        if text.startswith("Unsupported function types"):
            ops = text.split("types", 1)[1].strip(" []").replace("'", "")
            raise ModelError(f"{name}: PyTorch op(s) not supported by TVM's PyTorch importer: {ops}") from None
        raise ModelError(f"{name}: TVM's PyTorch importer failed: AssertionError: {text}") from None
    except Exception as e:  # the converters raise many unrelated types
        raise ModelError(
            f"{name}: TVM's PyTorch importer failed: {type(e).__name__}: {first_line(e)}"
        ) from None
    results = [(layer_name(node), importer.env[node]) for node in exported.graph.nodes
               if node.op == "call_function" and node in importer.env]
    return attach(mod, results)


# Module classes whose path alone names a layer (every op they run is the layer's):
# torch's own, and the parts of a decoder step (``layers.3.mlp.down_proj``).
LAYER_MODULES = ("torch.nn.", "lpx_tvm.frontends.decoder_modules.Scope")


def layer_name(node) -> str:
    """The name a torch fx node's layer takes in reports: the path of the module that ran
    it (``layer1.0.conv1``); for an op a module of the user's own calls in ``forward``,
    that path and the op (``layer1.0:add``); for one at the top level, the op."""
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    if not stack:
        return node.name
    path, kind = stack[-1]
    kind = kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
    return path if kind.startswith(LAYER_MODULES) else f"{path}:{node.name}"


def _cumsum(node, importer):
    """``aten.cumsum`` with torch's result dtype.

    torch sums a bool or narrow int tensor into int64; TVM's converter keeps the input
    dtype when no dtype is given, and a bool cumsum does not compile on the CPU.
    (transformers' causal masks take a cumsum of a bool tensor.)
    """
    from tvm import relax

    x = importer.env[node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    val = node.meta.get("val")
    dtype = node.kwargs.get("dtype") or (val.dtype if val is not None else None)
    dtype = importer._convert_data_type(str(dtype)) if dtype is not None else None
    return importer.block_builder.emit(relax.op.cumsum(x, dim, dtype))


def _cat(node, importer):
    """``aten.cat`` with torch's rule for legacy empty tensors: a 1-D tensor of size 0
    is skipped whatever the other tensors' rank (a key/value cache starts as one)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    axis = args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    tensors = list(args[0])
    kept = [t for t in tensors if _static_shape(t) != (0,)]
    if kept and len(kept) < len(tensors):
        if len(kept) == 1:
            return kept[0]
        tensors = kept
    return importer.block_builder.emit(relax.op.concat(tensors, axis=axis))


def _upsample_nearest2d(node, importer):
    """``aten.upsample_nearest2d`` as torch samples: source pixel ``floor(dst * in / out)``.

    TVM's converter writes it with ``half_pixel`` coordinates and rounding, which picks
    other pixels for every downsampling and for ratios that are not whole (7 -> 10).
    With a ``scale_factor`` torch samples by ``1 / scale_factor``, the same as in / out
    only when the output size is the input size times it: otherwise refused."""
    from tvm import relax

    x = importer.env[node.args[0]]
    shape_in = _static_shape(x)
    shape_out = tuple(int(d) for d in node.meta["val"].shape)
    scales = node.args[2] if len(node.args) > 2 else node.kwargs.get("scale_factors")
    if scales and shape_in is not None:
        for n_in, n_out, scale in zip(shape_in[2:], shape_out[2:], scales):
            if n_in * scale != n_out:
                raise ModelError(
                    f"nearest upsampling by scale_factor {tuple(scales)} of {shape_in}: torch samples by the scale "
                    f"given, which does not make {n_in} pixels {n_out}; give the size instead")
    return importer.block_builder.emit(relax.op.image.resize2d(
        x, shape_out[2:], layout="NCHW", method="nearest_neighbor", coordinate_transformation_mode="asymmetric",
        rounding_method="floor"))


def _select(node, importer):
    """``aten.select.int`` (``x[:, -1]``) with a negative index counted from the end.

    TVM's converter passes the index to ``take`` as it is, and ``take`` reads out of
    bounds at -1 on the CPU (a silent wrong answer), so the index is made positive here."""
    from tvm import relax

    x = importer.env[node.args[0]]
    dim, index = node.args[1], node.args[2]
    shape = _static_shape(x)
    if shape is not None:
        dim = dim % len(shape)
        if not -shape[dim] <= index < shape[dim]:
            raise ModelError(f"select of index {index} along dim {dim} of a tensor of shape {shape}: out of range")
        index %= shape[dim]
    elif index < 0:
        raise ModelError(f"select of index {index} along dim {dim} of a tensor of unknown shape")
    return importer.block_builder.emit(relax.op.take(x, relax.const(index, "int64"), dim))


def _static_shape(expr):
    from tvm import relax

    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    try:
        return tuple(int(v) for v in ty.shape.values)
    except TypeError:
        return None


def _to_copy(node, importer):
    """``aten._to_copy`` to a dtype, ``float8_e4m3fn`` included (TVM's converter has no
    fp8; Relax has: the W8A8 fp8 decoders quantize their activations with it)."""
    import torch
    from tvm import relax

    dtype = node.kwargs.get("dtype")
    if dtype is None and len(node.args) == 2 and isinstance(node.args[1], torch.dtype):
        dtype = node.args[1]
    if dtype is not torch.float8_e4m3fn:
        return importer._to_copy(node)
    return importer.block_builder.emit(relax.op.astype(importer.env[node.args[0]], "float8_e4m3fn"))


def _all_reduce(node, importer):
    """``lpx::all_reduce`` (:func:`lpx_tvm.frontends.torch_collectives.all_reduce`): Relax's
    ``ccl.allreduce`` by sum, which LPX runs over the chips of a system."""
    from tvm import relax

    return importer.block_builder.emit(relax.op.ccl.allreduce(importer.env[node.args[0]], "sum"))


# Converters for aten ops whose TVM conversion differs from torch's semantics (or is missing).
CONVERT_MAP = {"cumsum.default": _cumsum, "cat.default": _cat, "concat.default": _cat,
               "upsample_nearest2d.vec": _upsample_nearest2d, "select.int": _select, "_to_copy.default": _to_copy,
               "all_reduce.default": _all_reduce}


def _example_tuple(torch, example_inputs, name):
    if isinstance(example_inputs, (torch.Tensor, np.ndarray)):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise ModelError(
            f"{name}: example_inputs must be a tensor or a tuple of tensors, "
            f"got {type(example_inputs).__name__}"
        )
    args = []
    for i, a in enumerate(example_inputs):
        if isinstance(a, np.ndarray):
            a = torch.from_numpy(np.ascontiguousarray(a))
        if not isinstance(a, torch.Tensor):
            raise ModelError(
                f"{name}: example input {i} is a {type(a).__name__}; LPX models take tensors "
                "(bind other arguments in a wrapper module)"
            )
        args.append(a)
    return tuple(args)


def _user_inputs(exported, args, name):
    import torch

    names = []
    for spec in exported.graph_signature.input_specs:
        if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT:
            names.append(spec.arg.name)
    if len(names) != len(args):
        raise ModelError(f"{name}: the exported program takes {len(names)} inputs, {len(args)} were given")
    return [(n, tuple(int(d) for d in a.shape), numpy_dtype(a.dtype)) for n, a in zip(names, args)]


def _user_output_specs(exported):
    import torch

    kinds = (torch.export.graph_signature.OutputKind.USER_OUTPUT,
             torch.export.graph_signature.OutputKind.LOSS_OUTPUT)
    return [spec for spec in exported.graph_signature.output_specs if spec.kind in kinds]


def numpy_dtype(torch_dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (numpy's name; bfloat16 through ml_dtypes)."""
    return str(torch_dtype).rsplit(".", 1)[-1]


def first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
