"""Random-weight decoders of odd sizes, and the logits of their torch steps: shared by
the LLM tests."""

import numpy as np
import torch
import transformers

from lpx_tvm.frontends import decoders

# Odd sizes (issue): 6 query heads over 3 kv heads, head dim 40, a 13-token prompt.
LLAMA = dict(vocab_size=320, hidden_size=240, intermediate_size=400, num_hidden_layers=2, num_attention_heads=6,
             num_key_value_heads=3, head_dim=40, max_position_embeddings=128)


# A value this close (relative) to an 8-bit rounding boundary may round either way.
TIE = 1e-6


def random_decoder(kind, seed=0, scale=4.0):
    torch.manual_seed(seed)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**LLAMA,
                                                                        use_sliding_window=False))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=320, n_embd=240, n_layer=2, n_head=6,
                                                                     n_positions=128, bos_token_id=0,
                                                                     eos_token_id=0))
    # Larger weights than the initializer's: the logits then differ clearly between
    # tokens, so a wrong step picks other tokens rather than the same ones by luck.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return model.eval()


def torch_logits(model, spec, ids, tokens, quant=None, ties=None):
    """The logits of every step in the model's dtype, teacher-forced with ``tokens`` (the
    tokens LPX chose); with ``quant``, of the int8 steps. With ``ties`` (a list), appends
    each step's smallest relative distance of a value to an 8-bit rounding boundary
    (:func:`tie_distance`)."""
    prefill, decode, _ = decoders.decoder_steps(model, spec.max_context, ids.shape[1], spec.batch, quant=quant)
    _, _, *caches = decoders.example_inputs(spec, ids.shape[1], dtype=next(model.parameters()).dtype)
    closest = [np.inf]
    if ties is not None and quant is not None:
        for step in (prefill, decode):
            _watch_ties(step, quant, closest)
    out = []

    def record():
        if ties is not None:
            ties.append(closest[0])
            closest[0] = np.inf

    with torch.no_grad():
        _, logits, *caches = prefill(torch.as_tensor(ids.reshape(-1), dtype=torch.int32),
                                     torch.zeros(1, dtype=torch.int32), *caches)
        out.append(logits.float().numpy())
        record()
        for k in range(tokens.shape[1] - 1):
            _, logits, *caches = decode(torch.as_tensor(tokens[:, k], dtype=torch.int32),
                                        torch.tensor([ids.shape[1] + k], dtype=torch.int32), *caches)
            out.append(logits.float().numpy())
            record()
    return np.stack(out)


def tie_distance(v: np.ndarray, fmt: str) -> float:
    """The smallest relative distance of the scaled values ``v`` to a point where their
    8-bit rounding changes (a midpoint between two int8 or fp8 e4m3 values): 0 on a tie."""
    v = np.abs(v.astype(np.float64)).ravel()
    v = v[v > 0]
    if fmt == "fp8":
        top = float(decoders.FP8_MAX)
        v = v[v < top]  # the clamp sends all beyond to the top
        # e4m3: 3 mantissa bits; below 2^-6 the spacing is that of the subnormals, 2^-9.
        spacing = 2.0 ** (np.maximum(np.floor(np.log2(np.maximum(v, 2.0**-6))), -6) - 3)
    else:
        v = v[v < 127.5]
        spacing = np.ones_like(v)
    if not v.size:
        return np.inf
    mid = (np.floor(v / spacing - 0.5) + 0.5) * spacing
    return float(np.min(np.minimum(np.abs(v - mid), np.abs(v - mid - spacing)) / v))


def _watch_ties(step, quant, closest):
    """Have ``step`` record its quantized values' distance to a rounding boundary (a hook
    on its linear strategy's input)."""
    quantized = step.linears.input

    def watched(x, site):
        scaled = (x * quant.inverse(site)).detach().float().numpy()
        closest[0] = min(closest[0], tie_distance(scaled, quant.fmt))
        return quantized(x, site)

    step.linears.input = watched


def rel_err(got, want) -> float:
    """Relative L2 error of ``got`` against ``want``."""
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def check_half_logits(tokens, logits, want, half):
    """Half-precision logits ([steps, B, V]) against the fp32 torch reference ``want``:
    within 1e-2 or torch's own error at that precision (``half``), the tokens equal
    wherever the margin exceeds 1e-2."""
    for k in range(len(want)):
        err, torch_err = rel_err(logits[k], want[k]), rel_err(half[k], want[k])
        assert err < max(1e-2, torch_err), (k, err, torch_err)
        assert_tokens_where_clear(tokens[:, k], want[k], 1e-2)


def assert_tokens_where_clear(tokens, want, margin: float):
    """``tokens`` ([B]) are ``want``'s argmax ([B, V] logits) wherever its top-2 gap exceeds
    ``margin`` times its largest |logit| (elsewhere an error that size may swap them)."""
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > margin * np.abs(want).max(axis=-1)
    np.testing.assert_array_equal(tokens[clear], want.argmax(-1)[clear])


def check_8bit_layers(session, model, ids, new_tokens: int):
    """A session with fp32 around its 8-bit layers against the torch steps with the same
    scales: the logits far closer to that reference (under a tenth) than the reference
    is to the float model, the tokens equal wherever the margin is clear. Returns the
    tokens.

    A value within ``TIE`` of an 8-bit rounding boundary may round one way on LPX and the
    other in torch (their fp32 sums differ in order, by about 1e-7 of a value); the
    changed value then stays in the KV cache, and every later step differs by about one
    rounding step's effect. So a step may miss the tight bound only from the first step
    holding such a near-tie on, and then stays within the reference's own distance from
    the float model."""
    tokens, logits = session.generate(ids, new_tokens, return_logits=True)
    ties = []
    want = torch_logits(model, session.spec, ids, tokens, session.quantization, ties=ties)
    flt = torch_logits(model, session.spec, ids, tokens)
    errs = [rel_err(logits[k], want[k]) for k in range(len(want))]
    quant_errs = [rel_err(flt[k], want[k]) for k in range(len(want))]
    tight = 0.1 * np.median(quant_errs)
    first_tie = next((k for k, d in enumerate(ties) if d < TIE), len(ties))
    for k in range(len(want)):
        if k < first_tie:
            assert errs[k] < tight, (k, first_tie, errs, quant_errs)
        else:
            assert errs[k] < quant_errs[k], (k, first_tie, errs, quant_errs)
        assert_tokens_where_clear(tokens[:, k], want[k], 2 * errs[k])
    return tokens


def check_8bit_session(session, model, ids, new_tokens: int):
    """A compiled 8-bit session (fp16 around its 8-bit layers) against the torch steps with
    the same scales: each step's logits within the reference's own distance from the float
    model (or 1e-2), the tokens equal wherever the margin exceeds that distance."""
    tokens, logits = session.generate(ids, new_tokens, return_logits=True)
    want = torch_logits(model, session.spec, ids, tokens, session.quantization)
    flt = torch_logits(model, session.spec, ids, tokens)
    for k in range(len(want)):
        err, quant_err = rel_err(logits[k], want[k]), rel_err(flt[k], want[k])
        assert err < max(1e-2, quant_err), (k, err, quant_err)
        assert_tokens_where_clear(tokens[:, k], want[k], 2 * quant_err)
