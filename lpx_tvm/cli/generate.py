"""``lpx-tvm generate``: a decoder LLM compiled for a chip or a system, generating greedily."""

from __future__ import annotations

import argparse
import time

from ..errors import LPXError
from .arguments import LLM_PRECISIONS, int_list, natural_int, positive_int
from .reports import _print_llm_report, _print_system_report


def _generate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True,
                   help="a transformers config.json of a Llama, Qwen2, Mistral or GPT-2 decoder (random weights, "
                        "seeded by --seed: nothing is downloaded)")
    p.add_argument("--prompt-len", type=positive_int, default=None,
                   help="prompt tokens (seeded random ids; default 8)")
    p.add_argument("--prompt-ids", type=int_list(0, unique=False),
                   help="the prompt's token ids, comma-separated (instead of --prompt-len)")
    p.add_argument("--new-tokens", type=positive_int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--max-context", type=positive_int, default=None,
                   help="positions the KV cache holds (default: prompt + new tokens)")
    p.add_argument("--batch", type=positive_int, default=1, help="sequences decoded together (the prompt repeated)")
    p.add_argument("--preset", default="tsp")
    p.add_argument("--precision", default="fp16", choices=LLM_PRECISIONS,
                   help="fp16 by default; int8 / fp8: W8A8 dense layers in int8 or fp8 e4m3 (activation scales "
                        "calibrated on a seeded random prompt), the rest fp16; fp8 needs an MXM with an fp8 "
                        "rate (--preset lp30)")
    p.add_argument("--seed", type=natural_int, default=0, help="seed of the random weights and prompt")
    p.add_argument("--report", help="JSON file to write the report to")
    p.add_argument("--system", help="map the decoder over chips of this system by tensor and pipeline parallelism: "
                                     "a preset (groqnode, tsp-rack, tsp-576, lp30-rack) or a system JSON file; "
                                     "replaces --preset (docs/multichip.md)")
    p.add_argument("--chips", type=int_list(0), help="the system's chips to use, comma-separated, in pipeline "
                                                      "stages of --tensor-parallel chips (default: all)")
    p.add_argument("--tensor-parallel", type=positive_int, default=None,
                   help="chips per pipeline stage, pairwise linked (default: all the chips, one stage)")


def _generate(args) -> int:
    import json

    import numpy as np

    from ..files import Output, check_outputs

    # Every refusal that needs no model comes first, then those that need its vocabulary,
    # all before the compile.
    if args.prompt_ids is not None and args.prompt_len is not None:
        raise LPXError("give --prompt-ids or --prompt-len, not both")
    for flag, value in (("--chips", args.chips), ("--tensor-parallel", args.tensor_parallel)):
        if value is not None and not args.system:
            raise LPXError(f"{flag} needs --system")
    check_outputs([Output("--report", args.report)], inputs=[args.config, args.system])
    from ..llm.session import check_cache_rows, compile_llm, llm_machine, load_decoder, quiet_transformers

    cfg, _ = llm_machine(args.precision, args.preset, args.system, name="--precision")
    prompt_len = len(args.prompt_ids) if args.prompt_ids else args.prompt_len or 8
    need = max(prompt_len + 1, prompt_len + args.new_tokens - 1)  # the prefill's, the last decode step's
    context = args.max_context or prompt_len + args.new_tokens
    if context < need:
        raise LPXError(f"--max-context {context}: a prompt of {prompt_len} tokens and {args.new_tokens} new ones "
                       f"need a context of at least {need}")
    check_cache_rows(cfg, args.precision, context)
    with quiet_transformers():
        model = load_decoder(args.config, args.seed)
    vocab = model.get_input_embeddings().num_embeddings
    if args.prompt_ids:
        beyond = [i for i in args.prompt_ids if i >= vocab]
        if beyond:
            raise LPXError(f"--prompt-ids: {beyond[0]} is not a token id of this model (its vocabulary: "
                           f"0..{vocab - 1})")
        prompt = np.array(args.prompt_ids, np.int64)
    else:
        prompt = np.random.default_rng(args.seed).integers(0, vocab, prompt_len)
    chips = args.chips
    t = time.perf_counter()
    session = compile_llm(model, preset=args.preset, precision=args.precision, max_context=context,
                          batch=args.batch, prompt_len=len(prompt), system=args.system, chips=chips,
                          tensor_parallel=args.tensor_parallel)
    compile_s = time.perf_counter() - t
    tokens = session.generate(np.tile(prompt, (args.batch, 1)), args.new_tokens)
    rep = session.report
    where = rep["preset"] if "system" not in rep else \
        f"{len(rep['chips'])} chips of {rep['system']} ({rep['preset']}; {rep['pipeline_stages']} stage(s) of " \
        f"{rep['tensor_parallel']}; chips {rep['chips']})"
    print(f"{rep['family']} ({rep['parameters']:,} parameters, {rep['layers']} layers) on {where} "
          f"({rep['precision']}), batch {rep['batch']}, context {rep['max_context']}: compiled in {compile_s:.1f} s")
    print(f"prompt: {','.join(str(int(x)) for x in prompt)}")
    for b, row in enumerate(tokens):
        print(f"tokens{f' [{b}]' if args.batch > 1 else ''}: {','.join(str(int(x)) for x in row)}")
    _print_llm_report(rep) if "system" not in rep else _print_system_report(rep)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(rep, f, indent=1)
        print(f"report: {args.report}")
    return 0
