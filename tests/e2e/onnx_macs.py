"""MACs of the ONNX nodes the MXM runs (convolutions and matmuls), by shape inference:
the independent count a model test compares the offload report's figures with."""

import numpy as np
import onnx
from onnx import shape_inference


def mxm_macs(model: onnx.ModelProto) -> dict:
    """MACs of each Conv (as "nn.conv2d") and Gemm / MatMul (as "matmul") node, by shape
    inference: {relax op: [MACs per node]}."""
    inferred = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    shapes.update({i.name: list(i.dims) for i in model.graph.initializer})
    out = {"nn.conv2d": [], "matmul": []}
    for node in inferred.graph.node:
        if node.op_type == "Conv":  # output elements x (in channels per group x kh x kw)
            out["nn.conv2d"].append(int(np.prod(shapes[node.output[0]])) * int(np.prod(shapes[node.input[1]][1:])))
        elif node.op_type in ("Gemm", "MatMul"):  # output elements x reduction length
            a = shapes[node.input[0]]
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            k = a[0] if node.op_type == "Gemm" and trans_a else a[-1]
            out["matmul"].append(int(np.prod(shapes[node.output[0]])) * k)
    return out


def cpu_mxm_macs(per_op: dict, cpu_ops: dict) -> int:
    """MACs of the convolutions and matmuls the offload report leaves on the CPU. The
    report counts them per op kind; charge the largest ONNX nodes of that kind (an upper
    bound, exact when none or all of a kind stay on the CPU)."""
    return sum(sum(sorted(macs, reverse=True)[:cpu_ops.get(op, 0)]) for op, macs in per_op.items())
