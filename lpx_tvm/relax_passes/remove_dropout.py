"""lpx.RemoveDropout: dropout is the identity at inference.

The ONNX importer keeps ``nn.dropout`` (a tuple of output and mask) and reads its
output with ``[0]``. Left in place it is a CPU op that cuts an LPX region in two.
"""

from __future__ import annotations

from collections import Counter

from tvm import relax

from ._binding_rewrite import bindings, block_index, op_is, rewrite_bindings, use_counts, visible_at

__all__ = ["RemoveDropout"]


def _plan(func):
    value_of = dict(bindings(func))
    uses, blocks = use_counts(func), block_index(func)
    drop, rebuild, read = set(), {}, Counter()
    for var, value in value_of.items():
        if not isinstance(value, relax.TupleGetItem) or value.index != 0:
            continue
        tup = value.tuple_value
        if isinstance(tup, relax.Var) and op_is(value_of.get(tup), "relax.nn.dropout"):
            source = value_of[tup].args[0]
            if not visible_at(blocks, source, var):
                continue
            rebuild[var] = lambda visit, builder, source=source: visit(source)
            read[tup] += 1
    # Keep a dropout whose mask is read: only its output reads were rewritten.
    drop.update(tup for tup, n in read.items() if uses[tup] == n)
    return drop, rebuild


@relax.transform.function_pass(opt_level=0, name="lpx.RemoveDropout")
class RemoveDropout:
    """Replace ``nn.dropout(x)[0]`` with ``x``."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        drop, rebuild = _plan(func)
        return rewrite_bindings(func, mod, drop, rebuild)
