"""The planner's predictions (layers simulated on one and two-layer models, composed)
against the whole model simulated, and its choice of mapping."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm.cli import main  # noqa: E402
from lpx_tvm.llm.capacity import Mapping, Plan, plan, shard_config  # noqa: E402
from lpx_tvm.llm.session import fit_problem, host_table_values, load_decoder, matrix_parameters  # noqa: E402
from lpx_tvm.llm import sizing  # noqa: E402
from lpx_tvm.frontends import decoders  # noqa: E402
from lpx_tvm.machine.config import load_config  # noqa: E402
from lpx_tvm.target.system_programs import collective, point_to_point  # noqa: E402

from decoder_models import LLAMA  # noqa: E402

CONFIG = dict(LLAMA, num_hidden_layers=5, model_type="llama")


def test_prediction_within_5_percent_of_the_whole_model_simulated():
    """Tensor parallelism over 3 chips, alone and in two pipeline stages (6 chips): the
    predictions, from 2- and 4-layer steps and a 4-layer model in two stages, within 5%
    of the 5-layer model simulated whole."""
    p = plan(CONFIG, "groqnode", precision="fp32", context=32, prompt_len=9, tensor_parallel=[3], pipeline=[1, 2],
             workers=2)  # the sampled models compiled and simulated in 2 worker processes
    one, lone, two = p.mappings  # one stage; two stages with one micro-batch in flight, and with two
    assert (lone.pipeline_stages, lone.micro_batches) == (2, 1)
    assert lone.decode_cycles_per_token == two.decode_cycles_per_token
    assert lone.tokens_per_s_per_user == pytest.approx(900e6 / lone.decode_cycles_per_token)
    assert one.fits and one.chips == 3 and one.layer_cycles > 2 * 2 * 450  # two all-reduces a layer, two latencies each
    assert two.fits and two.chips == 6 and two.pipeline_stages == two.micro_batches == 2
    # samples="chip": one chip's third of the model alone, and the collectives.
    chip_one, chip_two, _ = plan(CONFIG, "groqnode", precision="fp32", context=32, prompt_len=9, tensor_parallel=[3],
                                 pipeline=[1, 2], samples="chip").mappings
    for m in (one, two):
        s = lpx_tvm.compile_llm(CONFIG, precision="fp32", max_context=32, prompt_len=9, system="groqnode",
                                tensor_parallel=3, pipeline_stages=m.pipeline_stages)
        decode, ttft = s.decode_cycles, s.prefill_cycles(9)
        assert abs(m.decode_cycles_per_token - decode) / decode < 0.05, (m, decode)
        chip = chip_one if m is one else chip_two
        assert abs(chip.decode_cycles_per_token - decode) / decode < 0.15, (chip, decode)
        assert abs(m.ttft_cycles - ttft) / ttft < 0.05, (m, ttft)
        assert 0 < m.link_utilization < 1
    assert one.tokens_per_s_per_chip == pytest.approx(one.tokens_per_s_per_user / 3)
    # Two micro-batches in flight: each user waits for the slowest stage to come round twice.
    assert two.tokens_per_s_per_user == pytest.approx(
        two.tokens_per_s_per_system / 2) and two.stage_interval_cycles < two.decode_cycles_per_token
    assert two.tokens_per_s_per_system == pytest.approx(
        2 * 900e6 / max(two.decode_cycles_per_token, 2 * two.stage_interval_cycles))
    assert two.sram_fill < one.sram_fill  # each stage holds fewer layers


def test_chip_samples_compose_one_chips_share_with_the_collectives():
    """samples="chip" by hand: one chip's share compiled alone at one and two layers (the
    shard config: a third of the heads, kv heads, MLP units and vocabulary), each layer
    adding two all-reduces of the hidden row, the logits' all-reduce once, and each stage
    boundary the hand-off of the hidden row."""
    shard = shard_config(CONFIG, 3)
    assert (shard["num_attention_heads"], shard["num_key_value_heads"], shard["head_dim"],
            shard["intermediate_size"], shard["vocab_size"]) == (2, 1, 40, 134, 107)
    one, two = plan(CONFIG, "groqnode", precision="fp32", context=32, prompt_len=9, tensor_parallel=[3],
                    pipeline=[1, 2], samples="chip").mappings[:2]
    d = {n: lpx_tvm.compile_llm(dict(shard, num_hidden_layers=n), preset="tsp", precision="fp32",
                                max_context=32).decode.cycles for n in (1, 2)}
    reduce = collective("all_reduce", "groqnode", (0, 1, 2), 1, "fp32")  # 240 of 320 lanes: one vector
    logits = collective("all_reduce", "groqnode", (0, 1, 2), 1, "fp32")  # 320 logits: one vector
    assert reduce.cycles > 2 * 450  # a send and a gather, a link latency each
    layer = d[2] - d[1] + 2 * reduce.cycles
    assert one.layer_cycles == two.layer_cycles == layer
    # d(1) holds the first layer without its all-reduces; the other four are whole layers.
    assert one.decode_cycles_per_token == d[1] + 2 * reduce.cycles + 4 * layer + logits.cycles
    (g0, g1) = lpx_tvm.machine.system.load_system("groqnode").stage_groups(3, 2)
    handoff = point_to_point("groqnode", g0[0], g1[0], 1, "fp32").cycles
    assert two.decode_cycles_per_token == one.decode_cycles_per_token + handoff
    with pytest.raises(lpx_tvm.LPXError, match="samples='chip' shards Llama, Mistral and Qwen2"):
        shard_config(dict(model_type="gpt2", n_head=4), 2)

    # Stages cut at half layers: an attention is where the first of two one-chip stages of
    # the one-layer share ends, plus its all-reduce; an MLP the rest of a layer.
    (split,) = [m for m in plan(CONFIG, "groqnode", precision="fp32", context=32, prompt_len=9,
                                tensor_parallel=[3], pipeline=[2], samples="chip", split_layers=True).mappings
                if m.micro_batches == 1]
    halves = lpx_tvm.compile_llm(dict(shard, num_hidden_layers=1), precision="fp32", max_context=32,
                                 system="groqnode", pipeline_stages=2, split_layers=True)
    attention = halves.decode_stage_ends[0] + reduce.cycles
    stages = decoders.split_stages_of(5, 2, *decoders.half_layer_values(load_decoder(CONFIG, 0), decoders.spec_of(
        load_decoder(CONFIG, 0), 32)))
    assert [(s.attention_layers, s.mlp_layers) for s in stages] == [(3, 2), (2, 3)]  # A0 M0 A1 M1 A2 | M2 A3 ...
    mlp = layer - attention
    spans = [3 * attention + 2 * mlp + handoff, 2 * attention + 3 * mlp + d[1] - (d[2] - d[1]) + logits.cycles]
    assert split.decode_cycles_per_token == sum(spans) and split.stage_interval_cycles == max(spans)


def test_the_table_the_host_keeps_takes_no_sram():
    """A vocabulary wider than a slice's lines: the host looks the embedding up, so a
    chip's fit counts the LM head but not the table."""
    import torch

    cfg = load_config("tsp")
    big = dict(CONFIG, vocab_size=cfg.lines_per_slice)  # fp16 rows: two lines a token
    with torch.device("meta"):
        model = load_decoder(big, 0)
    spec = decoders.spec_of(model, 32)
    host = host_table_values(model, spec, cfg, "fp16")
    assert host == big["vocab_size"] * big["hidden_size"]
    assert host_table_values(model, spec, cfg, "fp32") == host
    small = dict(CONFIG, vocab_size=cfg.lines_per_slice // 2)
    with torch.device("meta"):
        on_chip = load_decoder(small, 0)
    assert host_table_values(on_chip, decoders.spec_of(on_chip, 32), cfg, "fp16") == 0
    huge = dict(CONFIG, vocab_size=300_000)  # head and table 144 MB each in fp16: one fits a chip, not both
    with torch.device("meta"):
        model = load_decoder(huge, 0)
    spec, matrices = decoders.spec_of(model, 32), matrix_parameters(model)
    assert fit_problem(spec, cfg, "fp16", matrices, host_table_values(model, spec, cfg, "fp16")) is None
    assert "MiB of fp16 weights" in fit_problem(spec, cfg, "fp16", matrices)


def test_a_chip_share_is_sized_as_the_compiler_stores_it():
    """The planner's stored size of one chip's share of a layer (each matrix's rows whole
    lane tiles) equals what the compiler places: the matrices of a one-layer share,
    compiled, read from the program's constants."""
    import torch
    from lpx_tvm.target.builder import chunk_lines

    cfg = load_config("tsp")
    for t in (1, 3):
        share = dict(shard_config(CONFIG, t), num_hidden_layers=1)
        session = lpx_tvm.compile_llm(share, precision="fp32", max_context=16)
        stored = {t_.name: sum(n for _, _, n in chunk_lines(t_.layout)) * cfg.lanes // 4
                  for _, t_ in session.decode.region.constants if len(t_.layout.shape) == 2}
        head = sizing.matrix_values(CONFIG["hidden_size"], share["vocab_size"], cfg.lanes)
        matrices = [v for n, v in stored.items() if n.endswith(".weight")]
        assert head in matrices
        with torch.device("meta"):
            whole = load_decoder(CONFIG, 0)
        attention, mlp = sizing.half_layer_stored(whole, decoders.spec_of(whole, 16), t, cfg.lanes)
        assert attention + mlp == sum(matrices) - head
        # By hand at t = 3: q, k and v fused, 80 + 40 + 40 outputs, and gate with up,
        # 2 x 134, take a lane tile a row (240 rows each); o and down, 80 and 134 rows of
        # 240 outputs, one tile.
        if t == 3:
            assert (attention, mlp) == ((240 + 80) * 320, (240 + 134) * 320)


def _m(t, b, user, chip, fits=True):
    return Mapping(t, b, t, 0.5, fits, tokens_per_s_per_user=user, tokens_per_s_per_chip=chip)


def test_best_and_pareto():
    p = Plan("m", "s", "fp16", 64, 2, [_m(1, 1, 100, 100), _m(1, 4, 60, 240), _m(2, 1, 150, 75), _m(2, 4, 50, 100),
                                        _m(8, 1, 0, 0, fits=False)])
    assert p.best().batch == 4 and p.best().tensor_parallel == 1
    assert p.best(120).tensor_parallel == 2
    assert p.best(1000) is None
    assert sorted((m.tensor_parallel, m.batch) for m in p.pareto()) == [(1, 1), (1, 4), (2, 1)]


def test_plan_cli(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(CONFIG, num_hidden_layers=2)))
    report = tmp_path / "plan.json"
    assert main(["plan", "--config", str(cfg), "--system", "groqnode", "--precision", "fp32", "--context", "16",
                 "--prompt-len", "4", "--batches", "1", "--max-chips", "1", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "best at >= 0 tokens/s per user: tensor parallel 1, 1 stage(s), batch 1" in out
    data = json.loads(report.read_text())
    assert data["best"]["tensor_parallel"] == 1 and len(data["mappings"]) == 1
    assert np.isfinite(data["mappings"][0]["decode_cycles_per_token"])
    # One chip's samples of one and two layers: a two-layer model's plan on one chip is its
    # two-layer step, simulated.
    assert main(["plan", "--config", str(cfg), "--system", "groqnode", "--precision", "fp32", "--context", "16",
                 "--prompt-len", "4", "--max-chips", "1", "--samples", "chip", "--report", str(report)]) == 0
    (m,) = json.loads(report.read_text())["mappings"]
    s = lpx_tvm.compile_llm(dict(CONFIG, num_hidden_layers=2), preset="tsp", precision="fp32", max_context=16)
    assert (m["decode_cycles_per_token"], m["ttft_cycles"]) == (s.decode.cycles, s.prefill_step(4).cycles)


def test_a_share_too_large_for_two_layers_is_sampled_at_none_and_one():
    """Where two layers of a chip's share do not fit (an eighth of a Llama-2-70B layer on a
    TSP), the planner samples the share with no layer (embedding, last norm, head) and with
    one: the sample without layers compiles (a user's config still needs a layer), and
    the layer's increment is what one layer adds."""
    from lpx_tvm.frontends.decoder_config import with_layers
    from lpx_tvm.llm.capacity import CHIP_SAMPLED_LARGE, _chip_sample

    assert CHIP_SAMPLED_LARGE == (0, 1)
    cfg, kw = load_config("tsp"), dict(precision="fp16", max_context=32)
    none, one = (_chip_sample(with_layers(CONFIG, n), 0, cfg, 1, kw, 8, True) for n in CHIP_SAMPLED_LARGE)
    assert 0 < none[0] < one[0] and 0 < none[1] < one[1]
    with pytest.raises(lpx_tvm.LPXError, match="num_hidden_layers 0"):
        lpx_tvm.compile_llm(with_layers(CONFIG, 0), preset="tsp")
