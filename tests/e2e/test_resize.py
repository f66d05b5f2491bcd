"""Resize (ONNX Resize, torch nn.Upsample) on LPX against onnxruntime and torch: nearest
and bilinear, the common coordinate modes, up and down, odd sizes, mini and tsp."""

import numpy as np
import onnxruntime as ort
import pytest
import tvm.testing
from onnx import TensorProto, helper

import lpx_tvm
from lpx_tvm.target.codegen.lowerings.resize import axis_runs, axis_taps


def _resize_model(shape, opset, mode, coord, nearest="round_prefer_floor", sizes=None, scales=None):
    """x -> Conv 1x1 (so the resize reads a value made on LPX) -> Resize -> y."""
    n, c, h, w = shape
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((c, c, 1, 1)).astype(np.float32)
    inits = [helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel()),
             helper.make_tensor("roi", TensorProto.FLOAT, [0], [])]
    if scales is not None:
        inits.append(helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, *scales]))
        ins, out_hw = ["t", "roi", "scales"], (int(h * scales[0]), int(w * scales[1]))
    else:
        # Opset 11 takes an empty scales tensor beside sizes; later opsets leave it out.
        inits += [helper.make_tensor("sizes", TensorProto.INT64, [4], [n, c, *sizes]),
                  helper.make_tensor("no_scales", TensorProto.FLOAT, [0], [])]
        ins, out_hw = ["t", "roi", "no_scales" if opset == 11 else "", "sizes"], tuple(sizes)
    nodes = [helper.make_node("Conv", ["x", "w"], ["t"]),
             helper.make_node("Resize", ins, ["y"], mode=mode, coordinate_transformation_mode=coord,
                              nearest_mode=nearest)]
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, c, *out_hw])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, shape, preset, precision, tol):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    compiled = lpx_tvm.compile_model(model, preset=preset, precision=precision)
    got = compiled.run({"x": x})["y"]
    assert got.shape == want.shape
    tvm.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    offload = compiled.report["offload"]
    assert offload["cpu"] == {} and offload["lpx"].get("image.resize2d") == 1, offload
    return compiled


CASES = [
    # (opset, mode, coordinate mode, nearest mode, sizes, scales) on a (2, 5, 7, 9) input
    (11, "nearest", "asymmetric", "floor", None, (2.0, 3.0)),
    (11, "linear", "align_corners", "round_prefer_floor", (13, 5), None),
    (13, "nearest", "half_pixel", "round_prefer_floor", (11, 4), None),
    (13, "nearest", "align_corners", "round_prefer_ceil", (3, 17), None),
    (13, "linear", "half_pixel", "round_prefer_floor", None, (2.0, 2.0)),
    (13, "linear", "asymmetric", "round_prefer_floor", (5, 12), None),
    (18, "linear", "pytorch_half_pixel", "round_prefer_floor", (1, 6), None),
    (18, "nearest", "half_pixel", "ceil", (14, 9), None),
    (19, "linear", "half_pixel", "round_prefer_floor", (4, 3), None),
    (19, "nearest", "half_pixel", "round_prefer_ceil", (7, 19), None),
]


@pytest.mark.parametrize("preset", ["mini", "tsp"])
@pytest.mark.parametrize("case", CASES, ids=[f"opset{c[0]}-{c[1]}-{c[2]}-{c[4] or c[5]}" for c in CASES])
def test_resize_matches_onnxruntime(case, preset):
    opset, mode, coord, nearest, sizes, scales = case
    shape = (2, 5, 7, 9)
    _check(_resize_model(shape, opset, mode, coord, nearest, sizes, scales), shape, preset, "fp32", 1e-5)


@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[7]], ids=["linear-align", "linear-x2", "nearest"])
def test_resize_fp16(case):
    opset, mode, coord, nearest, sizes, scales = case
    shape = (1, 40, 6, 10)  # 40 channels: several lane tiles
    _check(_resize_model(shape, opset, mode, coord, nearest, sizes, scales), shape, "mini", "fp16", 2e-2)


def test_upsample_runs_as_few_windows():
    """Nearest x2 is two runs per axis whatever the size; bilinear x2 with half_pixel
    needs one more per phase for the clamped edge. Instruction counts do not grow with
    the image."""
    for size in (8, 64):
        assert len(axis_runs(axis_taps(size, 2 * size, "nearest_neighbor", "asymmetric", "floor"))) == 2
        assert len(axis_runs(axis_taps(size, 2 * size, "linear", "half_pixel", ""))) <= 4
    taps = axis_taps(3, 6, "linear", "half_pixel", "")
    # out 0 -> in -0.25: 0.25 of pixel -1 (clamped to 0) and 0.75 of pixel 0; out 1 -> in 0.25
    assert taps[0] == ((0, 0.25), (0, 0.75)) and taps[1] == ((0, 0.75), (1, 0.25))


def test_fpn_upsample_matches_torch():
    """An FPN top-down path: lateral 1x1 convs, nn.Upsample (nearest x2, and bilinear
    without and with align_corners) of the coarser level, added to the finer one."""
    torch = pytest.importorskip("torch")

    class FPN(torch.nn.Module):
        def __init__(self, c=(8, 12, 16), out=8):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, c[0], 3, padding=1)
            self.down = torch.nn.ModuleList([torch.nn.Conv2d(c[i], c[i + 1], 3, stride=2, padding=1)
                                             for i in range(len(c) - 1)])
            self.lateral = torch.nn.ModuleList([torch.nn.Conv2d(ci, out, 1) for ci in c])
            self.ups = torch.nn.ModuleList([torch.nn.Upsample(scale_factor=2, mode="nearest"),
                                            torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)])
            self.last = torch.nn.Upsample(size=(20, 28), mode="bilinear", align_corners=True)

        def forward(self, x):
            feats = [torch.relu(self.stem(x))]
            for d in self.down:
                feats.append(torch.relu(d(feats[-1])))
            top = self.lateral[2](feats[2])
            mid = self.lateral[1](feats[1]) + self.ups[0](top)
            fine = self.lateral[0](feats[0]) + self.ups[1](mid)
            return self.last(fine)

    torch.manual_seed(0)
    model = FPN().eval()
    x = torch.randn(1, 3, 16, 24)
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    with torch.no_grad():
        want = model(x).numpy()
    got = compiled.run([x.numpy()])["output_0"]
    assert got.shape == want.shape == (1, 8, 20, 28)
    tvm.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    offload = compiled.report["offload"]
    assert offload["cpu"] == {} and offload["lpx"].get("image.resize2d") == 3, offload


@pytest.mark.parametrize("hw, size", [(8, (4, 4)), (7, (10, 10)), (9, (4, 6)), (6, (12, 18))])
def test_torch_nearest_samples_as_torch(hw, size):
    """torch's nearest takes source pixel floor(dst * in / out): downsampling and ratios
    that are not whole pick the same pixels as torch (TVM's own converter, with
    half_pixel coordinates and rounding, was off by whole pixels)."""
    torch = pytest.importorskip("torch")

    class Nearest(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.interpolate(x, size=size, mode="nearest")

    x = torch.randn(1, 3, hw, hw, generator=torch.Generator().manual_seed(0))
    compiled = lpx_tvm.from_torch(Nearest(), (x,), preset="mini", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    np.testing.assert_array_equal(got, Nearest()(x).numpy())
    assert compiled.report["offload"]["cpu"] == {}


def test_torch_nearest_scale_factor_that_is_not_the_size_ratio_is_refused():
    torch = pytest.importorskip("torch")

    class Nearest(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.interpolate(x, scale_factor=1.5, mode="nearest")

    with pytest.raises(lpx_tvm.errors.LPXError, match="give the size instead"):
        lpx_tvm.from_torch(Nearest(), (torch.randn(1, 3, 7, 7),), preset="mini", precision="fp32")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_off_chip_by_bands(mode):
    """A resize whose values do not fit the mini SRAM: it runs by bands of output rows,
    each reading the input rows its taps need (the band's offset in the whole resize
    sets the taps)."""
    shape = (1, 16, 45, 40)
    compiled = _check(_resize_model(shape, 13, mode, "half_pixel", sizes=(101, 67)), shape, "mini", "fp32", 1e-4)
    assert compiled.report["offload"]["regions"] == 1
