"""Lanes of a value picked by two slices of its last axis and concatenated (RoPE's halves
of a head swapped, ``lpx.permute_lanes``): one SXM permute per pair of column tiles,
against torch, within one tile and across tiles, on chip and by bands off chip."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lpx_tvm  # noqa: E402
from lpx_tvm import pipeline  # noqa: E402
from lpx_tvm.frontends.torch import import_torch  # noqa: E402
from lpx_tvm.machine.config import load_config  # noqa: E402
from lpx_tvm.target.codegen import codegen_options  # noqa: E402


class Swap(torch.nn.Module):
    """``cat([x[..., cut:], x[..., :cut]], -1)``, used by arithmetic so it is not the output alone."""

    def __init__(self, cut):
        super().__init__()
        self.cut = cut

    def forward(self, x):
        return torch.cat([x[..., self.cut:], x[..., :self.cut]], dim=-1) * 2.0 + x


class Pick(torch.nn.Module):
    """Two overlapping pieces in the other order, narrower than the input."""

    def forward(self, x):
        return torch.cat([x[:, 300:390], x[:, 10:340]], dim=-1) * 0.5


def _run(model, x, preset, offchip=False):
    mod = pipeline.canonicalize_model(import_torch(model, (x,)).mod, "fp32")
    partitioned, report = pipeline.partition(mod, load_config(preset), "fp32")
    assert (report.regions, [op.op for op in report.cpu_ops]) == (1, [])
    assert "lpx.permute_lanes" in partitioned.script()
    with codegen_options(force_offchip=offchip):
        got = lpx_tvm.from_torch(model, (x,), preset=preset, precision="fp32").run([x.numpy()])
    with torch.no_grad():
        np.testing.assert_array_equal(got["output_0"], model(x).numpy())


@pytest.mark.parametrize("shape,cut", [((3, 64), 32), ((2, 5, 128), 64), ((4, 40), 7), ((3, 700), 350)],
                         ids=["head_64", "rows_3d", "uneven", "across_tiles"])
def test_swapped_halves(shape, cut):
    torch.manual_seed(0)
    _run(Swap(cut), torch.randn(*shape), "tsp")


def test_pieces_from_two_tiles_in_either_order():
    torch.manual_seed(1)
    _run(Pick(), torch.randn(5, 400), "tsp")


def test_off_chip_by_bands():
    torch.manual_seed(2)
    _run(Swap(32), torch.randn(6, 64), "mini", offchip=True)
