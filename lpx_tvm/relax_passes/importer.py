"""Import an ONNX model into a Relax IRModule with static input shapes.

LPX schedules are static, so every input dimension must be known at compile time:
a symbolic dimension has to be pinned with ``input_shapes``. Each failure ends in a
one-line :class:`ModelError` that names the file, the input or the ONNX op at fault.

A graph that reads its inputs' shapes (exporters' shape subgraphs for dynamic
dimensions) is first frozen to the static input shapes and its shape arithmetic folded
to constants (:mod:`.freeze_shapes`); other graphs go to TVM's importer as they are.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx

from .errors import ModelError

__all__ = ["ImportedModel", "import_onnx"]


@dataclass
class ImportedModel:
    """A Relax module and the model's interface.

    Attributes
    ----------
    mod : tvm.IRModule
        The Relax module; ``main`` takes the inputs in ``inputs`` order and its
        weights are embedded as constants.
    inputs : list of (str, tuple of int, str)
        ONNX input name, static shape and numpy dtype name, in the model's order
        (initializers excluded).
    outputs : list of str
        ONNX output names, in order.
    opset : int
        The default-domain opset the model was written for.
    """

    mod: object
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    opset: int = 0


def import_onnx(model, input_shapes=None) -> ImportedModel:
    """Load an ONNX model and import it into Relax.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        A path to an ``.onnx`` file or an in-memory model.
    input_shapes : dict of str to tuple of int, optional
        Static shapes for inputs, by ONNX input name. Needed for every input with a
        symbolic or unknown dimension; may also override declared shapes of the
        same rank (for example a different batch size).

    Returns
    -------
    ImportedModel
        The Relax module and the model's inputs and outputs.

    Raises
    ------
    ModelError
        The file is missing or is not a valid ONNX model, an input has dynamic
        dimensions and no entry in ``input_shapes``, or TVM cannot import an op.
    """
    where, proto = _load(model)
    _refuse_training_nodes(proto, where)
    inputs = _static_inputs(proto, input_shapes or {}, where)
    proto, fold_failure = _fold_shape_subgraphs(proto, inputs)
    proto = _drop_empty_resize_scales(proto)
    mod = _from_onnx(proto, inputs, where, fold_failure)
    outputs = [out.name for out in proto.graph.output]
    return ImportedModel(mod=mod, inputs=inputs, outputs=outputs, opset=_opset(proto))


def _fold_shape_subgraphs(proto, inputs):
    """(the graph to import, why folding failed or None). Only a graph with shape
    subgraphs is folded: the others import as they are, unchanged."""
    from .freeze_shapes import fold_shapes, has_shape_subgraph

    if not has_shape_subgraph(proto):
        return proto, None
    try:
        return fold_shapes(proto, {name: shape for name, shape, _ in inputs}), None
    except Exception as e:  # onnxruntime's errors have no common type; TVM may still import it
        return proto, re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", _first_line(e))


def _drop_empty_resize_scales(proto):
    """Resize before opset 13 takes ``scales`` even when it gives ``sizes``, as an empty
    tensor (torch's F.interpolate(size=...)); TVM's importer refuses both inputs. The
    empty input becomes an omitted one, which means the same (on a copy)."""
    empty = {init.name for init in proto.graph.initializer if list(init.dims) == [0]}
    nodes = [i for i, node in enumerate(proto.graph.node) if node.op_type == "Resize" and len(node.input) > 3
             and node.input[3] and node.input[2] in empty]
    if not nodes:
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for i in nodes:
        copy.graph.node[i].input[2] = ""
    return copy


def _refuse_training_nodes(proto, where):
    """A node in training mode computes something else than inference (BatchNormalization
    with ``training_mode=1`` normalizes by the batch's own statistics and returns updated
    running ones); TVM's importer would run it as inference, a silent wrong answer."""
    for node in proto.graph.node:
        if node.op_type == "BatchNormalization":
            mode = _attr(node, "training_mode", 0)
            if mode:
                name = node.name or node.output[0]
                raise ModelError(f"{where}: BatchNormalization {name!r} is in training mode (training_mode=1); "
                                 "lpx_tvm compiles inference: export the model in eval mode")


def _load(model):
    """Return (a name for messages, a checked ModelProto)."""
    if isinstance(model, onnx.ModelProto):
        where, proto, check_arg = "ONNX model", model, model
    elif isinstance(model, (str, os.PathLike)):
        where = os.fspath(model)
        if not os.path.exists(where):
            raise ModelError(f"{where}: no such file")
        if not os.path.isfile(where):
            raise ModelError(f"{where}: not a file")
        try:
            proto = onnx.load(where)
        except Exception as e:  # protobuf raises several unrelated types on garbage
            raise ModelError(f"{where}: not a valid ONNX model ({_first_line(e)})") from None
        # The checker reads the file itself, which also works past protobuf's 2 GiB limit.
        check_arg = where
    else:
        raise ModelError(
            f"expected a path or an onnx.ModelProto, got {type(model).__name__}"
        )
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{where}: not a valid ONNX model (it has no graph)")
    try:
        onnx.checker.check_model(check_arg)
    except Exception as e:
        raise ModelError(f"{where}: not a valid ONNX model ({_first_line(e)})") from None
    return where, proto


def _static_inputs(proto, input_shapes, where):
    """The graph inputs that are not initializers, with static shapes and dtypes."""
    initializers = {init.name for init in proto.graph.initializer}
    graph_inputs = [vi for vi in proto.graph.input if vi.name not in initializers]
    names = {vi.name for vi in graph_inputs}
    unknown = sorted(set(input_shapes) - names)
    if unknown:
        raise ModelError(
            f"{where}: input_shapes names {unknown}, which are not model inputs "
            f"(inputs: {sorted(names)})"
        )

    inputs = []
    for vi in graph_inputs:
        if not vi.type.HasField("tensor_type"):
            raise ModelError(f"{where}: input {vi.name!r} is not a tensor")
        ttype = vi.type.tensor_type
        declared = _declared_dims(ttype)
        if vi.name in input_shapes:
            shape = _given_shape(vi.name, input_shapes[vi.name], declared, where)
        elif declared is None or any(not isinstance(d, int) for d in declared):
            dims = "unknown rank" if declared is None else list(declared)
            raise ModelError(
                f"{where}: input {vi.name!r} has dynamic dimensions ({dims}); "
                f"give its shape, e.g. input_shapes={{{vi.name!r}: (1, ...)}}"
            )
        else:
            shape = tuple(declared)
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type)).name
        except Exception:
            raise ModelError(
                f"{where}: input {vi.name!r} has an unsupported element type "
                f"{onnx.TensorProto.DataType.Name(ttype.elem_type)}"
            ) from None
        inputs.append((vi.name, shape, dtype))
    return inputs


def _declared_dims(ttype):
    """Declared dims: ints where static, the symbol (or '?') where not; None if no rank."""
    if not ttype.HasField("shape"):
        return None
    dims = []
    for dim in ttype.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or "?")
    return dims


def _given_shape(name, shape, declared, where):
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise ModelError(
            f"{where}: input_shapes[{name!r}] must be a tuple of ints, got {shape!r}"
        ) from None
    if any(d <= 0 for d in shape):
        raise ModelError(f"{where}: input_shapes[{name!r}] = {shape} has a non-positive dimension")
    if declared is not None:
        if len(declared) != len(shape):
            raise ModelError(
                f"{where}: input_shapes[{name!r}] = {shape} has rank {len(shape)}, "
                f"the model declares rank {len(declared)} ({list(declared)})"
            )
    return shape


def _from_onnx(proto, inputs, where, fold_failure=None):
    import tvm
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    from ..layer_names import attach
    from .cpu_only import name_ifs

    from .tvm_output import captured_fd2

    shape_dict = {name: list(shape) for name, shape, _ in inputs}
    dtype_dict = {name: dtype for name, _, dtype in inputs}
    importer, failure = None, None
    try:
        # TVM's importer prints the inputs of the node it fails on to stdout (our error
        # names the node), and warns about what it does not use.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            # tvm.relax.frontend.onnx.from_onnx, keeping the importer: its table of ONNX
            # values gives each node's result, so the report can name layers by node.
            importer = ONNXGraphImporter(shape_dict, dtype_dict, keep_params_in_input=False, sanitize=True)
            mod = importer.from_onnx(proto.graph, _opset(proto) or 1)
    except tvm.error.OpNotImplemented as e:
        ops = str(e).split(":", 1)[-1].splitlines()[0].strip()
        ops = ", ".join(sorted(op.strip() for op in ops.split(",") if op.strip()))
        failure = f"ONNX op(s) not supported by TVM's ONNX importer: {ops}"
    except Exception as e:
        failure = _import_failure(proto, importer, e)
    if failure is not None and fold_failure is not None:
        failure += f" (folding its shape computations with onnxruntime failed: {fold_failure})"
    if failure is not None:
        with captured_fd2():
            # Its block builder, left inside the function it was building, warns on fd 2
            # as it is freed ("destroyed with remaining blocks"): after the error, noise.
            importer = None
        raise ModelError(f"{where}: {failure}")
    values = importer._nodes  # ONNX value name -> Relax expression
    _refuse_mistranslated(proto, values, where)
    results = [(node.name or node.output[0], values[out]) for node in proto.graph.node
               for out in node.output if out in values]
    ifs = {values[node.output[0]]: node.name or node.output[0] for node in proto.graph.node
           if node.op_type == "If" and node.output and node.output[0] in values}
    return name_ifs(attach(mod, results), ifs)


def _import_failure(proto, importer, exc) -> str:
    """The error of a failed import, naming the node it failed on (the first whose
    result the importer has not made)."""
    import tvm

    cause = f"{type(exc).__name__}: {_first_line(exc)}"
    made = importer._nodes if importer is not None else {}
    node = next((n for n in proto.graph.node if any(out and out not in made for out in n.output)), None)
    if node is None:
        return f"TVM's ONNX importer failed: {cause}"
    name = f"{node.op_type} {node.name or node.output[0]!r}"
    shape = made.get(node.input[1]) if node.op_type == "Reshape" and len(node.input) > 1 else None
    if shape is not None and not isinstance(shape, (tvm.ir.GenericConst, tvm.relax.ShapeExpr)):
        return (f"{name} takes its shape {node.input[1]!r} at run time: LPX compiles static shapes; give the "
                f"shape as a constant (TVM's ONNX importer: {cause})")
    return f"TVM's ONNX importer failed on {name}: {cause}"


def _refuse_mistranslated(proto, values, where):
    """Nodes TVM's importer accepts and translates into something else, a silent wrong
    answer or a failure at run time for a valid model:

    - an Expand whose target shape is known only at run time: it broadcasts to that
      shape as given, where ONNX keeps the input's dimension wherever the target's is 1
      (a (1, 16) input expanded to (5, 1) is (5, 16)), and checks nothing;
    - a Unique without ``axis`` of an input of rank 2 or more whose inverse_indices are
      read: they come out in the input's shape, not flattened, and the run fails;
    - a ConvTranspose whose ``output_shape`` differs from what its pads give: the
      importer ignores the attribute;
    - a Resize that downsamples with ``antialias=1`` (ignored), that has ``scales``
      whose product with the input size is not whole (the importer samples by output /
      input size, ONNX by the given scale), or the ``half_pixel_symmetric`` mode (TVM's
      resize has none, and the build fails).
    """
    from ._binding_rewrite import static_shape

    constants = {t.name: t for t in proto.graph.initializer}
    for node in proto.graph.node:
        name = node.name or node.output[0]
        if node.op_type == "ConvTranspose":
            _refuse_conv_transpose_output_shape(node, name, values, where)
        if node.op_type == "Resize":
            _refuse_mistranslated_resize(node, name, values, constants, where)
        if node.op_type == "Expand" and node.output[0] in values and static_shape(values[node.output[0]]) is None:
            raise ModelError(
                f"{where}: Expand {name!r} takes its shape {node.input[1]!r} at run time, which TVM's ONNX "
                "importer does not broadcast as ONNX does (a target dimension of 1 keeps the input's): give the "
                "shape as a constant, or compute it from static shapes")
        if node.op_type == "Unique" and len(node.output) > 2 and node.output[2] and node.input[0] in values:
            rank = getattr(values[node.input[0]].ty, "ndim", -1)
            if rank != 1 and not any(a.name == "axis" for a in node.attribute):
                raise ModelError(
                    f"{where}: Unique {name!r} without axis of a {rank}-D input: TVM's ONNX importer does not "
                    "flatten its inverse_indices as ONNX does; flatten the input first (Reshape to 1-D)")


def _attr(node, name, default=None):
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else onnx.helper.get_attribute_value(found)


def _refuse_conv_transpose_output_shape(node, name, values, where):
    from ._binding_rewrite import static_shape

    wanted = _attr(node, "output_shape")
    out = static_shape(values[node.output[0]]) if node.output[0] in values else None
    if wanted and out is not None and tuple(out[-len(wanted):]) != tuple(wanted):
        raise ModelError(
            f"{where}: ConvTranspose {name!r} asks for output_shape {tuple(wanted)}, which TVM's ONNX importer "
            f"ignores (it would give {tuple(out[-len(wanted):])}): give the pads (and output_padding) instead")


def _refuse_mistranslated_resize(node, name, values, constants, where):
    from ._binding_rewrite import static_shape

    mode = _attr(node, "coordinate_transformation_mode", b"half_pixel")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode == "half_pixel_symmetric":
        raise ModelError(f"{where}: Resize {name!r} uses coordinate_transformation_mode half_pixel_symmetric, "
                         "which TVM's resize does not have")
    shape_in = static_shape(values[node.input[0]]) if node.input[0] in values else None
    shape_out = static_shape(values[node.output[0]]) if node.output[0] in values else None
    if shape_in is None or shape_out is None:
        return
    if _attr(node, "antialias", 0) and any(o < i for i, o in zip(shape_in, shape_out)):
        raise ModelError(f"{where}: Resize {name!r} downsamples with antialias=1, which TVM's ONNX importer "
                         "ignores (it would sample without the antialiasing filter)")
    scales = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if scales in constants and (len(node.input) < 4 or not node.input[3]):
        scale = onnx.numpy_helper.to_array(constants[scales]).astype(np.float64)
        if scale.size == len(shape_in):
            product = np.asarray(shape_in, np.float64) * scale
            if not np.allclose(product, np.round(product), rtol=0, atol=1e-6):
                raise ModelError(
                    f"{where}: Resize {name!r} scales {tuple(float(x) for x in scale)} of {tuple(shape_in)} give "
                    "sizes that are not whole: ONNX samples by the scale given, TVM's ONNX importer by output / "
                    "input size, a different answer; give the sizes instead of the scales")


def _opset(proto):
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return int(opset.version)
    return 0


def _first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
