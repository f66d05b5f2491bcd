"""Hostile input to ``generate``, ``plan``, ``profile`` and the other writers, as a new
user would give it: each case exits 2 with exactly one ``lpx-tvm: error:`` line naming
the flag or path, before any compile, and leaves the user's files as they were; or it
runs and writes exactly the path it was given."""

import json
import os
import socket
import time

import pytest

from lpx_tvm import cli
from lpx_tvm.files import Output, OutputError, check_outputs, holds_only

# A tiny Llama: a refusal that needs the model builds it in milliseconds.
TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=320, max_position_embeddings=64)


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps(TINY))
    return "cfg.json"


def refused(capsys, argv, *named) -> str:
    """Run the CLI in-process; assert exit 2 and one error line holding each of ``named``."""
    status = cli.main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2, (argv, status, captured.err[-2000:])
    assert len(lines) == 1, (argv, lines)
    assert lines[0].startswith("lpx-tvm: error:"), lines
    for word in named:
        assert word in lines[0], (argv, word, lines[0])
    return lines[0]


G = ["generate", "--config", "cfg.json"]
P = ["plan", "--config", "cfg.json", "--system", "groqnode"]
PROF = ["profile", "cfg.json", "-o", "prof"]

# Every numeric flag's range, refused by the parser (no model is built).
PARSER_CASES = [
    (G + ["--prompt-len", "0"], "--prompt-len"),
    (G + ["--prompt-len=-3"], "--prompt-len"),
    (G + ["--prompt-len", "2.5"], "--prompt-len"),
    (G + ["--prompt-ids", ""], "--prompt-ids"),
    (G + ["--prompt-ids", "1,,2"], "--prompt-ids"),
    (G + ["--prompt-ids", "1,x"], "--prompt-ids"),
    (G + ["--prompt-ids", "3,-1"], "--prompt-ids"),
    (G + ["--prompt-ids", "99999999999999999999"], "--prompt-ids"),
    (G + ["--max-context", "0"], "--max-context"),
    (G + ["--new-tokens", "0"], "--new-tokens"),
    (G + ["--batch", "0"], "--batch"),
    (G + ["--seed=-1"], "--seed"),
    (G + ["--chips", ""], "--chips"),
    (G + ["--chips", "0,0"], "--chips"),
    (G + ["--tensor-parallel", "0"], "--tensor-parallel"),
    (G + ["--precision", "fp4"], "--precision"),
    (P + ["--max-chips", "0"], "--max-chips"),
    (P + ["--max-chips", "-1"], "--max-chips"),
    (P + ["--pipeline", "0"], "--pipeline"),
    (P + ["--tensor-parallel", ""], "--tensor-parallel"),
    (P + ["--sram-budget", "0"], "--sram-budget"),
    (P + ["--sram-budget", "nan"], "--sram-budget"),
    (P + ["--sram-budget", "1.5"], "--sram-budget"),
    (P + ["--batches", "0"], "--batches"),
    (P + ["--batches", ""], "--batches"),
    (P + ["--prompt-len", "0"], "--prompt-len"),
    (P + ["--context", "1"], "--context"),
    (P + ["--workers", "-2"], "--workers"),
    (P + ["--slo-tokens-per-s-per-user", "inf"], "--slo-tokens-per-s-per-user"),
    (PROF + ["--max-context", "1"], "--max-context"),
    (PROF + ["--batch", "-1"], "--batch"),
    (["generate"], "--config"),
    ([], "COMMAND"),
]


@pytest.mark.parametrize("argv, flag", PARSER_CASES, ids=[" ".join(a[3:] or a) for a, _ in PARSER_CASES])
def test_a_flag_out_of_range_is_one_line(cfg, capsys, argv, flag):
    refused(capsys, argv, flag)


def _onnx(path):
    path.write_bytes(b"not read: the flags are refused first")
    return str(path)


# Refusals that need the model's sizes or the machine, but no compile.
def _before_compile_cases(tmp_path):
    onnx = _onnx(tmp_path / "m.onnx")
    return [
        (G + ["--prompt-ids", "1,2,400"], ["--prompt-ids", "400", "0..319"]),
        (G + ["--prompt-len", "8", "--new-tokens", "1", "--max-context", "8"], ["--max-context 8", "at least 9"]),
        (G + ["--prompt-len", "8", "--new-tokens", "16", "--max-context", "20"], ["--max-context 20", "at least 23"]),
        (G + ["--batch", "5000"], ["batch 5000 x context", "smaller batch"]),
        (G + ["--batch", "20000", "--max-context", "64"], ["batch 20000 x context 64", "smaller batch"]),
        (G + ["--precision", "fp8"], ["--precision fp8", "tsp"]),
        (G + ["--precision", "fp8", "--system", "groqnode"], ["--precision fp8", "tsp"]),
        (G + ["--chips", "0,1"], ["--chips needs --system"]),
        (G + ["--tensor-parallel", "2"], ["--tensor-parallel needs --system"]),
        (G + ["--prompt-ids", "1", "--prompt-len", "2"], ["--prompt-ids", "--prompt-len"]),
        (P + ["--precision", "fp8"], ["--precision fp8", "tsp"]),
        (P + ["--prompt-len", "256"], ["--prompt-len 256", "--context of 256"]),
        (P + ["--split-layers"], ["--split-layers", "--samples chip"]),
        (PROF + ["--precision", "fp8"], ["--precision fp8", "tsp"]),
        (PROF + ["--inputs", "x.npz"], ["--inputs", "ONNX"]),
        (PROF + ["--input-shapes", "x:1x4"], ["--input-shapes"]),
        (PROF + ["--tuning-log", "logs"], ["--tuning-log"]),
        (PROF + ["--fill-mode", "zeros"], ["--fill-mode"]),
        (["profile", onnx, "-o", "prof", "--max-context", "16"], ["--max-context", "decoder configs"]),
        (["profile", onnx, "-o", "prof", "--batch", "2"], ["--batch"]),
        (["profile", onnx, "-o", "prof", "--precision", "fp8"], ["--precision fp8"]),
    ]


def test_refusals_come_before_any_compile(cfg, tmp_path, capsys, monkeypatch):
    """Each is refused from sizes alone: a compile here would be a bug (and take seconds)."""
    import lpx_tvm.llm.session as session

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before refusing")

    monkeypatch.setattr(session.LLMSession, "__init__", no_compile)
    monkeypatch.setattr("lpx_tvm.llm.system_session.SystemLLMSession.__init__", no_compile)
    for argv, named in _before_compile_cases(tmp_path):
        refused(capsys, argv, *named)
    assert not (tmp_path / "prof").exists()


def test_transformers_notes_on_a_config_are_held_back(cfg, tmp_path, capfd):
    """A scaled-down published config keeps its bos/eos ids, beyond the small vocabulary:
    transformers' notes on them do not come before the error line."""
    (tmp_path / "bos.json").write_text(json.dumps(dict(TINY, bos_token_id=128000, eos_token_id=128001)))
    refused(capfd, ["generate", "--config", "bos.json", "--prompt-ids", "7,320"], "--prompt-ids", "320")


def _digest(path):
    return {p: (path / p).read_bytes() for p in sorted(os.listdir(path))} if path.is_dir() else path.read_bytes()


def _data_loss_cases(tmp_path):
    """(argv, the path the error names, the user's files it must leave as they were)."""
    (tmp_path / "figs").mkdir()
    (tmp_path / "figs" / "a.png").write_bytes(b"\x89PNG the user's")
    (tmp_path / "userdir").mkdir()
    (tmp_path / "userdir" / "trace.json").write_text('{"mine": 1}')
    (tmp_path / "lonely").mkdir()
    (tmp_path / "lonely" / "layers.json").write_text('{"mine": 2}')  # a profile's name, not its contents
    (tmp_path / "notes.txt").write_text("notes")
    (tmp_path / "prog.s").write_text("nop\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "cfg.json").write_text(json.dumps(TINY))
    user = ["cfg.json", "figs", "userdir", "lonely", "notes.txt", "prog.s", "sub"]
    cases = [
        (G + ["--report", "cfg.json"], "--report cfg.json", "is the input"),
        (G + ["--report", "./sub/../cfg.json"], "--report", "is the input"),
        (G + ["--report", "figs"], "--report figs", "is a folder"),
        (G + ["--report", "missing/r.json"], "missing", "does not exist"),
        (G + ["--report", ""], "--report", "empty path"),
        (["generate", "--config", "sub/cfg.json", "--report", "sub"], "--report sub", "is a folder"),
        (P + ["--png", "figs"], "--png figs", "is a folder"),
        (P + ["--png", "name"], "--png name", "ending in .png"),
        (P + ["--png", "x.txt"], "--png x.txt", "ending in .png"),
        (P + ["--png", "cfg.json"], "--png cfg.json", ""),
        (P + ["--report", "cfg.json"], "--report cfg.json", "is the input"),
        (P + ["--report", "r.png", "--png", "r.png"], "r.png", "also the destination"),
        (["profile", "cfg.json", "-o", "userdir"], "-o userdir", "not empty"),
        (["profile", "cfg.json", "-o", "lonely"], "-o lonely", "not empty"),
        (["profile", "cfg.json", "-o", "notes.txt"], "-o notes.txt", "not a folder"),
        (["profile", "sub/cfg.json", "-o", "sub"], "-o sub", "not empty"),
        (["asm", "prog.s", "-o", "prog.s"], "-o prog.s", "is the input"),
        (["disasm", "prog.s", "-o", "prog.s"], "-o prog.s", "is the input"),
        (["run", "prog.s", "--report", "prog.s"], "--report prog.s", "is the input"),
        (["run", "prog.s", "--outputs", "o.npz", "--trace", "o.npz"], "o.npz", "also the destination"),
        (["compile", "cfg.json", "-o", "figs"], "-o figs", "not an LPX artifact"),
        (["compile", "sub/cfg.json", "-o", "sub"], "-o sub", "not an LPX artifact"),
    ]
    return cases, user


def test_no_writer_loses_a_users_file(cfg, tmp_path, capsys):
    cases, user = _data_loss_cases(tmp_path)
    before = {p: _digest(tmp_path / p) for p in user}
    for argv, path, why in cases:
        refused(capsys, argv, path, why)
        assert {p: _digest(tmp_path / p) for p in user} == before, argv
        assert sorted(os.listdir(tmp_path)) == sorted(user), argv  # nothing written beside them


def test_ray_at_an_address_where_nothing_answers_fails_fast(cfg, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.perf_counter()
    refused(capsys, P + ["--ray", f"127.0.0.1:{port}"], f"--ray 127.0.0.1:{port}", "nothing answers")
    assert time.perf_counter() - t < 10
    refused(capsys, P + ["--ray", "no-port"], "--ray no-port", "HOST:PORT")


def test_the_output_policy_keeps_a_writers_own_folder(tmp_path):
    """A folder holding only the files profile writes, as it writes them, is written again;
    the same names with the user's contents are not profile's."""
    ours = holds_only(cli.PROFILE_HEADS)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "trace.json").write_text('{"traceEvents": []}')
    (tmp_path / "p" / "layers.json").write_text(json.dumps({"preset": "tsp"}, indent=1))
    (tmp_path / "p" / "roofline.png").write_bytes(b"\x89PNG\r\n")
    check_outputs([Output("-o", str(tmp_path / "p"), folder=True, ours=ours)])
    (tmp_path / "p" / "layers.json").write_text("{}")
    with pytest.raises(OutputError, match="not empty"):
        check_outputs([Output("-o", str(tmp_path / "p"), folder=True, ours=ours)])
    with pytest.raises(OutputError, match="holds the input"):  # profile's folder, yet the input is in it
        (tmp_path / "p" / "layers.json").write_text(json.dumps({"preset": "tsp"}, indent=1))
        check_outputs([Output("-o", str(tmp_path / "p"), folder=True, ours=ours)],
                      inputs=[str(tmp_path / "p" / "trace.json")])
    check_outputs([Output("-o", str(tmp_path / "new"), folder=True)])  # made by the writer
    check_outputs([Output("--png", str(tmp_path / "f.PNG"), suffix=".png"), Output("--report", None)])


def test_a_hard_link_to_an_input_is_the_input(tmp_path):
    (tmp_path / "cfg.json").write_text("{}")
    os.link(tmp_path / "cfg.json", tmp_path / "alias.json")
    with pytest.raises(OutputError, match="is the input"):
        check_outputs([Output("--report", str(tmp_path / "alias.json"))], inputs=[str(tmp_path / "cfg.json")])


def test_plan_writes_exactly_the_paths_given(cfg, tmp_path, capsys):
    """A plan of one sampled mapping: the figure and the report land where asked, and the
    output says so."""
    argv = P + ["--tensor-parallel", "1", "--pipeline", "1", "--context", "16", "--png", "pareto.png",
                "--report", "plan.json"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "pareto.png" in out and "plan.json" in out
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "plan.json").read_text())["best"]["tensor_parallel"] == 1
    assert sorted(os.listdir(tmp_path)) == ["cfg.json", "pareto.png", "plan.json"]


def test_profile_takes_fp8_where_the_mxm_multiplies_it(cfg, tmp_path, capsys):
    """As generate does: a decoder config's decode step at fp8 on lp30; then the same folder
    again (profile's own files are replaced)."""
    for _ in range(2):
        assert cli.main(PROF + ["--precision", "fp8", "--preset", "lp30", "--max-context", "16"]) == 0, \
            capsys.readouterr().err
    table = json.loads((tmp_path / "prof" / "layers.json").read_text())
    assert table["precision"] == "fp8" and table["preset"] == "lp30" and table["cycles"] > 0
    assert sorted(os.listdir(tmp_path / "prof")) == ["layers.json", "roofline.png", "trace.json"]
