"""The decoder fuzzer's CI sample, its generator and its classification (docs/fuzz.md).

Random valid decoder configs of each family, compiled on one chip or over chips of a
system in fp32, must generate transformers' greedy tokens (``ok``), or part from them
only where transformers' own top two logits tie (``tie``)."""

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decoder_configs  # noqa: E402
import llm_runner  # noqa: E402

# (family, index) at seed 0: one chip of each family, and tensor, pipeline and both over
# chips (the mapping each draws is in the comment); chosen among the fast ones.
SAMPLE = [
    ("llama", 1),    # one lp30 chip: 8 heads over 1 kv head (MQA), an explicit head_dim, llama3 RoPE
    ("qwen2", 0),    # one chip: 4 layers, an explicit head_dim, untied
    ("qwen2", 3),    # one lp30 chip: MQA, 4 layers, an 8-token generation
    ("qwen2", 4),    # one chip: one head of 110, linear RoPE
    ("gpt2", 1),     # one chip, untied
    ("mistral", 0),  # GroqNode chips 6 and 0: one layer cut into 2 stages (attention | MLP)
    ("mistral", 2),  # 2 stages chosen by stage_groups on 3 chips, cut at half a layer
    ("qwen2", 12),   # GroqNode chips 4 and 1, tensor parallel
    ("llama", 22),   # 3 chips all-to-all, tensor parallel over 3 kv heads
    ("gpt2", 3),     # tensor 2 x 2 stages cut at half layers, a 1-token prompt
]
KNOWN_FAILURES = {}  # (family, index) -> the exact first line, while a fix is pending


@pytest.fixture(scope="module")
def sandbox():
    with llm_runner.LLMSandbox(timeout=300, log=os.devnull) as box:
        yield box


@pytest.mark.parametrize("family, index", SAMPLE, ids=[f"{f}-{i}" for f, i in SAMPLE])
def test_sample_generates_transformers_tokens(sandbox, family, index):
    if (family, index) in KNOWN_FAILURES:
        pytest.xfail(KNOWN_FAILURES[family, index])
    case = decoder_configs.case(family, index, 0)
    out = sandbox.run(family, index, 0)
    assert out.kind in ("ok", "tie"), f"{case.describe()}: {out.first_line}"
    assert out.rel_err is not None and out.rel_err <= llm_runner.LOGITS_RTOL


def test_sample_covers_the_mappings():
    kinds = {decoder_configs.case(f, i, 0).mapping.kind for f, i in SAMPLE}
    assert kinds == set(decoder_configs.MAPPINGS)


# ---- the generator ----------------------------------------------------------------------

def test_cases_are_reproducible():
    for family in decoder_configs.FAMILIES:
        a, b = decoder_configs.case(family, 7, 3), decoder_configs.case(family, 7, 3)
        assert a.to_json() == b.to_json()
        assert a.to_json() != decoder_configs.case(family, 7, 4).to_json()
    ma, mb = (decoder_configs.build_model(decoder_configs.case("llama", 2, 0)) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(ma.parameters(), mb.parameters()))


def _mapping_is_valid(case):
    from lpx_tvm.machine.system import load_system

    m, c = case.mapping, case.config
    if m.system is None:
        return m.preset in ("tsp", "lp30")
    system = load_system(m.system)
    tp = m.args["tensor_parallel"]
    kv = c["n_head"] if case.family == "gpt2" else c["num_key_value_heads"]
    layers = c["n_layer"] if case.family == "gpt2" else c["num_hidden_layers"]
    if "chips" in m.args:
        chips = m.args["chips"]
        stages = len(chips) // tp
        groups = [chips[s * tp:(s + 1) * tp] for s in range(stages)]
        assert len(set(chips)) == len(chips) and all(0 <= x < system.chips for x in chips)
    else:
        stages = m.args["pipeline_stages"]
        groups = system.stage_groups(tp, stages)
    linked = all(system.links_between(a, b) for g in groups for a in g for b in g if a != b) and \
        all(system.links_between(a, b) for g, h in zip(groups, groups[1:]) for a, b in zip(g, h))
    most = 2 * layers if m.args.get("split_layers") else layers
    kind = "tp-pp" if tp > 1 and stages > 1 else "tp" if tp > 1 else "pp"
    return kv % tp == 0 and 1 <= stages <= most and linked and kind == m.kind and tp * stages > 1


def test_configs_are_valid_and_cover_the_space():
    """The first 30 cases of each family: transformers builds them, the steps' spec
    accepts them, the mappings are valid on their systems; and together they hold every
    feature the generator promises."""
    from lpx_tvm.frontends import decoders

    seen = set()
    for family in decoder_configs.FAMILIES:
        for index in range(30):
            case = decoder_configs.case(family, index, 0)
            c = case.config
            model = decoder_configs.build_model(case)
            spec = decoders.spec_of(model, case.max_context)
            assert spec.hidden <= decoder_configs.MAX_HIDDEN and spec.vocab <= decoder_configs.MAX_VOCAB
            assert 1 <= spec.layers <= 4 and spec.heads % spec.kv_heads == 0
            assert case.prompt.shape[1] + case.new_tokens - 1 <= case.max_context
            assert 3 <= case.new_tokens <= 8 and case.prompt.max() < spec.vocab
            assert _mapping_is_valid(case), case.describe()
            tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
            assert tied == c["tie_word_embeddings"]
            seen |= {(family, "layers", spec.layers), ("tied", tied), ("mapping", case.mapping.kind)}
            if family != "gpt2":
                seen.add(("rope", (c.get("rope_scaling") or {}).get("rope_type", "default")))
                seen.add(("attention", "mha" if spec.kv_heads == spec.heads else "mqa" if spec.kv_heads == 1
                          else "gqa"))
                seen.add(("explicit head_dim", spec.head_dim * spec.heads != spec.hidden))
            seen.add(("odd vocab", spec.vocab % 2 == 1))
    want = {(f, "layers", n) for f in decoder_configs.FAMILIES for n in (1, 4)} | \
        {("tied", True), ("tied", False), ("odd vocab", True)} | \
        {("mapping", k) for k in decoder_configs.MAPPINGS} | \
        {("rope", r) for r in ("default", "linear", "llama3")} | \
        {("attention", a) for a in ("mha", "mqa", "gqa")} | {("explicit head_dim", True)}
    assert want <= seen, want - seen


# ---- the classification ----------------------------------------------------------------

def _forced(model, case, tokens):
    return llm_runner.forced_logits(model, case, tokens)


def _as_lpx(model, case):
    """Greedy tokens and teacher-forced logits of ``model`` in the shapes a session returns."""
    tokens = llm_runner.reference(model, case)
    return tokens, _forced(model, case, tokens)[:, None, :]


def _bugged(case, how):
    """The case's model with a bug an LPX step could have: RoPE with another theta, the
    query heads paired with the wrong kv heads, or the halves of RoPE not swapped."""
    model = decoder_configs.build_model(case)
    att = [layer.self_attn for layer in model.model.layers]
    cfg = model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    with torch.no_grad():
        if how == "kv groups":  # kv heads rolled by one: each group reads its neighbour's keys
            for a in att:
                for lin in (a.k_proj, a.v_proj):
                    lin.weight.copy_(torch.roll(lin.weight, d, 0))
                    if lin.bias is not None:
                        lin.bias.copy_(torch.roll(lin.bias, d, 0))
        elif how == "rope theta":
            rot = model.model.rotary_emb
            rot.inv_freq.copy_(rot.inv_freq * 1.5)
        elif how == "no rope":
            rot = model.model.rotary_emb
            rot.inv_freq.zero_()
    return model


@pytest.mark.parametrize("how", ["kv groups", "rope theta", "no rope"])
def test_bugs_are_wrong_tokens_not_ties(how):
    """A model with a bug LPX's steps could have, standing in for LPX: `wrong`, never `tie`
    or `ok` (its tokens or its logits differ far beyond fp32's order of sums)."""
    family = "qwen2" if how == "kv groups" else "llama"
    case = next(c for c in (decoder_configs.case(family, i, 0) for i in range(40))
                if c.config["num_key_value_heads"] > 1 and c.config["num_hidden_layers"] >= 2)
    model = decoder_configs.build_model(case)
    want = llm_runner.reference(model, case)
    tokens, logits = _as_lpx(_bugged(case, how), case)
    out = llm_runner.classify(tokens, logits, want, _forced(model, case, tokens))
    assert out.kind == "wrong", out
    # and the model itself, standing in for LPX, is ok
    tokens, logits = _as_lpx(model, case)
    assert llm_runner.classify(tokens, logits, want, _forced(model, case, tokens)).kind == "ok"


def test_tie_and_wrong_by_margin():
    """A token that differs where transformers' top two are 1e-6 apart (relative) is a tie;
    2e-3 apart, wrong; the same tokens with logits off by 1e-3, wrong."""
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(3, 50)).astype(np.float32) * 10
    ref[1, 7], ref[1, 9] = 40.0, 40.0 - 40.0 * 1e-6  # a near tie at step 1
    want = ref.argmax(-1)[None]
    got = want.copy()
    got[0, 1] = 9
    logits = ref[:, None, :].copy()
    assert llm_runner.classify(want, logits, want, ref).kind == "ok"
    assert llm_runner.classify(got, logits, want, ref).kind == "tie"
    ref2 = ref.copy()
    ref2[1, 9] = 40.0 - 40.0 * 2e-3
    assert llm_runner.classify(got, ref2[:, None, :], want, ref2).kind == "wrong"
    off = logits * (1 + 1e-3 * rng.normal(size=logits.shape).astype(np.float32))
    assert llm_runner.classify(want, off, want, ref).kind == "wrong"
