"""SHA-256 of every encoded program the compiler makes for a fixed set of models.

The set (each model compiled whole, every LPX region's program hashed):
- light_resnet50 on tsp, bf16: default schedules, and with the shipped tuning log;
- ResNet-50 (torch, random weights) quantized QDQ u8s8, int8 on tsp;
- BERT-tiny and GPT-2 tiny (transformers configs, random weights), fp16 on tsp;
- the test CNNs on mini, fp32: the small CNN of tests/e2e/test_build.py (resident) and
  the wide CNN of tests/e2e/test_offchip.py (activations off chip, run by bands);
- the hand-written kernels (lpx_tvm.kernels), which share the builder and placer;
- decoder LLMs (random weights, tests/llm/decoder_models.py's odd-sized Llama and a
  GPT-2): the decode step and a 13-token prefill step, on one chip (fp16 and int8 on
  tsp, fp8 on lp30) and on chips of a groqnode (GPT-2 int8 over tensor 2 x pipeline 2, the Llama fp16 over
  two pipeline stages).

A refactor of the compiler must leave every hash unchanged (tests/test_program_hashes.py).
Region names carry a per-build random tag (extern-call names are process-global); it is
replaced by the region's index before hashing, so the hash covers everything else of
the program: instructions with their cycles and tags, SRAM image, bindings, tables,
symbols.

    python tests/program_hashes.py            # compare with tests/program_hashes.json
    python tests/program_hashes.py --write    # regenerate it
    python tests/program_hashes.py --only small_cnn_mini_fp32
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "program_hashes.json")
sys.path.insert(0, os.path.join(HERE, "e2e"))
sys.path.insert(0, os.path.join(HERE, "llm"))

_REGION_TAG = re.compile(r"\b[0-9a-f]{8}_(\d+)\b")


def _canonical(text: str) -> str:
    return _REGION_TAG.sub(lambda m: f"region_{m.group(1)}", text)


def program_hash(prog) -> str:
    """SHA-256 of a program's encoding, with the per-build region tag made canonical."""
    try:
        from lpx_tvm.machine.encoding import encode_program
    except ImportError:
        from lpx_tvm.machine.encoding import encode_program

    canon = dataclasses.replace(prog, name=_canonical(prog.name),
                                instrs=[dataclasses.replace(i, tag=_canonical(i.tag)) for i in prog.instrs])
    return hashlib.sha256(encode_program(canon)).hexdigest()


def model_hashes(compiled) -> dict:
    """{canonical region name: hash} of a compiled model's programs."""
    regions = compiled.executable.regions
    return {_canonical(name): program_hash(r.program) for name, r in sorted(regions.items())}


def _bundled(name):
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"{name}.onnx")


def _resnet50(tuned: bool):
    import lpx_tvm
    from lpx_tvm import load_config
    from lpx_tvm.tune.database import shipped_log

    log = shipped_log("light_resnet50", load_config("tsp"), "bf16") if tuned else None
    assert not tuned or log is not None, "the shipped light_resnet50 log is missing"
    return lpx_tvm.compile_model(_bundled("light_resnet50"), preset="tsp", precision="bf16", tuning_log=log)


def _resnet50_int8():
    """bench/e2e.py's int8 ResNet-50 (random weights, QDQ u8s8 by onnxruntime)."""
    import lpx_tvm

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))
    from e2e import quantized_resnet50

    path = quantized_resnet50(tempfile.mkdtemp(prefix="lpx_hash_int8_"))
    return lpx_tvm.compile_model(path, preset="tsp", precision="int8")


def _transformer(kind: str):
    import torch

    import lpx_tvm
    from transformer_models import LastHiddenState, bert, gpt2

    torch.manual_seed(0)
    stack = LastHiddenState((bert if kind == "bert" else gpt2)(64, 2, 2).eval())
    ids = torch.randint(0, 1000, (1, 16))
    path = os.path.join(tempfile.mkdtemp(prefix="lpx_hash_tf_"), f"{kind}.onnx")
    torch.onnx.export(stack, (ids,), path, dynamo=True, input_names=["input_ids"],
                      output_names=["last_hidden_state"], verbose=False)
    return lpx_tvm.compile_model(path, preset="tsp", precision="fp16")


def _small_cnn():
    import lpx_tvm
    import test_build

    test_build.RNG = np.random.default_rng(0)
    return lpx_tvm.compile_model(test_build.small_cnn(), preset="mini", precision="fp32")


def _wide_cnn():
    import lpx_tvm
    import test_offchip

    test_offchip.RNG = np.random.default_rng(3)
    return lpx_tvm.compile_model(test_offchip.wide_cnn(), preset="mini", precision="fp32")


def _kernels():
    """The hand-written kernels (they share the builder and placer with the compiler)."""
    from lpx_tvm.kernels import gemm, layernorm, softmax, transpose

    rng = np.random.default_rng(0)
    progs = {
        "gemm_int8_tsp": gemm("tsp", 64, 640, 700, "int8"),
        "gemm_fp16_bias_relu_mini": gemm("mini", 40, 48, 36, "fp16", bias=rng.standard_normal(36), relu=True),
        "softmax_fp16_mini": softmax("mini", 24, 16, "fp16"),
        "layernorm_fp16_tsp": layernorm("tsp", 8, 300, rng.standard_normal(300), rng.standard_normal(300)),
        "transpose_fp16_mini": transpose("mini", 32, 48, "fp16"),
    }
    return {name: program_hash(p) for name, p in progs.items()}


PROMPT = 13  # tokens of the prefill step hashed


def _llm(kind: str, precision: str, preset: str = "tsp", **mapping):
    """{step: hash} of a decoder's decode step and its prefill step of PROMPT tokens (on a
    system: {step/chip: hash})."""
    import lpx_tvm
    from decoder_models import random_decoder

    model = random_decoder(kind)
    session = lpx_tvm.compile_llm(model, preset=preset, precision=precision, max_context=32, seed=0, **mapping)
    steps = {"decode": session.decode, f"prefill_{PROMPT}": session.prefill_step(PROMPT)}
    if "system" not in mapping:
        return {name: program_hash(step.program) for name, step in steps.items()}
    return {f"{name}/chip_{c}": program_hash(s.program) for name, chips in steps.items() for c, s in chips.items()}


MODELS = {
    "light_resnet50_tsp_bf16": lambda: _resnet50(tuned=False),
    "light_resnet50_tsp_bf16_shipped_log": lambda: _resnet50(tuned=True),
    "resnet50_qdq_tsp_int8": _resnet50_int8,
    "bert_tiny_tsp_fp16": lambda: _transformer("bert"),
    "gpt2_tiny_tsp_fp16": lambda: _transformer("gpt2"),
    "small_cnn_mini_fp32": _small_cnn,
    "wide_cnn_mini_fp32": _wide_cnn,
    "kernels": _kernels,
    "llm_llama_tsp_fp16": lambda: _llm("llama", "fp16"),
    "llm_llama_tsp_int8": lambda: _llm("llama", "int8"),
    "llm_llama_lp30_fp8": lambda: _llm("llama", "fp8", "lp30"),
    "llm_gpt2_tsp_fp16": lambda: _llm("gpt2", "fp16"),
    "llm_gpt2_groqnode_tp2_pp2_int8": lambda: _llm("gpt2", "int8", system="groqnode", chips=(0, 1, 2, 3),
                                                   tensor_parallel=2),
    "llm_llama_groqnode_pp2_fp16": lambda: _llm("llama", "fp16", system="groqnode", pipeline_stages=2),
}


def compute(names=None) -> dict:
    out = {}
    for name in names or MODELS:
        made = MODELS[name]()
        out[name] = made if isinstance(made, dict) else model_hashes(made)
        print(f"{name}: {len(out[name])} program(s)", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"regenerate {os.path.relpath(GOLDEN)}")
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), help="just these models")
    args = ap.parse_args(argv)
    got = compute(args.only)
    if args.write:
        want = {}
        if args.only and os.path.exists(GOLDEN):  # regenerate just these, keep the others
            with open(GOLDEN) as f:
                want = json.load(f)
        with open(GOLDEN, "w") as f:
            json.dump({**want, **got}, f, indent=1, sort_keys=True)
            f.write("\n")
        return 0
    with open(GOLDEN) as f:
        want = json.load(f)
    bad = [m for m in got if got[m] != want.get(m)]
    for m in bad:
        diff = sorted(k for k in set(got[m]) | set(want.get(m, {})) if got[m].get(k) != want.get(m, {}).get(k))
        print(f"{m}: programs differ: {', '.join(diff)}")
    print("all program hashes unchanged" if not bad else f"{len(bad)} model(s) changed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
