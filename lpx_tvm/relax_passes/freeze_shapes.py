"""Freeze an ONNX graph's input shapes and fold its shape arithmetic to constants.

Exporters write dynamic dimensions as shape subgraphs (``Shape -> Gather -> Unsqueeze ->
Concat -> Reshape``, ``Expand`` or ``Range`` with computed shapes, ``Resize`` with
computed ``sizes``). TVM's ONNX importer follows some of them but not all: a shape that
passes through ``ReduceProd``, ``Cast`` or ``Tile`` reaches ``Reshape`` or ``Resize`` as a
run-time tensor, and the import fails even when every input dimension is pinned.

Once the input shapes are written into the graph, every such subgraph is a constant
expression. onnxruntime's constant folding (its basic graph optimization level) evaluates
them; every other basic-level rewrite is disabled, so the graph keeps its nodes, their
names (the report's layer names) and standard ONNX ops. docs/import.md has the
measurements behind this choice.
"""

from __future__ import annotations

import os
import tempfile

import onnx

__all__ = ["SHAPE_SOURCES", "fold_shapes", "has_shape_subgraph"]

# Ops whose result is an input's shape: every shape subgraph starts at one of them.
SHAPE_SOURCES = frozenset({"Shape", "Size"})

# onnxruntime's basic (level 1) graph transformers other than ConstantFolding: fusions
# (MatMul+Add into Gemm, Conv+BatchNormalization, ...), transpose rewrites and node
# eliminations would rename or merge nodes and change what lpx_tvm compiles.
_OTHER_BASIC_OPTIMIZERS = [
    "CommonSubexpressionElimination", "ConstantSharing", "MatMulAddFusion", "ReshapeFusion",
    "TransposeOptimizer", "Level1_RuleBasedTransformer", "GemmTransposeFusion", "ConvAddFusion",
    "ConvMulFusion", "ConvBNFusion", "FuseReluClip", "DivMulFusion", "NotWhereFusion",
    "EliminateIdentity", "EliminateSlice", "UnsqueezeElimination", "EliminateDropout",
    "ExpandElimination", "CastElimination", "NoopElimination", "DoubleQDQPairsRemover",
    "QDQPropagationTransformer", "EnsureUniqueDQForNodeUnit", "ShapeInputMerge",
]


def has_shape_subgraph(proto: onnx.ModelProto) -> bool:
    """Whether the main graph reads an input's shape (a ``Shape`` or ``Size`` node), or
    computes a Pad's widths (torch's exporter writes those of ``F.pad`` as a subgraph)."""
    computed = {out for node in proto.graph.node if node.op_type != "Constant" for out in node.output}
    return any(node.op_type in SHAPE_SOURCES and node.domain in ("", "ai.onnx") for node in proto.graph.node) or \
        any(node.op_type == "Pad" and len(node.input) > 1 and node.input[1] in computed for node in proto.graph.node)


def fold_shapes(proto: onnx.ModelProto, shapes: dict) -> onnx.ModelProto:
    """A copy of ``proto`` with the graph inputs' shapes set to ``shapes`` (name -> tuple
    of ints, every non-initializer input) and its constant subgraphs folded.

    Raises whatever onnxruntime raises when it cannot load the frozen graph (an op it
    does not know, or shapes that contradict the graph).
    """
    import onnxruntime as ort

    frozen = _with_input_shapes(proto, shapes)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3  # its notes on unused initializers
    with tempfile.TemporaryDirectory(prefix="lpx_fold_") as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "folded.onnx")
        ort.InferenceSession(frozen.SerializeToString(), options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=_OTHER_BASIC_OPTIMIZERS)
        return onnx.load(options.optimized_model_filepath)


def _with_input_shapes(proto, shapes):
    """A copy with static input dims and no stale intermediate shapes: the value_info an
    exporter wrote holds the symbolic dims, and output dims are inferred again."""
    frozen = onnx.ModelProto()
    frozen.CopyFrom(proto)
    for vi in frozen.graph.input:
        if vi.name in shapes:
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for size in shapes[vi.name]:
                shape.dim.add().dim_value = int(size)
    del frozen.graph.value_info[:]
    for vi in frozen.graph.output:
        for dim in vi.type.tensor_type.shape.dim:
            dim.Clear()
    return frozen
