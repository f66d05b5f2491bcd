"""The lowering of each op family, one module each; importing this package registers
every lowering in :mod:`..registry`. A new op family is one module here, imported below,
and its pattern in :mod:`lpx_tvm.relax_passes.patterns`."""

from . import conv2d, data_movement, depthwise, elementwise, int8, matmul, norm, pool, softmax  # noqa: F401
