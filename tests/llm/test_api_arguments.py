"""The Python API's arguments: each wrong one is an lpx_tvm error naming it (never a
foreign exception, never a silent fallback), found before any compile; and a session
refusing a generation's arguments still generates what transformers does."""

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm.errors import LPXError  # noqa: E402
from lpx_tvm.llm import session as session_module  # noqa: E402
from lpx_tvm.llm.system_session import SystemLLMSession  # noqa: E402
from lpx_tvm.relax_passes.errors import ModelError  # noqa: E402

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=320, max_position_embeddings=64)

COMPILE_CASES = [
    (dict(max_context=2.5), "max_context=2.5"),
    (dict(max_context=1), "max_context=1"),
    (dict(max_context="32"), "max_context='32'"),
    (dict(batch=0), "batch=0"),
    (dict(batch=True), "batch=True"),
    (dict(seed=-1), "seed=-1"),
    (dict(prompt_len=0), "prompt_len=0"),
    (dict(prompt_len=32), "prompt_len=32"),
    (dict(precision="fp4"), "precision 'fp4'"),
    (dict(precision="fp8"), "precision fp8: the MXM of tsp"),
    (dict(embed_on_chip="yes"), "embed_on_chip='yes'"),
    (dict(chips=[0, 1]), "chips: map a decoder over chips of a system"),
    (dict(tensor_parallel=2, chips=[0, 1], pipeline_stages=3), "chips, tensor_parallel, pipeline_stages"),
    (dict(pipeline_stages=2), "pipeline_stages"),
    (dict(split_layers=True), "split_layers cuts pipeline stages"),
    (dict(system="groqnode", chips=["0", "1"]), "chips=['0', '1']: chip numbers are integers"),
    (dict(system="groqnode", chips="01"), "chips='01'"),
    (dict(system="groqnode", chips=[0, 1.0]), "got 1.0"),
    (dict(system="groqnode", tensor_parallel=0), "tensor_parallel=0"),
    (dict(system="groqnode", pipeline_stages=1.5), "pipeline_stages=1.5"),
    (dict(calibration_ids=[[1, 2]]), "calibration_ids: they set an 8-bit path's activation scales"),
    (dict(precision="int8", calibration_ids=[[1, 400]]), "calibration_ids: 400 is not a token id"),
    (dict(precision="int8", calibration_ids=[[1, 2], [3]]), "calibration_ids: rows of different lengths"),
    (dict(precision="int8", calibration_ids=[[0.5, 2.0]]), "calibration_ids of dtype float64"),
    (dict(precision="int8", calibration_ids=[list(range(32))]), "calibration_ids: a prompt of 32 tokens"),
    (dict(batch=4000, max_context=8), "KV cache as stored for batch 4000 x context 8"),
]


@pytest.mark.parametrize("kwargs, message", COMPILE_CASES, ids=[m[:40] for _, m in COMPILE_CASES])
def test_compile_llm_names_a_wrong_argument_before_compiling(kwargs, message, monkeypatch):
    def no_compile(*args, **kw):
        raise AssertionError("compiled before refusing")

    monkeypatch.setattr(session_module.LLMSession, "__init__", no_compile)
    monkeypatch.setattr(SystemLLMSession, "__init__", no_compile)
    monkeypatch.setattr(session_module.decoders, "calibrate", no_compile)
    kwargs = dict(dict(precision="fp32", max_context=32), **kwargs)
    with pytest.raises(LPXError) as e:
        lpx_tvm.compile_llm(TINY, **kwargs)
    assert message in str(e.value)
    assert len(str(e.value).splitlines()) == 1


@pytest.fixture(scope="module")
def tiny_session():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{k: v for k, v in TINY.items()
                                                                      if k != "model_type"})).eval()
    for p in model.parameters():  # larger than the initializer's: the greedy tokens vary
        p.data.mul_(4.0)
    return model, lpx_tvm.compile_llm(model, preset="tsp", precision="fp32", max_context=16)


GENERATE_CASES = [
    (([1, 2, 3], 2.5), "max_new_tokens=2.5"),
    (([1, 2, 3], 0), "max_new_tokens=0"),
    (([1, 2, 3], -1), "max_new_tokens=-1"),
    (([1, 2, 3], True), "max_new_tokens=True"),
    (([1, 2, 3], "4"), "max_new_tokens='4'"),
    (([[1, 2], [3]], 2), "input_ids: rows of different lengths"),
    (([1.0, 2.0], 2), "input_ids of dtype float64"),
    ((["a", "b"], 2), "input_ids of dtype <U1"),
    (([], 2), "input_ids: an empty prompt"),
    (([1, 320], 2), "input_ids: 320 is not a token id of this model (its vocabulary: 0..319)"),
    (([1, -1], 2), "input_ids: -1 is not a token id"),
    (([[1, 2], [3, 4]], 2), "input_ids of shape (2, 2): this session decodes a batch of 1"),
    ((list(range(16)), 1), "16 prompt tokens and 1 new ones do not fit the context of 16"),
    ((list(range(10)), 8), "10 prompt tokens and 8 new ones do not fit"),
]


def test_generate_names_a_wrong_argument_and_still_generates(tiny_session):
    model, session = tiny_session
    for args, message in GENERATE_CASES:
        with pytest.raises(ModelError) as e:
            session.generate(*args)
        assert message in str(e.value), (args, str(e.value))
    # The refusals left the session as it was: greedy tokens equal transformers'.
    ids = np.array([[5, 17, 200, 3]])
    got = session.generate(ids, 10)
    with torch.no_grad():
        want = model.generate(torch.as_tensor(ids), max_new_tokens=10, min_new_tokens=10, do_sample=False,
                              pad_token_id=0)[:, 4:].numpy()
    assert len(set(want.ravel().tolist())) > 2  # the tokens vary: the check can fail
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(session.generate(np.array([5, 17, 200, 3], np.uint16), 10), want)


def test_a_system_session_checks_the_same_arguments():
    """Its generate checks before it runs anything (a session without programs)."""
    spec = SimpleNamespace(batch=1, vocab=320, max_context=16)
    fake = SimpleNamespace(spec=spec)
    for args, message in GENERATE_CASES:
        with pytest.raises(ModelError) as e:
            SystemLLMSession.generate(fake, *args)
        assert message in str(e.value), (args, str(e.value))
