"""The generic INI reader under pepsi.conf (pepsi_dispatch.config.ini), without pepsi's schema.

test_config.py checks the same behaviour through load_config; these pin the reader's
own interface: what it stores, where it says a value came from, how it expands.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pepsi_dispatch.config.ini import (
    BadValue,
    ConfigError,
    Ini,
    error,
    expand,
    expand_sections,
    merge_rows,
    read_file,
    strip_value,
    suggest,
)


def read(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Ini:
    path = tmp_path / "t.conf"
    path.write_text(text)
    ini = Ini()
    read_file(path, ini, env or {})
    return ini


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("  plain  ", "plain"),
        ("a # comment", "a"),
        ("a#not-a-comment", "a#not-a-comment"),
        ('"quoted # kept"', "quoted # kept"),
        ('"quoted"   # comment', "quoted"),
        ('"half" quoted', '"half" quoted'),
        ("# only a comment", ""),
        ("", ""),
    ],
)
def test_strip_value(raw: str, value: str) -> None:
    assert strip_value(raw) == value


def test_sections_options_names_and_origins(tmp_path: Path) -> None:
    ini = read(tmp_path, "# top\n[Stage-Foo]  # header comment\nprogram = /x\n\n; c\nNext=a b\n")
    assert ini.sections == {"stage-foo": {"PROGRAM": "/x", "NEXT": "a b"}}
    assert ini.names == {"stage-foo": "Stage-Foo"}
    path = tmp_path / "t.conf"
    assert ini.origins == {
        ("stage-foo", ""): f"{path}:2",
        ("stage-foo", "PROGRAM"): f"{path}:3",
        ("stage-foo", "NEXT"): f"{path}:6",
    }


def test_later_value_wins_first_spelling_and_header_stay(tmp_path: Path) -> None:
    ini = read(tmp_path, "[A]\nX = 1\n[b]\nY = 2\n[a]\nX = 3\n")
    assert ini.sections == {"a": {"X": "3"}, "b": {"Y": "2"}}
    assert ini.names["a"] == "A"
    assert ini.origins[("a", "")].endswith(":1")
    assert ini.origins[("a", "X")].endswith(":6")


def test_values_are_stored_unexpanded(tmp_path: Path) -> None:
    ini = read(tmp_path, "[paths]\nP = $HOME/p\n")
    assert ini.sections["paths"]["P"] == "$HOME/p"


def test_inline_reads_relative_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inc.conf").write_text("[inc]\nA = 1\n")
    ini = read(tmp_path, "[PATHS]\nD = sub\n[main]\n@inline@ ${D}/inc.conf\n[main]\nB = 2\n")
    assert ini.sections["inc"] == {"A": "1"}
    assert ini.sections["main"] == {"B": "2"}
    assert ini.origins[("inc", "A")] == f"{tmp_path / 'sub' / 'inc.conf'}:2"


def test_inline_ends_the_section(tmp_path: Path) -> None:
    (tmp_path / "inc.conf").write_text("[inc]\nA = 1\n")
    with pytest.raises(ConfigError, match=r"t\.conf:3: option B outside any section"):
        read(tmp_path, "[main]\n@INLINE@ inc.conf\nB = 2\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[a\n", "t.conf:1: bad section header '[a'; write it as [name]"),
        ("\n[ ]\n", "t.conf:2: empty section name '[]'; write it as [name]"),
        ("[a]\njunk\n", "t.conf:2: cannot parse line 'junk'; expected KEY = value, [section] or"),
        ("[a]\n = 1\n", "t.conf:2: missing option name in '= 1'; expected KEY = value"),
        ("x = 1\n", "t.conf:1: option X outside any section; put it under a [section] header"),
        ("@INLINE@\n", "t.conf:1: @INLINE@ needs a file name"),
        ("@INLINE@ $NOPE\n", "t.conf:1: @INLINE@ $NOPE: undefined variable $NOPE;"),
        ("@INLINE@ none.conf\n", "t.conf:1: @INLINE@ file '"),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        read(tmp_path, text)
    assert str(info.value).startswith(f"{tmp_path}/{message}")


def test_self_inclusion_is_bounded(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="@INLINE@ nested too deeply"):
        read(tmp_path, "@INLINE@ t.conf\n")


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.conf"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"bad\.conf: cannot read configuration file: .*;"):
        read_file(path, Ini(), {})
    with pytest.raises(ConfigError, match="does not exist; check the path"):
        read_file(tmp_path / "missing.conf", Ini(), {})


PATHS = {
    "HOME": "/srv",
    "P": "$HOME/p",
    "SELF": "${SELF:-dflt}",
    "LOOP": "$LOOP2",
    "LOOP2": "$LOOP",
}


@pytest.mark.parametrize(
    ("value", "expanded"),
    [
        ("no references", "no references"),
        ("$HOME/x", "/srv/x"),  # [PATHS] before the environment
        ("${home}/x", "/srv/x"),  # [PATHS] names are case-insensitive
        ("$P", "/srv/p"),
        ("$USER", "env-user"),
        ("${EMPTY:-d}|${USER:-d}|${NONE:-$HOME}", "d|env-user|/srv"),
        ("${EMPTY}", ""),
        ("$$HOME costs $5, $", "$HOME costs $5, $"),
        ("$SELF", "dflt"),  # inside [PATHS] SELF, $SELF is the environment's
    ],
)
def test_expand(value: str, expanded: str) -> None:
    assert expand(value, PATHS, {"USER": "env-user", "EMPTY": ""}) == expanded


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("$NONE", "undefined variable $NONE; define it in [PATHS] or the environment, or write"),
        ("${NONE}", "undefined variable $NONE;"),
        ("${HOME", "unclosed '${'; write ${NAME} or ${NAME:-default}"),
        ("${1x}", "bad variable reference '${1x}'; write ${NAME} or ${NAME:-default}"),
        ("$LOOP", "undefined variable $LOOP;"),  # LOOP -> LOOP2 -> environment's LOOP
    ],
)
def test_expand_rejects(value: str, message: str) -> None:
    with pytest.raises(BadValue) as info:
        expand(value, PATHS, {})
    assert str(info.value).startswith(message)


def test_expansion_depth_is_bounded() -> None:
    deep = "${A:-" * 40 + "x" + "}" * 40
    with pytest.raises(BadValue, match="nested too deeply"):
        expand(deep, {}, {})


def test_expanded_paths_are_used_as_they_are() -> None:
    assert expand("$P", {"P": "$$literal"}, {}, expanded_paths=True) == "$$literal"
    assert expand("$P", {"P": "$$literal"}, {}) == "$literal"


def test_expand_sections_strict_and_lenient(tmp_path: Path) -> None:
    ini = read(tmp_path, "[paths]\nP = /p\n[ours]\nA = $P/a\n[theirs]\nB = $NONE\n")
    out = expand_sections(ini, {}, lambda sec: sec == "ours")
    assert out == {"paths": {"P": "/p"}, "ours": {"A": "/p/a"}, "theirs": {"B": "$NONE"}}
    with pytest.raises(ConfigError) as info:
        expand_sections(ini, {}, lambda sec: True)
    assert str(info.value) == (
        f"{tmp_path}/t.conf:6: [theirs] B = '$NONE': undefined variable $NONE; define it in"
        " [PATHS] or the environment, or write ${NONE:-default}"
    )


def test_merge_rows() -> None:
    ini = Ini(
        sections={"paths": {"P": "/p"}, "s-a": {"X": "1"}},
        names={"s-a": "S-A"},
        origins={("s-a", ""): "f:1", ("s-a", "X"): "f:2"},
    )
    rows = [("S-A", "x", " $P/2 "), ("s-New", "y", "3"), ("other", "", None)]
    merge_rows(ini, rows, "the db", lambda sec: sec.startswith("s-"), {})
    assert ini.sections["s-a"] == {"X": "/p/2"}
    assert ini.sections["s-new"] == {"Y": "3"}
    assert ini.names == {"s-a": "S-A", "s-new": "s-New"}
    assert ini.origins[("s-a", "")] == "f:1"
    assert ini.origins[("s-a", "X")] == "the db"
    assert ini.origins[("s-new", "")] == "the db"
    assert "other" not in ini.sections


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (("s-a", " ", "1"), "the db: [s-a]: empty option name; delete the row"),
        (("s-a", "x", None), "the db: [s-a] X: value is NULL; set a value or delete the row"),
        (("s-a", "x", "$NO"), "the db: [s-a] X = '$NO': undefined variable $NO;"),
    ],
)
def test_merge_rows_rejects(row: tuple[str, str, str | None], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        merge_rows(Ini(), [row], "the db", lambda sec: True, {})
    assert str(info.value).startswith(message)


def test_error_format() -> None:
    assert str(error("what; fix")) == "what; fix"
    assert str(error("what", "f:3")) == "f:3: what"
    assert str(error("what", "f:3", "sec")) == "f:3: [sec]: what"
    assert str(error("what", None, "sec", "OPT")) == "[sec] OPT: what"
    assert str(error("a\nb", "f:3", "sec", "OPT", "v")) == "f:3: [sec] OPT = 'v': a b"


def test_suggest() -> None:
    assert suggest("MAX_RUNTIM", ["MAX_RUNTIME", "EXPIRY"]) == "did you mean MAX_RUNTIME?"
    assert suggest("expiry", ["MAX_RUNTIME", "EXPIRY"], quote="'") == "did you mean 'EXPIRY'?"
    assert suggest("zzz", ["MAX_RUNTIME"]) == ""
