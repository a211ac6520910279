"""Every registered pass states its contract and has a lit test file named after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mori_compiler.passes import ALL_PASSES

LIT = Path(__file__).resolve().parents[1] / "lit"


@pytest.mark.parametrize("name", sorted(ALL_PASSES))
def test_pass_contract_and_lit_test(name):
    cls = ALL_PASSES[name]()
    doc = cls.__doc__ or ""
    assert cls.name == name
    for word in ("Input", "Output", "Options"):
        assert word in doc, f"pass {name}: docstring lacks '{word}:'"
    assert list(LIT.rglob(f"{name}.mlir")), f"pass {name} has no lit test test/lit/**/{name}.mlir"
