"""The lowering of each op family, one module each; importing this package registers
every lowering in :mod:`..registry`. A new op family is one module here, listed in
``FAMILIES``, and its pattern in :mod:`lpx_tvm.relax_passes.patterns`."""

from . import conv2d, data_movement, depthwise, elementwise, int8, matmul, norm, pool, softmax
from . import argmax, collectives, index_put, pad, pixel_rows, qlinear, resize, take

FAMILIES = (conv2d, depthwise, matmul, elementwise, pool, norm, softmax, data_movement, int8)
FAMILIES += (pixel_rows, resize, pad, argmax, take, index_put, qlinear, collectives)
