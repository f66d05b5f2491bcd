"""Inputs are never converted with a loss: 2.7 or NaN into an int64 input, strings, values
beyond the input dtype's range are refused with an error naming the input; exact
conversions still run (as onnxruntime would refuse the former)."""

import numpy as np
import pytest

from lpx_tvm.runtime.compiled_model import InputError, input_array


@pytest.mark.parametrize("given, dtype, message", [
    (np.array([2.7, 1.0]), "int64", "not whole numbers"),
    (np.array([np.nan]), "int64", "not whole numbers"),
    (np.array([np.inf]), "int32", "not whole numbers"),
    (np.array(["a", "b"]), "float32", "strings"),
    (np.array([300]), "int8", "do not fit int8"),
    (np.array([-1]), "uint8", "do not fit uint8"),
    (np.array([1e300]), "float32", "beyond float32's range"),
    (np.array([1.0]), "bool", "expected bool"),
])
def test_lossy_conversions_are_refused(given, dtype, message):
    with pytest.raises(InputError, match=message):
        input_array("x", given, dtype)


@pytest.mark.parametrize("given, dtype", [
    (np.array([2.0, -3.0]), "int64"), (np.array([7], np.int32), "int64"), (np.array([0.1]), "float32"),
    (np.array([np.nan], np.float64), "float32"),  # NaN stays NaN
])
def test_exact_or_float_rounding_conversions_run(given, dtype):
    got = input_array("x", given, dtype)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, given.astype(dtype))


def test_the_cli_refuses_a_float_for_an_int64_input(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    from lpx_tvm.cli import main

    nodes = [helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT), helper.make_node("Relu", ["f"], ["y"])]
    graph = helper.make_graph(nodes, "ids", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "in.npz", ids=np.array([[2.7, 1.0, np.nan, 3.0]]))
    rc = main(["run", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "in.npz"), "--outputs",
               str(tmp_path / "out.npz"), "--preset", "mini", "--precision", "fp32"])
    err = capsys.readouterr().err
    assert rc == 2 and "lpx-tvm: error:" in err and "'ids'" in err and "not whole numbers" in err
    assert not (tmp_path / "out.npz").exists()
