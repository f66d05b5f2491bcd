"""lpx.FlattenAsTranspose: ``reshape`` (n, c, h, w) -> (n, c, h*w) as a free pixel view
and a transpose.

A detection head flattens each feature map to (n, c, anchors) before concatenating the
scales along the anchors (YOLOv8's ``x.view(n, c, -1)``). LPX stores a 4-D value as
pixel rows with its channels in lanes; the (n, c, h*w) result keeps h*w in lanes, so the
reshape moves every element between lanes and, as a reshape, stays on the CPU. It is
the pixel flatten LPX runs for free (``lpx.flatten_pixels``: (n, c, h, w) -> (n, h*w, c),
a reshape then ``permute_dims [0, 2, 1]``), followed by a swap of the last two axes,
which the SXM transposes. This pass writes it so:

    permute_dims(permute_dims(reshape(x, (n, c, h*w)), [0, 2, 1]), [0, 2, 1])

It runs after ``lpx.Decompose``, which would compose the two permutes away again. A
reshape already followed by ``permute_dims [0, 2, 1]`` (a ViT's patch embedding), and
one of a value of one pixel per image (which keeps storage), are left as they are.
"""

from __future__ import annotations

from tvm import relax

from ._binding_rewrite import bindings, is_const, is_float, op_is, rewrite_bindings, static_shape

__all__ = ["FlattenAsTranspose"]


def _flattens(value) -> bool:
    if not op_is(value, "relax.reshape") or is_const(value.args[0]) or not is_float(value.ty.dtype):
        return False
    src, dst = static_shape(value.args[0]), static_shape(value)
    return (src is not None and dst is not None and len(src) == 4 and src[2] * src[3] > 1
            and dst == (src[0], src[1], src[2] * src[3]))


@relax.transform.function_pass(opt_level=0, name="lpx.FlattenAsTranspose")
class FlattenAsTranspose:
    """Rewrite ``reshape(x, (n, c, h*w))`` of a 4-D ``x`` into a pixel flatten and a transpose."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        pairs = bindings(func)
        # Reshapes a permute_dims [0, 2, 1] reads: already a pixel flatten.
        flattened = {value.args[0] for _, value in pairs if op_is(value, "relax.permute_dims")
                     and value.attrs.axes is not None and [int(a) for a in value.attrs.axes] == [0, 2, 1]}
        rebuild = {}
        for var, value in pairs:
            if var in flattened or not _flattens(value):
                continue

            def make(visit, builder, value=value):
                y = builder.emit(relax.op.reshape(visit(value.args[0]), static_shape(value)))
                rows = builder.emit(relax.op.permute_dims(y, [0, 2, 1]))
                return relax.op.permute_dims(rows, [0, 2, 1])
            rebuild[var] = make
        return rewrite_bindings(func, mod, set(), rebuild)
