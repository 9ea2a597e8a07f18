"""The examples' ``--help`` documents every option and its default."""

from __future__ import annotations

import re

import pytest

from examples.digits import train
from examples.modes import async_ps, averaging, ps_strategy
from examples.pipeline import digits as pipeline


@pytest.mark.parametrize("example", [train, pipeline, ps_strategy, async_ps, averaging],
                         ids=["digits", "pipeline", "ps_strategy", "async_ps", "averaging"])
def test_help_documents_every_option_and_its_default(example, capsys):
    with pytest.raises(SystemExit) as exit_info:
        example.cli(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    # one entry per option: "--name ..." up to the next option
    entries = re.split(r"\n  (?=--)", text.split("options:", 1)[1])[1:]
    names = [entry.split()[0] for entry in entries]
    assert "--workers" in names and "--epochs" in names
    for entry in entries:
        if entry.startswith(("--help", "-h")):
            continue
        words = " ".join(entry.split())
        assert "(default:" in words, f"{entry.split()[0]}: no default in --help"
        assert len(words.split("(default:")[0].split()) > 2, f"{entry.split()[0]}: no help text"
