"""Decoders over chips of a system by pipeline parallelism, alone and with tensor
parallelism: each stage's chips hold contiguous layers, and a stage hands its hidden rows
to the next over a link inside the programs (docs/multichip.md). In fp32 the chips
generate transformers' greedy tokens, as one chip does; in fp16 and int8 the logits keep
one chip's tolerances."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm.errors import LPXError  # noqa: E402
from lpx_tvm.frontends import decoders  # noqa: E402
from lpx_tvm.relax_passes.errors import ModelError  # noqa: E402

from decoder_models import (check_8bit_session, check_half_logits, random_decoder as _model, rel_err,  # noqa: E402
                            torch_logits as _torch_logits)


SPLIT = [  # 2 layers over 3 stages cut at half layers: A0 | M0 A1 | M1
    decoders.PipelineStage(0, 1, 2, to_attention=True), decoders.PipelineStage(0, 2, 2, from_mlp=True, to_attention=True),
    decoders.PipelineStage(1, 2, 2, from_mlp=True)]


@pytest.mark.parametrize("kind, split", [("llama", False), ("gpt2", False), ("llama", True), ("gpt2", True)])
def test_stages_compose_to_the_whole_step(kind, split):
    """The stages' torch steps, run one after the other, are the whole step: same logits,
    same ids, same caches, bit for bit; also with stages cut between a layer's attention
    and its MLP (each layer's caches on the stage of its attention)."""
    model = _model(kind, 3, 2.0)
    spec = decoders.spec_of(model, 32)
    ids = torch.as_tensor(np.random.default_rng(0).integers(0, 320, 5), dtype=torch.int32)
    _, position, *caches = decoders.example_inputs(spec, 5)
    want = decoders.decoder_step(model, spec, 5)(ids, position, *caches)
    x, got_caches, layers_before = ids, {}, 0
    stages = SPLIT if split else decoders.stages_of(spec.layers, 2)
    if split:
        assert [decoders.stage_spec(spec, st).layers for st in stages] == [1, 1, 0]
        step = decoders.decoder_step(model, spec, 5, stage=stages[2])
        assert not any("layer0_q" in n or "cos" in n for n, _ in step.named_buffers())  # only what it runs
    for stage in stages:
        _, _, *mine = decoders.example_inputs(decoders.stage_spec(spec, stage), 5)
        x, *rest = decoders.decoder_step(model, spec, 5, stage=stage)(x, position, *mine)
        if stage.last:
            logits, *rest = rest
            torch.testing.assert_close(logits, want[1], rtol=0, atol=0)
        # The stage's caches by the whole step's names: its attending layers come after
        # the earlier stages'.
        mine_spec = decoders.stage_spec(spec, stage)
        for name, cache in zip(mine_spec.cache_names, rest, strict=True):
            kind_, layer, head = name.rsplit("_", 2)
            got_caches[f"{kind_}_{int(layer) + layers_before}_{head}"] = cache
        layers_before += mine_spec.layers
    assert torch.equal(x, want[0])
    assert sorted(got_caches) == sorted(spec.cache_names)
    assert all(torch.equal(got_caches[n], b) for n, b in zip(spec.cache_names, want[2:], strict=True))


def test_stages_of_split_layers_evenly():
    assert [(s.start, s.stop) for s in decoders.stages_of(7, 3)] == [(0, 3), (3, 5), (5, 7)]
    with pytest.raises(ModelError, match="a stage holds at least one layer"):
        decoders.stages_of(2, 3)


def test_split_stages_balance_the_halves():
    """Half layers of weight 1 (attention) and 4 (MLP): the heaviest stage as light as
    contiguous stages allow, by hand."""
    # 3 layers, 3 stages: A0 M0 | A1 M1 | A2 M2 (5 each); 4 stages: the heaviest (5) cannot
    # go lower, so one of them splits.
    cut = [(s.start, s.stop, s.from_mlp, s.to_attention) for s in decoders.split_stages_of(3, 3, 1, 4)]
    assert cut == [(0, 1, False, False), (1, 2, False, False), (2, 3, False, False)]
    four = decoders.split_stages_of(3, 4, 1, 4)
    assert len(four) == 4 and sum(s.attention_layers for s in four) == 3 and sum(s.mlp_layers for s in four) == 3
    # 80 layers of 19 + 88 (Llama-2-70B's int8 MB a chip at TP8) under 207: stages of at most
    # A M A (126) or M A M (195); 54 of them.
    stages = decoders.split_stages_of(80, 54, 19, 88)
    loads = [19 * s.attention_layers + 88 * s.mlp_layers for s in stages]
    assert max(loads) <= 195 and stages[0].first and stages[-1].last
    assert [(s.from_mlp, s.to_attention) for s in stages[:2]] == [(False, True), (True, False)]
    with pytest.raises(ModelError, match="at least an attention or an MLP"):
        decoders.split_stages_of(2, 5, 1, 4)
    with pytest.raises(ModelError, match="from the MLP to the attention"):
        decoders.PipelineStage(1, 2, 3, from_mlp=True, to_attention=True)


@pytest.mark.parametrize("kind, mapping, tensor_parallel", [
    ("llama", dict(pipeline_stages=2), 1),  # the chips stage_groups picks, one a stage
    ("gpt2", dict(chips=(4, 6, 1, 7), tensor_parallel=2), 2),
    ("llama", dict(pipeline_stages=3, split_layers=True), 1)])  # A0 | M0 | A1 M1
def test_pipeline_tokens_equal_transformers(kind, mapping, tensor_parallel):
    model = _model(kind, 3, 2.0 if kind == "llama" else 4.0)
    ids = np.random.default_rng(1).integers(0, 320, (1, 13))
    session = lpx_tvm.compile_llm(model, precision="fp32", max_context=32, system="groqnode", **mapping)
    tokens, logits = session.generate(ids, 8, return_logits=True)
    want = model.generate(torch.as_tensor(ids), max_new_tokens=8, do_sample=False)[:, 13:].numpy()
    np.testing.assert_array_equal(tokens, want)
    ref = _torch_logits(model, session.spec, ids, tokens)
    errs = [rel_err(logits[k], ref[k]) for k in range(len(ref))]
    assert max(errs) < 1e-5, errs
    rep = session.report
    if mapping.get("split_layers"):
        # Attention and MLP weights of 259,200 and 288,000 values a layer: the heaviest
        # stage an MLP and an attention, the first split.
        assert rep["stage_halves"] == [(1, 0), (0, 1), (1, 1)]
        assert rep["link_bytes_per_token"] == 2 * 320 * 4  # two hand-offs of one vector
        return
    assert rep["pipeline_stages"] == 2 and rep["stage_layers"] == [1, 1]
    assert rep["tensor_parallel"] == tensor_parallel and rep["chips"] == list(mapping.get("chips", (0, 1)))
    if tensor_parallel == 1:
        # The one hand-off a token: its hidden state (240 fp32 values), one vector of 320
        # lanes on the link.
        assert rep["link_bytes_per_token"] == 320 * 4
        one_chip = lpx_tvm.compile_llm(model, precision="fp32", max_context=32)
        # Two chips run the same work one after the other, plus the hand-off: the second
        # stage ends at least the link's latency after the first, and the whole is within
        # a few latencies of one chip's step (the second chip installs its weights while
        # it waits; one chip's schedule is not additive in its layers, docs/multichip.md,
        # so either may be the shorter).
        cfg = session.config
        ends = session.decode_stage_ends
        assert ends[-1] == rep["decode_cycles_per_token"] and ends[1] - ends[0] >= cfg.c2c_latency, ends
        extra = rep["decode_cycles_per_token"] - one_chip.decode.cycles
        assert abs(extra) < 3 * cfg.c2c_latency, extra


def test_pipeline_half_precision_and_int8():
    """Llama over two stages at fp16 (one chip's 1e-2 tolerance), GPT-2 over two stages of
    two chips in int8 (one chip's: within its own reference's distance from float)."""
    model = _model("llama", 3, 2.0)
    ids = np.random.default_rng(4).integers(0, 320, (1, 9))
    session = lpx_tvm.compile_llm(model, precision="fp16", max_context=32, system="groqnode", chips=(2, 3),
                                  tensor_parallel=1)
    tokens, logits = session.generate(ids, 8, return_logits=True)
    want = _torch_logits(model, session.spec, ids, tokens)
    check_half_logits(tokens, logits, want, _torch_logits(_model("llama", 3, 2.0).half(), session.spec, ids, tokens))
    gpt2 = _model("gpt2", 3, 4.0)
    session = lpx_tvm.compile_llm(gpt2, precision="int8", max_context=32, system="groqnode", chips=(0, 1, 2, 3),
                                  tensor_parallel=2)
    check_8bit_session(session, gpt2, ids, 6)


def test_pipeline_refusals():
    model = _model("llama", 3, 2.0)
    with pytest.raises(LPXError, match="are not whole stages of 2"):
        lpx_tvm.compile_llm(model, precision="fp32", max_context=32, system="groqnode", chips=(0, 1, 2),
                            tensor_parallel=2)
    with pytest.raises(ModelError, match="a stage holds at least one layer"):
        lpx_tvm.compile_llm(model, precision="fp32", max_context=32, system="groqnode", chips=(0, 1, 2),
                            tensor_parallel=1)
    # tsp-rack: chips of different nodes are linked only through their nodes' global ports
    system = lpx_tvm.machine.system.load_system("tsp-rack")
    far = next(c for c in range(1, system.chips) if not system.links_between(0, c))
    with pytest.raises(LPXError, match=f"chips 0 and {far} of system tsp-rack are not linked: a pipeline stage"):
        lpx_tvm.compile_llm(model, precision="fp32", max_context=32, system="tsp-rack", chips=(0, far),
                            tensor_parallel=1)
    with pytest.raises(LPXError, match="split_layers cuts pipeline stages: give a system"):
        lpx_tvm.compile_llm(model, precision="fp32", max_context=32, split_layers=True)
    with pytest.raises(ModelError, match="at least an attention or an MLP"):
        lpx_tvm.compile_llm(model, precision="fp32", max_context=32, system="groqnode", pipeline_stages=5,
                            split_layers=True)
    wide = dict(model_type="llama", vocab_size=1100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    with pytest.raises(LPXError, match="an embedding table of 1100 rows is not gathered on chip: a lane tile of it "
                                       "takes more than a slice's 4096 lines"):  # 4 bytes a row: 4,400 lines
        lpx_tvm.compile_llm(wide, preset="mini", precision="fp32", max_context=32, embed_on_chip=True)


def test_pipeline_with_the_table_on_the_host():
    """compile_llm(system=..., embed_on_chip=False): the host looks the first stage's rows
    up, as on one chip; the same tokens as transformers."""
    model = _model("llama", 3, 2.0)
    ids = np.random.default_rng(2).integers(0, 320, (1, 7))
    session = lpx_tvm.compile_llm(model, precision="fp32", max_context=32, system="groqnode", pipeline_stages=2,
                                  embed_on_chip=False)
    assert not session.embed_on_chip
    want = model.generate(torch.as_tensor(ids), max_new_tokens=5, do_sample=False)[:, 7:].numpy()
    np.testing.assert_array_equal(session.generate(ids, 5), want)
