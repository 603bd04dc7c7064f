"""`serve --enable-auto-tool-choice --tool-call-parser NAME`, as vLLM spells them: the parser reads
`auto`'s calls only with both flags; the first without the second, or an unknown parser, stops the
CLI (main() answers the ValueError with exit status 2, before any model is loaded)."""

from __future__ import annotations

import pytest

from actors.cli.main import build_parser
from actors.http.serve_args import options_from_args


def _options(*flags: str):
    return options_from_args(build_parser().parse_args(["serve", *flags]))


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral"])
def test_both_flags_choose_the_parser(parser: str) -> None:
    assert _options("--enable-auto-tool-choice", "--tool-call-parser", parser).tool_call_parser == parser
    assert _options("--tool-call-parser", parser).tool_call_parser is None  # auto stays off, as in vLLM
    assert _options().tool_call_parser is None


def test_flags_that_do_not_go_together_stop_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="--enable-auto-tool-choice requires --tool-call-parser"):
        _options("--enable-auto-tool-choice")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--tool-call-parser", "pythonic-guess"])
    assert "invalid choice" in capsys.readouterr().err
