"""Usage errors of the command lines: one line that says how to fix it."""

from __future__ import annotations

import pytest

from pepsi_dispatch.cli import dispatch as cli
from pepsi_dispatch.cli import queue as queue_cli


def test_global_option_after_serve_says_where_it_goes(capsys: pytest.CaptureFixture) -> None:
    # The internal-error line says "run with -L DEBUG": typed after serve, click
    # only answered "No such option '-L'".
    assert cli.main(["serve", "-L", "DEBUG"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "pepsi-dispatch: error: -L is not an option of 'serve' but a global one:"
        " give it before 'serve' (see 'pepsi-dispatch -h')\n"
    )


def test_queue_config_option_after_the_command(capsys: pytest.CaptureFixture) -> None:
    assert queue_cli.main(["status", "--config", "/x.conf"]) == 2
    err = capsys.readouterr().err
    assert "--config is not an option of 'status' but a global one" in err, err
    assert "Did you mean" not in err


def test_unknown_option_has_no_such_hint(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["serve", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert "No such option" in err and "global one" not in err
