"""Saving an artifact never deletes what the tool did not write: a non-empty folder that
is not an artifact, or a file, is refused and left untouched; an artifact is replaced;
the folder gets the user's umask. Machine files that are not UTF-8 text are refused by
name."""

import os
import pathlib
import stat
import sys

import numpy as np
import pytest

import lpx_tvm
from lpx_tvm.cli import main
from lpx_tvm.errors import ConfigError, LPXError

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "e2e"))


@pytest.fixture(scope="module")
def model():
    import test_build  # the small CNN

    return lpx_tvm.compile_model(test_build.small_cnn(), preset="mini", precision="fp32")


def test_a_folder_of_the_users_files_is_refused_and_kept(model, tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"the user's model")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "run.sh").write_text("echo hi\n")
    with pytest.raises(LPXError, match="not an LPX artifact and not empty"):
        model.save(tmp_path)
    assert (tmp_path / "model.onnx").read_bytes() == b"the user's model"
    assert (tmp_path / "scripts" / "run.sh").read_text() == "echo hi\n"
    assert sorted(os.listdir(tmp_path)) == ["model.onnx", "scripts"]  # no temporary left behind


def test_a_file_is_refused(model, tmp_path):
    target = tmp_path / "out.lpxa"
    target.write_text("keep me")
    with pytest.raises(LPXError, match="not a folder"):
        model.save(target)
    assert target.read_text() == "keep me"


def test_cli_compile_into_the_current_folder_is_refused(tmp_path, monkeypatch, capsys):
    import onnx
    import test_build

    path = tmp_path / "cnn.onnx"
    onnx.save(test_build.small_cnn(), str(path))
    monkeypatch.chdir(tmp_path)
    assert main(["compile", str(path), "-o", ".", "--preset", "mini", "--precision", "fp32"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lpx-tvm: error:") and "not an LPX artifact" in err
    assert os.listdir(tmp_path) == ["cnn.onnx"]


def test_an_artifact_is_replaced_and_an_empty_folder_used(model, tmp_path):
    x = np.random.default_rng(2).standard_normal((1, 3, 12, 12)).astype(np.float32)
    want = model.run({"x": x})["y"]
    (tmp_path / "empty").mkdir()
    model.save(tmp_path / "empty")
    model.save(tmp_path / "empty")  # now an artifact: replaced
    np.testing.assert_array_equal(lpx_tvm.load(tmp_path / "empty").run({"x": x})["y"], want)
    assert sorted(os.listdir(tmp_path)) == ["empty"]


def test_the_artifact_folder_follows_the_umask(model, tmp_path):
    old = os.umask(0o022)
    try:
        model.save(tmp_path / "art")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "art").st_mode) == 0o755


def test_a_machine_file_that_is_not_text(tmp_path):
    path = tmp_path / "machine.json"
    path.write_bytes(b"\xff\xfe{\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        lpx_tvm.load_config(str(path))


def test_a_trace_follows_the_umask(tmp_path):
    from lpx_tvm.kernels import transpose
    from lpx_tvm.sim import Simulator

    prog = transpose("mini", 16, 16, "fp16")
    x = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float16)
    result = Simulator("mini").run(prog, {prog.inputs[0].name: x}, trace=True)
    old = os.umask(0o022)
    try:
        result.trace.save(tmp_path / "trace.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "trace.json").st_mode) == 0o644


@pytest.mark.parametrize("damage", ["truncate", "garbage", "remove"])
def test_a_damaged_artifact_file_is_refused_before_loading(model, tmp_path, damage):
    """A truncated or replaced cpu.so (a bus error in the loader before) or a missing
    program is an error naming the file."""
    model.save(tmp_path / "art")
    so = tmp_path / "art" / "cpu.so"
    if damage == "truncate":
        so.write_bytes(so.read_bytes()[:4096])
    elif damage == "garbage":
        so.write_bytes(os.urandom(so.stat().st_size))
    else:
        next((tmp_path / "art" / "regions").iterdir()).unlink()
    with pytest.raises(LPXError, match="cpu.so|missing regions/"):
        lpx_tvm.load(tmp_path / "art")
