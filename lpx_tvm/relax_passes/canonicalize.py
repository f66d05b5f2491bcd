"""Canonicalize an imported Relax module into the forms the LPX patterns expect.

The pass order, top to bottom:

1. ``DecomposeOpsForInference``: batch norm becomes subtract / divide / multiply / add.
2. ``lpx.EvalConstants`` (numpy), then ``FoldConstant`` for whatever it left (skipped
   when nothing is left), ``CanonicalizeBindings``, dead code elimination: constant
   subgraphs (ConstantOfShape weights, reshaped biases, transposed Gemm weights, BN
   statistics) become single constants, and the tuple plumbing the decomposition
   leaves goes away (an unused tuple would still count as a use and stop the folds
   below).
   ``lpx.TakeAsSlice``: a ``take`` of a runtime value at constant indices (a ViT's
   class token ``x[:, 0]``) becomes slices of runs of rows or lanes.
3. ``lpx.PadFromTIR``: the TIR pads the ONNX importer generates (``Pad``, ``auto_pad``)
   become ``nn.pad``, as the torch importer writes them, for the patterns and step 8.
   ``lpx.RemoveDropout``: dropout is the identity at inference.
4. ``lpx.UnstackReduce``: ONNX Sum / Max / Min (stack, then reduce) become pairwise
   add / maximum / minimum.
5. ``lpx.FoldScaleShift``: per-channel affine chains after a conv2d or a dense layer
   fold into its weights and one bias add: ``conv2d(x, W') + b'``.
6. ``lpx.CollapseAffine``: other affine chains with constants (a batch norm that
   follows no conv) become one multiply and one add.
7. ``lpx.NormalizeClip``: ReLU6 / Clip spelled as max and min become one ``relax.clip``
   (or ``relax.nn.relu``).
   ``lpx.ConvTransposeAsConv``: a transposed convolution becomes zero-stuffing, a pad
   and a stride-1 conv2d with the flipped kernel (LPX runs the stuffing as a pixel
   placement), before FoldPad folds that pad.
   ``lpx.FoldPad``: a zero (or, before a max pool, -inf) spatial pad that feeds a conv2d
   or a pooling becomes the consumer's own pads (TF-style "same" padding). It runs after
   NormalizeClip, which names the ReLUs that let a zero pad fold into a max pool.
8. ``lpx.MaskingAdd``: ``where(constant mask, x, -inf)`` (an attention mask) becomes
   ``x + constant``.
9. ``lpx.Decompose``: split becomes strided slices, ``power(x, 2 or 3)`` multiplies.
10. ``lpx.ChannelsLast``: the NHWC sections of CNN blocks (permute to NHWC, ops along
   C, permute back) run on the (N*H*W, C) pixel-rows view of their values.
11. ``lpx.HeadsTo3D``: unit-batch multi-head attention runs on (heads, seq, dim) 3-D
   values instead of 4-D ones (which LPX stores as images).
   ``lpx.ChannelSoftmaxConv``: a softmax over the channels of a reshaped value and a 1x1
   convolution (YOLOv8's box distribution, once HeadsTo3D made its source 3-D) become a
   softmax and a matmul on the 3-D value with the channels last.
   ``lpx.FlattenAsTranspose``: ``reshape`` (n, c, h, w) -> (n, c, h*w) becomes the free
   pixel flatten and a transpose (a detection head's flattened feature maps).
12. ``CanonicalizeBindings`` and dead code elimination: the aliases and the unused
   bindings and PrimFuncs the rewrites leave.

Everything else is left as it was.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .channel_softmax_conv import ChannelSoftmaxConv
from .channels_last import ChannelsLast
from .collapse_affine import CollapseAffine
from .conv_transpose import ConvTransposeAsConv
from .decompose import Decompose
from .eval_constants import EvalConstants, has_constant_calls
from .flatten_as_transpose import FlattenAsTranspose
from .fold_pad import FoldPad
from .fold_scale_shift import FoldScaleShift
from .heads_3d import HeadsTo3D
from .masking_add import MaskingAdd
from .normalize_clip import NormalizeClip
from .remove_dropout import RemoveDropout
from .take_as_slice import TakeAsSlice
from .tir_pad import PadFromTIR
from .unstack_reduce import UnstackReduce

__all__ = [
    "canonicalize",
    "ChannelSoftmaxConv",
    "ChannelsLast",
    "CollapseAffine",
    "ConvTransposeAsConv",
    "Decompose",
    "EvalConstants",
    "FlattenAsTranspose",
    "FoldPad",
    "FoldScaleShift",
    "HeadsTo3D",
    "MaskingAdd",
    "NormalizeClip",
    "PadFromTIR",
    "RemoveDropout",
    "TakeAsSlice",
    "UnstackReduce",
]


def canonicalize(mod: tvm.IRModule) -> tvm.IRModule:
    """Prepare an imported Relax module for LPX partitioning.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module as imported (not yet legalized).

    Returns
    -------
    tvm.IRModule
        The module with batch norm decomposed and folded into the preceding conv or
        dense weights where the math allows (else collapsed into one multiply and add),
        constants folded, dropout removed,
        variadic sums made pairwise and clamps normalized. Numerically equivalent to
        the input up to float rounding.
    """
    seq = tvm.ir.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            EvalConstants(),
            _fold_rest,
            relax.transform.CanonicalizeBindings(),
            _remove_unused,
            TakeAsSlice(),
            PadFromTIR(),
            RemoveDropout(),
            UnstackReduce(),
            FoldScaleShift(),
            CollapseAffine(),
            NormalizeClip(),
            ConvTransposeAsConv(),
            FoldPad(),
            MaskingAdd(),
            Decompose(),
            ChannelsLast(),
            relax.transform.CanonicalizeBindings(),  # HeadsTo3D follows values, not aliases
            HeadsTo3D(),
            ChannelSoftmaxConv(),
            FlattenAsTranspose(),
            relax.transform.CanonicalizeBindings(),
            _remove_unused,
        ],
        name="lpx.Canonicalize",
    )
    return seq(mod)


@tvm.ir.transform.module_pass(opt_level=0, name="lpx.RemoveUnused")
def _remove_unused(mod, ctx):
    """Dead code elimination that keeps every Relax function: only dead bindings and
    unused PrimFuncs go, even in modules whose functions are not public."""
    entries = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function)]
    return relax.transform.DeadCodeElimination(entries)(mod)


@tvm.ir.transform.module_pass(opt_level=0, name="lpx.FoldRest")
def _fold_rest(mod, ctx):
    """``FoldConstant`` for what ``EvalConstants`` left, run only when something is left:
    it legalizes every call it visits (each conv2d into a TOPI PrimFunc) to look for
    constant ones, which costs time even when there are none."""
    if not has_constant_calls(mod):
        return mod
    return relax.transform.FoldConstant()(mod)
