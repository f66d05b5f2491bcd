"""The compiler's programs for a fixed set of models are bit-identical to the recorded
ones (tests/program_hashes.py): the compiler's structure may change, its output may not
unless the change is meant and the hashes are regenerated with ``--write``."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import program_hashes  # noqa: E402

with open(program_hashes.GOLDEN) as f:
    GOLDEN = json.load(f)


@pytest.mark.parametrize("name", sorted(program_hashes.MODELS))
def test_programs_are_bit_identical(name):
    assert name in GOLDEN, f"no recorded hashes for {name}: run tests/program_hashes.py --write --only {name}"
    assert program_hashes.compute([name])[name] == GOLDEN[name]
