"""results.csv never holds a cell a spreadsheet would run (issue 53: a trace named =2+5.csv)."""
from __future__ import annotations

from sim.planning.sweep import _cell


def test_formula_cells_are_written_as_text_and_numbers_as_they_are():
    assert _cell("=2+5.csv") == "'=2+5.csv"
    assert _cell("@SUM(A1)") == "'@SUM(A1)" and _cell("+1+1") == "'+1+1" and _cell("-x") == "'-x"
    assert _cell("'=already") == "''=already"  # (an apostrophe of its own is kept, doubled)
    assert _cell(-1.5) == "-1.5" and _cell("-1.5") == "-1.5" and _cell("chunked") == "chunked"
    assert _cell(None) == ""
