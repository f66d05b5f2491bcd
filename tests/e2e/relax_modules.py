"""Relax modules written in TVMScript, shared by the e2e tests."""

from __future__ import annotations

import tvm
from tvm.script import relax as R


@tvm.script.ir_module
class Attention:
    """softmax(Q K^T) V over a batch of 2, sequence 40, head size 24."""

    @R.function
    def main(q: R.Tensor((2, 40, 24), "float32"), k: R.Tensor((2, 40, 24), "float32"),
             v: R.Tensor((2, 40, 24), "float32")):
        with R.dataflow():
            scores = R.matmul(q, R.permute_dims(k, [0, 2, 1]))
            o = R.matmul(R.nn.softmax(scores, axis=-1), v)
            R.output(o)
        return o
