"""docs/reference/environment.md lists every ``DUOTF_*`` variable that duotf's code reads (or
sets for its own processes), and no variable that it does not."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: a variable's whole name: a prefix that ends in "_" (DUOTF_WARM_, of a list of prefixes) is none
NAME = re.compile(r"\bDUOTF_[A-Z0-9]+(?:_[A-Z0-9]+)*\b")


def test_the_page_lists_every_variable_of_the_code_and_no_other():
    code = set()
    for path in (ROOT / "duotf").rglob("*.py"):
        code |= set(NAME.findall(path.read_text()))
    rows = [line for line in (ROOT / "docs" / "reference" / "environment.md").read_text().splitlines()
            if line.startswith("| `DUOTF_")]
    listed = set()
    for row in rows:
        listed |= set(NAME.findall(row.split(" | ")[0]))  # the row's first column
    assert code, "no DUOTF_ variable found in the code: the pattern is wrong"
    assert sorted(code - listed) == [], "read by duotf, missing from the page"
    assert sorted(listed - code) == [], "on the page, read by nothing in duotf"
