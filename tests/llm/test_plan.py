"""The planner's predictions (layers simulated on one and two-layer models, composed)
against the whole model simulated, and its choice of mapping."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm.cli import main  # noqa: E402
from lpx_tvm.llm.plan import Mapping, Plan, plan  # noqa: E402

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
    for m in (one, two):
        s = lpx_tvm.compile_llm(CONFIG, precision="fp32", max_context=32, prompt_len=9, system="groqnode",
                                tensor_parallel=3, pipeline_stages=m.pipeline_stages)
        decode, ttft = s.decode_cycles, s.prefill_cycles(9)
        assert abs(m.decode_cycles_per_token - decode) / decode < 0.05, (m, decode)
        assert abs(m.ttft_cycles - ttft) / ttft < 0.05, (m, ttft)
        assert 0 < m.link_utilization < 1
    assert one.tokens_per_s_per_chip == pytest.approx(one.tokens_per_s_per_user / 3)
    # Two micro-batches in flight: each user waits for the slowest stage to come round twice.
    assert two.tokens_per_s_per_user == pytest.approx(
        two.tokens_per_s_per_system / 2) and two.stage_interval_cycles < two.decode_cycles_per_token
    assert two.tokens_per_s_per_system == pytest.approx(
        2 * 900e6 / max(two.decode_cycles_per_token, 2 * two.stage_interval_cycles))
    assert two.sram_fill < one.sram_fill  # each stage holds fewer layers


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
