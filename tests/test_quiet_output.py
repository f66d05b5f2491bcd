"""The Python API keeps TVM's C++ log lines and transformers' notes on a scaled-down
config off the user's stderr (LPX_TVM_LOG=1 lets TVM's through); everything else
written to stderr meanwhile still reaches it."""

import os
import subprocess
import sys
import textwrap

import pytest

from lpx_tvm.relax_passes.tvm_output import LOG_ENV, quiet_tvm

TVM_LINE = "[12:14:37] /project/src/relax/op/tensor/manipulate.cc:2459: IndexPut: index tensor 0 has ndim=2\n"


def test_quiet_drops_tvm_lines_and_passes_the_rest(capfd, monkeypatch):
    monkeypatch.delenv(LOG_ENV, raising=False)
    with quiet_tvm():
        os.write(2, TVM_LINE.encode())
        with quiet_tvm():  # nested: one block
            os.write(2, b"a line of the user's\n")
    assert capfd.readouterr().err == "a line of the user's\n"
    monkeypatch.setenv(LOG_ENV, "1")
    with quiet_tvm():
        os.write(2, TVM_LINE.encode())
    assert capfd.readouterr().err == TVM_LINE


def test_quiet_passes_an_exception_and_what_was_written(capfd, monkeypatch):
    monkeypatch.delenv(LOG_ENV, raising=False)
    with pytest.raises(ValueError, match="boom"):
        with quiet_tvm():
            os.write(2, TVM_LINE.encode() + b"kept\n")
            raise ValueError("boom")
    assert capfd.readouterr().err == "kept\n"


_SCRIPT = textwrap.dedent("""
    import numpy as np
    import lpx_tvm
    cfg = dict(model_type="llama", vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               bos_token_id=128000, eos_token_id=128001)  # a published config's ids, its vocabulary scaled down
    session = lpx_tvm.compile_llm(cfg, preset="tsp", precision="fp32", max_context=32)
    print(session.generate(np.array([[1, 2, 3]]), 2).shape)
""")


@pytest.mark.parametrize("log", [False, True])
def test_compile_llm_writes_nothing_to_stderr(log):
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if k != LOG_ENV}
    if log:
        env[LOG_ENV] = "1"
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("(1, 2)")
    if log:  # the decoder's cache updates make TVM log: the quiet run did hide them
        assert "IndexPut" in done.stderr
    else:
        assert done.stderr == ""
