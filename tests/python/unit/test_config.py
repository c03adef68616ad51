"""pepsi.conf parsing, expansion, search order, stage graph and database overlay (no database)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from pepsi_dispatch.config import (
    DEFAULT_DSN,
    OVERLAY_ORIGIN,
    ConfigError,
    DispatchConfig,
    StageConfig,
    apply_overlay,
    find_config,
    load_config,
    parse_bool,
    parse_time,
    reread_config,
)
from pepsi_dispatch.config import load as cfg
from pepsi_dispatch.coordinator.checks import searched_locations
from pepsi_dispatch.errors import UsageError

Write = Callable[..., Path]


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No PEPSI_* variables, an empty HOME and a SYSTEM_CONFIG that does not exist."""
    for var in ("PEPSI_CONFIG", "PEPSI_DSN", "PEPSI_X", "PEPSI_Y"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(cfg, "SYSTEM_CONFIG", tmp_path / "etc" / "pepsi.conf")
    return home


@pytest.fixture
def write(tmp_path: Path) -> Write:
    """Write a config file and return its path."""

    def _write(text: str, name: str = "pepsi.conf") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return _write


def error_of(fn: Callable[[], object]) -> str:
    """The one-line message of the ConfigError fn raises."""
    with pytest.raises(ConfigError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500 ms", 0.5),
        ("500ms", 0.5),
        ("30 s", 30),
        ("30 sec", 30),
        ("5 min", 300),
        ("5 minutes", 300),
        ("24 h", 86400),
        ("2 d", 172800),
        ("1 week", 604800),
        ("250 us", 0.00025),
        ("1 min 30 s", 90),
        ("1 s 500 ms", 1.5),
        ("1.5 h", 5400),
        ("  45  ", 45),
        ("0", 0),
        ("0.25", 0.25),
        ("2 D", 172800),
    ],
)
def test_parse_time(text: str, seconds: float) -> None:
    assert parse_time(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "  ", "-5 s", "5 parsecs", "s", "1 s 500", "five s", "nan", "inf", "5 m", "1,5 s"]
)
def test_parse_time_rejects(text: str) -> None:
    msg = error_of(lambda: parse_time(text))
    assert "e.g. '500 ms'" in msg


def test_parse_time_bounds() -> None:
    assert parse_time("36500 d") == 36500 * 86400
    assert parse_time("24 d") == 24 * 86400
    assert "too long" in error_of(lambda: parse_time("36500 d 1 s"))


def test_long_times_that_are_allowed(write: Write) -> None:
    c = load_config(write("[pepsi-dispatch]\nPOLL_INTERVAL = 24 d\nEXPIRY = 3650 d\n"))
    assert (c.dispatch.poll_interval, c.dispatch.expiry) == (24 * 86400, 3650 * 86400)


def test_parse_time_names_unknown_unit() -> None:
    assert "unknown time unit 'parsecs'" in error_of(lambda: parse_time("5 parsecs"))


@pytest.mark.parametrize("text", ["YES", "yes", "True", "1", "on", "ON"])
def test_parse_bool_true(text: str) -> None:
    assert parse_bool(text) is True


@pytest.mark.parametrize("text", ["NO", "no", "False", "0", "off"])
def test_parse_bool_false(text: str) -> None:
    assert parse_bool(text) is False


def test_parse_bool_rejects() -> None:
    assert "use YES or NO" in error_of(lambda: parse_bool("maybe"))


def test_config_error_is_usage_error_and_value_error() -> None:
    assert issubclass(ConfigError, UsageError)
    assert issubclass(ConfigError, ValueError)


# --------------------------------------------------------------------------- defaults, options


def test_built_in_defaults_without_any_file() -> None:
    c = load_config()
    assert c.path is None
    assert c.dsn == DEFAULT_DSN == "postgresql:///pepsi"
    assert c.dispatch == DispatchConfig()
    assert c.stages == {}
    d = c.dispatch
    assert (d.max_runtime, d.worker_idle_timeout, d.poll_interval, d.stats_interval) == (
        300,
        5,
        30,
        60,
    )
    assert (d.db_pool_size, d.config_file, d.service_user, d.shutdown_timeout) == (
        8,
        None,
        "pepsi",
        10,
    )
    assert (d.expiry, d.competing, d.orphan_timeout, d.retention) == (86400, False, 300, 604800)


def test_every_dispatch_option(write: Write) -> None:
    path = write(
        """
[pepsi-dispatch]
MAX_RUNTIME = 2 min
WORKER_IDLE_TIMEOUT = 500 ms
POLL_INTERVAL = 10
STATS_INTERVAL = 1 h
DB_POOL_SIZE = 3
CONFIG_FILE = /etc/pepsi/workers.conf
SERVICE_USER = svc
SHUTDOWN_TIMEOUT = 0
EXPIRY = 2 d
COMPETING = yes
ORPHAN_TIMEOUT = 90 s
RETENTION = 0
"""
    )
    d = load_config(path).dispatch
    assert d == DispatchConfig(
        max_runtime=120,
        worker_idle_timeout=0.5,
        poll_interval=10,
        stats_interval=3600,
        db_pool_size=3,
        config_file="/etc/pepsi/workers.conf",
        service_user="svc",
        shutdown_timeout=0,
        expiry=172800,
        competing=True,
        orphan_timeout=90,
        retention=0,
    )


def test_empty_config_file_option_means_none(write: Write) -> None:
    assert load_config(write("[pepsi-dispatch]\nCONFIG_FILE =\n")).dispatch.config_file is None


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("MAX_RUNTIME", "0", "greater than 0"),
        ("POLL_INTERVAL", "0 s", "greater than 0"),
        ("EXPIRY", "soon", "not a time value"),
        ("MAX_RUNTIME", "5 mins please", "not a time value"),
        ("MAX_RUNTIME", "5 lightyears", "unknown time unit"),
        # Past these, serve died of an internal error (exit 1) at run time.
        ("POLL_INTERVAL", "30 d", "too long; at most 24 d"),
        ("EXPIRY", "99999999999999 d", "too long; at most 36500 d"),
        ("RETENTION", "9" * 400, "too long"),
        ("DB_POOL_SIZE", "0", "must be positive"),
        ("DB_POOL_SIZE", "8.5", "not a whole number"),
        ("DB_POOL_SIZE", "-1", "must be positive; use an integer from 1 to"),
        ("COMPETING", "perhaps", "not a boolean"),
        ("SERVICE_USER", "", "must not be empty"),
    ],
)
def test_bad_dispatch_values(write: Write, option: str, value: str, fragment: str) -> None:
    path = write(f"# header\n[pepsi-dispatch]\n{option} = {value}\n")
    msg = error_of(lambda: load_config(path))
    assert msg.startswith(f"{path}:3: [pepsi-dispatch] {option} = '{value}': ")
    assert fragment in msg


def test_unknown_dispatch_option_suggests(write: Write) -> None:
    path = write("[pepsi-dispatch]\nMAX_RUNTIMES = 5 s\n")
    msg = error_of(lambda: load_config(path))
    assert msg == (
        f"{path}:2: [pepsi-dispatch] MAX_RUNTIMES = '5 s': unknown option; "
        "did you mean MAX_RUNTIME?"
    )


def test_unknown_option_without_close_match_lists_known(write: Write) -> None:
    msg = error_of(lambda: load_config(write("[stage-a]\nPROGRAM = x\nZZZ = 1\n")))
    assert "unknown option; known options: PROGRAM, NEXT" in msg


def test_other_sections_are_kept_not_validated(write: Write) -> None:
    c = load_config(write("[pepsi-httpd]\nPORT = 8080\nWHATEVER = $UNDEFINED_PEPSI_VAR\n"))
    assert c.sections["pepsi-httpd"] == {"PORT": "8080", "WHATEVER": "$UNDEFINED_PEPSI_VAR"}


@pytest.mark.parametrize(
    ("header", "fragment"),
    [
        ("[pepsi-dispach]", "did you mean [pepsi-dispatch]?"),
        ("[databse]", "did you mean [database]?"),
        ("[stage_resize]", "stage sections are named [stage-resize]"),
        ("[stages-resize]", "stage sections are named [stage-resize]"),
        ("[Stage_Resize]", "stage sections are named [stage-Resize]"),
        ("[stage]", "stage sections are named [stage-NAME]"),
    ],
)
def test_misspelt_section(write: Write, header: str, fragment: str) -> None:
    path = write(f"{header}\nX = 1\n")
    msg = error_of(lambda: load_config(path))
    assert msg.startswith(f"{path}:1: {header}: ")
    assert fragment in msg


# --------------------------------------------------------------------------- syntax


def test_comments_quotes_and_case(write: Write) -> None:
    path = write(
        """# full-line comment
; also a comment
   # indented comment
[PEPSI-Dispatch]
service_user = alice   # trailing comment
Config_File = /a#b
[Database]
dsn = "host=/tmp dbname=x # not a comment"   # but this is
[paths]
empty = # nothing
"""
    )
    c = load_config(path)
    assert c.dispatch.service_user == "alice"
    assert c.dispatch.config_file == "/a#b"
    assert c.dsn == "host=/tmp dbname=x # not a comment"
    assert c.sections["paths"]["EMPTY"] == ""
    assert set(c.sections) == {"pepsi-dispatch", "database", "paths"}


def test_section_header_with_comment(write: Write) -> None:
    c = load_config(write("[stage-a]   # the first stage\nPROGRAM = a\n"))
    assert list(c.stages) == ["a"]


def test_unused_paths_entry_may_be_undefined(write: Write) -> None:
    c = load_config(write("[PATHS]\nOTHER = $PEPSI_X/other\n[stage-a]\nPROGRAM = a\n"))
    assert c.sections["paths"]["OTHER"] == "$PEPSI_X/other"


def test_later_value_wins_and_sections_merge(write: Write) -> None:
    c = load_config(
        write("[pepsi-dispatch]\nDB_POOL_SIZE = 2\n[PEPSI-DISPATCH]\ndb_pool_size = 5\n")
    )
    assert c.dispatch.db_pool_size == 5


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("KEY = 1\n", 1, "outside any section"),
        ("[pepsi-dispatch]\njust words\n", 2, "expected KEY = value"),
        ("[pepsi-dispatch\n", 1, "bad section header"),
        ("[]\n", 1, "empty section name"),
        ("[pepsi-dispatch]\n= 5\n", 2, "missing option name"),
    ],
)
def test_syntax_errors_name_the_line(write: Write, text: str, line: int, fragment: str) -> None:
    path = write(text)
    msg = error_of(lambda: load_config(path))
    assert msg.startswith(f"{path}:{line}: ")
    assert fragment in msg


def test_inline_includes_relative_file(write: Write) -> None:
    write("[stage-b]\nPROGRAM = /bin/b\n", "conf.d/b.conf")
    path = write("[stage-a]\nPROGRAM = /bin/a\nNEXT = b\n@INLINE@ conf.d/b.conf\n")
    assert list(load_config(path).stages) == ["a", "b"]


def test_inline_missing_file(write: Write) -> None:
    path = write("@INLINE@ nope.conf\n")
    assert "@INLINE@ file" in error_of(lambda: load_config(path))


def test_inline_self_inclusion_is_bounded(write: Write) -> None:
    path = write("@INLINE@ pepsi.conf\n")
    assert "nested too deeply" in error_of(lambda: load_config(path))


# --------------------------------------------------------------------------- expansion


def test_expansion_from_paths_and_environment(
    write: Write, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PEPSI_X", "/from/env")
    monkeypatch.setenv("BINDIR", "/env/bin")
    path = write(
        """
[PATHS]
ROOT = ${PEPSI_Y:-/opt/pepsi}
BINDIR = $ROOT/bin
[pepsi-dispatch]
CONFIG_FILE = ${PEPSI_X}/w.conf
SERVICE_USER = u$$er
[stage-a]
PROGRAM = $BINDIR/a
[stage-b]
PROGRAM = ${bindir}/b
[stage-c]
PROGRAM = ${NOT_SET_ANYWHERE:-$ROOT/c}
[stage-d]
PROGRAM = /price/$5
"""
    )
    c = load_config(path)
    assert c.dispatch.config_file == "/from/env/w.conf"
    assert c.dispatch.service_user == "u$er"
    assert c.stages["a"].program == "/opt/pepsi/bin/a"  # [PATHS] beats the environment
    assert c.stages["b"].program == "/opt/pepsi/bin/b"  # [PATHS] names are case-insensitive
    assert c.stages["c"].program == "/opt/pepsi/c"  # default, itself expanded
    assert c.stages["d"].program == "/price/$5"  # '$' not followed by a name stays
    assert c.sections["paths"]["BINDIR"] == "/opt/pepsi/bin"


def test_default_applies_to_empty_variable(write: Write, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEPSI_Y", "")
    c = load_config(write("[pepsi-dispatch]\nSERVICE_USER = ${PEPSI_Y:-fallback}\n"))
    assert c.dispatch.service_user == "fallback"


def test_set_variable_beats_default(write: Write, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEPSI_Y", "given")
    c = load_config(write("[pepsi-dispatch]\nSERVICE_USER = ${PEPSI_Y:-fallback}\n"))
    assert c.dispatch.service_user == "given"


def test_undefined_variable(write: Write) -> None:
    path = write("[stage-a]\nPROGRAM = $PEPSI_X/bin/a\n")
    msg = error_of(lambda: load_config(path))
    assert msg.startswith(f"{path}:2: [stage-a] PROGRAM = '$PEPSI_X/bin/a': undefined variable")
    assert "${PEPSI_X:-default}" in msg


def test_recursive_paths_fall_back_to_the_environment(write: Write) -> None:
    path = write("[PATHS]\nA = $B\nB = ${A}\n[stage-a]\nPROGRAM = $A\n")
    assert "undefined variable $A" in error_of(lambda: load_config(path))


def test_paths_entry_defaulting_to_its_environment_variable(
    write: Write, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write("[PATHS]\nPEPSI_X = ${PEPSI_X:-/srv}\n[stage-a]\nPROGRAM = $PEPSI_X/a\n")
    assert load_config(path).stages["a"].program == "/srv/a"
    monkeypatch.setenv("PEPSI_X", "/opt")
    assert load_config(path).stages["a"].program == "/opt/a"


def test_expansion_depth_is_bounded(write: Write) -> None:
    chain = "".join(f"V{i} = $V{i + 1}\n" for i in range(40))
    path = write(f"[PATHS]\n{chain}V40 = end\n[stage-a]\nPROGRAM = $V0\n")
    assert "nested too deeply" in error_of(lambda: load_config(path))


def test_unclosed_brace(write: Write) -> None:
    assert "unclosed" in error_of(lambda: load_config(write("[stage-a]\nPROGRAM = ${X\n")))


def test_bad_variable_reference(write: Write) -> None:
    msg = error_of(lambda: load_config(write("[stage-a]\nPROGRAM = ${1X}\n")))
    assert "bad variable reference" in msg


# --------------------------------------------------------------------------- search order


def test_search_order(write: Write, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config().path is None  # nothing anywhere: built-in defaults
    system = write("[pepsi-dispatch]\nSERVICE_USER = system\n", "system/pepsi.conf")
    monkeypatch.setattr(cfg, "SYSTEM_CONFIG", system)
    assert load_config().dispatch.service_user == "system"
    user = isolated / ".config" / "pepsi.conf"
    user.parent.mkdir()
    user.write_text("[pepsi-dispatch]\nSERVICE_USER = user\n")
    assert load_config().dispatch.service_user == "user"
    env = write("[pepsi-dispatch]\nSERVICE_USER = env\n", "env.conf")
    monkeypatch.setenv("PEPSI_CONFIG", str(env))
    assert load_config().dispatch.service_user == "env"
    explicit = write("[pepsi-dispatch]\nSERVICE_USER = explicit\n", "explicit.conf")
    c = load_config(str(explicit))
    assert c.dispatch.service_user == "explicit"
    assert c.path == explicit
    assert find_config(explicit) == explicit


def test_searched_file_the_user_cannot_read_is_skipped(
    write: Write, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment's /etc/pepsi.conf (0640 root:pepsi) is not for people: their
    pepsi-queue runs on the defaults and PEPSI_DSN; named explicitly, it is an error."""
    system = write("[pepsi-dispatch]\nSERVICE_USER = system\n", "system/pepsi.conf")
    monkeypatch.setattr(cfg, "SYSTEM_CONFIG", system)
    monkeypatch.setattr(cfg, "readable", lambda path: path != system)
    assert find_config() is None
    assert load_config().dispatch.service_user != "system"
    assert searched_locations()[-1] == f"{system} (not readable by this user)"
    assert find_config(system) == system  # -c: read (and any error reported) as given


def test_relative_path_is_made_absolute(write: Write, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write("[stage-a]\nPROGRAM = a\n")
    monkeypatch.chdir(path.parent)
    assert load_config("pepsi.conf").path == path


def test_explicit_path_must_exist(tmp_path: Path) -> None:
    missing = tmp_path / "missing.conf"
    msg = error_of(lambda: load_config(str(missing)))
    assert msg.startswith(f"{missing}: configuration file does not exist (given by -c)")


def test_pepsi_config_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEPSI_CONFIG", str(tmp_path / "nope.conf"))
    assert "given by $PEPSI_CONFIG" in error_of(load_config)


def test_directory_is_not_a_config_file(tmp_path: Path) -> None:
    assert "not a regular file" in error_of(lambda: load_config(str(tmp_path)))


# --------------------------------------------------------------------------- database


def test_dsn_from_file_and_environment(write: Write, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write("[database]\nDSN = postgresql://db.example/pepsi\n")
    assert load_config(path).dsn == "postgresql://db.example/pepsi"
    monkeypatch.setenv("PEPSI_DSN", "")
    assert load_config(path).dsn == "postgresql://db.example/pepsi"  # empty = unset
    monkeypatch.setenv("PEPSI_DSN", "host=/run/pg dbname=other")
    assert load_config(path).dsn == "host=/run/pg dbname=other"
    assert load_config().dsn == "host=/run/pg dbname=other"


def test_dsn_typo_is_an_error(write: Write) -> None:
    msg = error_of(lambda: load_config(write("[database]\nDNS = postgresql:///x\n")))
    assert "[database] DNS = 'postgresql:///x': unknown option; did you mean DSN?" in msg


def test_empty_dsn_is_an_error(write: Write) -> None:
    assert "empty DSN" in error_of(lambda: load_config(write("[database]\nDSN =\n")))


# --------------------------------------------------------------------------- stages


def test_stage_defaults_and_values(write: Write) -> None:
    c = load_config(
        write(
            """
[stage-Fetch.v2]
PROGRAM = /bin/fetch
NEXT = resize  store resize
[stage-resize]
PROGRAM = resize-prog
PARALLELISM = 8
QUEUE_LIMIT = 16
MAX_MESSAGES = 1
MAX_RETRIES = 0
NEXT = store
[stage-store]
PROGRAM = /bin/store
NEXT =
"""
        )
    )
    assert list(c.stages) == ["Fetch.v2", "resize", "store"]
    assert c.stages["Fetch.v2"] == StageConfig(
        name="Fetch.v2", program="/bin/fetch", next=("resize", "store")
    )
    assert c.stages["resize"] == StageConfig(
        name="resize",
        program="resize-prog",
        next=("store",),
        parallelism=8,
        queue_limit=16,
        max_messages=1,
        max_retries=0,
    )
    assert c.stages["store"].next == ()
    assert c.sections["stage-fetch.v2"]["PROGRAM"] == "/bin/fetch"


def test_missing_program(write: Write) -> None:
    path = write("[stage-a]\nPROGRAM = /bin/a\n\n[stage-b]\nNEXT = a\n")
    msg = error_of(lambda: load_config(path))
    assert msg == f"{path}:4: [stage-b]: PROGRAM is missing; add PROGRAM = /path/to/stage-program"


def test_unknown_next_with_suggestion(write: Write) -> None:
    path = write("[stage-resize]\nPROGRAM = r\n[stage-fetch]\nPROGRAM = f\nNEXT = resise\n")
    msg = error_of(lambda: load_config(path))
    assert msg.startswith(
        f"{path}:5: [stage-fetch] NEXT = 'resise': NEXT names undefined stage 'resise'; "
        "did you mean 'resize'?"
    )


def test_unknown_next_differing_in_case(write: Write) -> None:
    path = write("[stage-Resize]\nPROGRAM = r\n[stage-fetch]\nPROGRAM = f\nNEXT = resize\n")
    assert "did you mean 'Resize'?" in error_of(lambda: load_config(path))


def test_next_with_commas_is_rejected(write: Write) -> None:
    path = write("[stage-a]\nPROGRAM = a\nNEXT = b, c\n[stage-b]\nPROGRAM = b\n")
    assert "bad stage name 'b,'" in error_of(lambda: load_config(path))


@pytest.mark.parametrize("name", ["a/b", "a b", "", "ä"])
def test_bad_stage_name(write: Write, name: str) -> None:
    path = write(f"[stage-{name}]\nPROGRAM = x\n")
    msg = error_of(lambda: load_config(path))
    assert msg.startswith(f"{path}:1: [stage-{name}]: bad stage name '{name}'")


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("PARALLELISM", "0", "must be positive"),
        ("QUEUE_LIMIT", "-1", "must be positive"),
        ("MAX_MESSAGES", "0", "must be positive"),
        ("MAX_MESSAGES", "many", "not a whole number"),
        ("MAX_RETRIES", "-1", "must be >= 0; use an integer from 0 to 2147483647"),
        ("MAX_RETRIES", "2147483648", "out of range; use an integer from 0 to 2147483647"),
        ("PARALLELISM", "9" * 5000, "out of range"),
        ("RETRY_DELAY", "99999999999999 d", "too long; at most 36500 d"),
        ("RETRY_DELAY_MAX", "36501 d", "too long"),
        ("PROGRAM", "", "must not be empty"),
    ],
)
def test_bad_stage_numbers(write: Write, option: str, value: str, fragment: str) -> None:
    path = write(f"[stage-a]\nPROGRAM = /bin/a\n{option} = {value}\n")
    msg = error_of(lambda: load_config(path))
    assert msg.startswith(f"{path}:3: [stage-a] {option} = '{value}': ")
    assert fragment in msg


def test_stage_option_typo(write: Write) -> None:
    path = write("[stage-a]\nPROGRAM = /bin/a\nPARALELISM = 2\n")
    assert error_of(lambda: load_config(path)) == (
        f"{path}:3: [stage-a] PARALELISM = '2': unknown option; did you mean PARALLELISM?"
    )


def test_self_loop_is_allowed(write: Write) -> None:
    c = load_config(write("[stage-a]\nPROGRAM = a\nNEXT = a\n"))
    assert c.stages["a"].next == ("a",)


def test_error_format_matches_contract(write: Write) -> None:
    path = write("[stage-a]\nPROGRAM = a\nQUEUE_LIMIT = 0\n")
    msg = error_of(lambda: load_config(path))
    assert re.fullmatch(r".+:\d+: \[stage-a\] QUEUE_LIMIT = '0': [^;]+; .+", msg)


def test_min_workers_default_and_value(write: Write) -> None:
    c = load_config(write("[stage-a]\nPROGRAM = a\n[stage-b]\nPROGRAM = b\nMIN_WORKERS = 2\n"))
    assert c.stages["a"].min_workers == 0  # on demand only, as before
    assert c.stages["b"].min_workers == 2
    four = load_config(write("[stage-a]\nPROGRAM = a\nPARALLELISM = 4\nMIN_WORKERS = 4\n"))
    assert four.stages["a"].min_workers == 4  # all of PARALLELISM may be kept warm


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("-1", "must be >= 0; use an integer from 0 to 2147483647"),
        ("-0", "must be >= 0; use an integer from 0 to 2147483647"),
        ("two", "not a whole number; use an integer from 0 to 2147483647"),
        ("1.5", "not a whole number"),
        ("", "not a whole number"),
    ],
)
def test_bad_min_workers(write: Write, value: str, fragment: str) -> None:
    path = write(f"[stage-a]\nPROGRAM = /bin/a\nMIN_WORKERS = {value}\n")
    msg = error_of(lambda: load_config(path))
    assert msg.startswith(f"{path}:3: [stage-a] MIN_WORKERS = '{value}': ")
    assert fragment in msg


def test_min_workers_above_parallelism(write: Write) -> None:
    path = write("[stage-a]\nPROGRAM = /bin/a\nPARALLELISM = 2\nMIN_WORKERS = 3\n")
    assert error_of(lambda: load_config(path)) == (
        f"{path}:4: [stage-a] MIN_WORKERS = '3': MIN_WORKERS (3) is above PARALLELISM (2);"
        " use at most 2, or raise PARALLELISM"
    )
    # against the default PARALLELISM (4) too
    path = write("[stage-a]\nPROGRAM = /bin/a\nMIN_WORKERS = 5\n")
    assert "MIN_WORKERS (5) is above PARALLELISM (4)" in error_of(lambda: load_config(path))


def test_overlay_lowering_parallelism_below_min_workers_is_refused(write: Write) -> None:
    c = load_config(write("[stage-a]\nPROGRAM = a\nPARALLELISM = 3\nMIN_WORKERS = 3\n"))
    msg = error_of(lambda: apply_overlay(c, [("stage-a", "PARALLELISM", "2")]))
    assert "[stage-a] MIN_WORKERS = '3': MIN_WORKERS (3) is above PARALLELISM (2)" in msg
    assert apply_overlay(c, [("stage-a", "MIN_WORKERS", "1")]).stages["a"].min_workers == 1


# --------------------------------------------------------------------------- overlay


@pytest.fixture
def base(write: Write) -> cfg.Config:
    return load_config(
        write(
            """
[PATHS]
BIN = /opt/bin
[pepsi-dispatch]
MAX_RUNTIME = 10 s
[stage-Fetch]
PROGRAM = $BIN/fetch
NEXT = store
[stage-store]
PROGRAM = $BIN/store
"""
        )
    )


def test_overlay_overrides_and_adds(base: cfg.Config) -> None:
    new = apply_overlay(
        base,
        [
            ("stage-fetch", "parallelism", "9"),  # case-insensitive section and option
            ("stage-store", "NEXT", "index"),
            ("stage-index", "PROGRAM", "$BIN/index"),
            ("stage-index", "MAX_RETRIES", "2"),
        ],
    )
    assert list(new.stages) == ["Fetch", "store", "index"]
    assert new.stages["Fetch"].parallelism == 9
    assert new.stages["Fetch"].program == "/opt/bin/fetch"
    assert new.stages["store"].next == ("index",)
    assert new.stages["index"] == StageConfig(
        name="index", program="/opt/bin/index", next=(), max_retries=2
    )
    assert new.sections["stage-fetch"]["PARALLELISM"] == "9"
    assert new.origins[("stage-index", "PROGRAM")] == OVERLAY_ORIGIN
    # the original is untouched
    assert base.stages["Fetch"].parallelism == 4
    assert "index" not in base.stages
    assert "stage-index" not in base.sections


def test_overlay_uses_expanded_paths_as_they_are(write: Write) -> None:
    c = load_config(write("[PATHS]\nBIN = /opt/$$x\n[stage-a]\nPROGRAM = $BIN/a\n"))
    assert c.stages["a"].program == "/opt/$x/a"
    assert apply_overlay(c, [("stage-b", "PROGRAM", "$BIN/b")]).stages["b"].program == "/opt/$x/b"


def test_overlay_ignores_non_stage_sections(base: cfg.Config) -> None:
    new = apply_overlay(
        base,
        [
            ("pepsi-dispatch", "MAX_RUNTIME", "not even a time"),
            ("database", "DSN", "postgresql://elsewhere/x"),
            ("pepsi-httpd", "PORT", "1"),
        ],
    )
    assert new.dispatch == base.dispatch
    assert new.dsn == base.dsn
    assert new.stages == base.stages


def test_overlay_empty_is_identity(base: cfg.Config) -> None:
    assert apply_overlay(base, []) == base


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (
            [("stage-store", "PARALLELISM", "0")],
            f"{OVERLAY_ORIGIN}: [stage-store] PARALLELISM = '0': must be positive",
        ),
        (
            [("stage-store", "NEXT", "fetch")],
            f"{OVERLAY_ORIGIN}: [stage-store] NEXT = 'fetch': NEXT names undefined stage "
            "'fetch'; did you mean 'Fetch'?",
        ),
        (
            [("stage-new", "NEXT", "store")],
            f"{OVERLAY_ORIGIN}: [stage-new]: PROGRAM is missing",
        ),
        (
            [("stage-store", "PROGRAMM", "x")],
            f"{OVERLAY_ORIGIN}: [stage-store] PROGRAMM = 'x': unknown option; did you mean "
            "PROGRAM?",
        ),
        (
            [("stage-store", "PROGRAM", "$NO_SUCH_PEPSI_VAR")],
            f"{OVERLAY_ORIGIN}: [stage-store] PROGRAM = '$NO_SUCH_PEPSI_VAR': undefined variable",
        ),
        (
            [("stage-store", "PROGRAM", None)],
            f"{OVERLAY_ORIGIN}: [stage-store] PROGRAM: value is NULL",
        ),
        (
            [("stage-bad/name", "PROGRAM", "x")],
            f"{OVERLAY_ORIGIN}: [stage-bad/name]: bad stage name 'bad/name'",
        ),
    ],
)
def test_bad_overlay(
    base: cfg.Config, rows: list[tuple[str, str, str | None]], expected: str
) -> None:
    msg = error_of(lambda: apply_overlay(base, rows))
    assert msg.startswith(expected)


def test_overlay_may_close_a_cycle(write: Write) -> None:
    c = load_config(write("[stage-a]\nPROGRAM = a\nNEXT = b\n[stage-b]\nPROGRAM = b\n"))
    assert apply_overlay(c, [("stage-b", "NEXT", "a")]).stages["b"].next == ("a",)


def test_documented_example_parses(write: Write) -> None:
    """The example in docs/CONFIG.md is a valid configuration."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "CONFIG.md").read_text()
    example = doc.split("## Example", 1)[1].split("```ini\n", 1)[1].split("```", 1)[0]
    c = load_config(write(example))
    assert list(c.stages) == ["fetch", "resize", "upload"]
    assert c.stages["fetch"].program == "/srv/pepsi/bin/fetch"
    assert c.stages["resize"].queue_limit == 1
    assert c.dispatch.retention == 3 * 86400


def test_reread_config_keeps_file_dsn_and_dispatch(
    write: Write, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write("[pepsi-dispatch]\nMAX_RUNTIME = 1 s\n[stage-a]\nPROGRAM = a\n")
    monkeypatch.setenv("PEPSI_DSN", "postgresql:///first")
    c = load_config(str(path))
    path.write_text("[pepsi-dispatch]\nMAX_RUNTIME = 9 s\n[stage-b]\nPROGRAM = b\n")
    monkeypatch.setenv("PEPSI_DSN", "postgresql:///second")
    new = reread_config(c)
    assert list(new.stages) == ["b"]
    assert new.path == path
    assert new.dsn == "postgresql:///first"
    assert new.dispatch.max_runtime == 1


def test_reread_config_without_file_does_not_search(write: Write, isolated: Path) -> None:
    c = load_config()
    user = isolated / ".config" / "pepsi.conf"
    user.parent.mkdir()
    user.write_text("[stage-a]\nPROGRAM = a\n")
    assert reread_config(c).stages == {}
    assert reread_config(c).path is None


def test_reread_config_reports_a_broken_file(write: Write) -> None:
    path = write("[stage-a]\nPROGRAM = a\n")
    c = load_config(str(path))
    path.write_text("[stage-a]\nPROGRAM = a\nNEXT = zz\n")
    assert "undefined stage 'zz'" in error_of(lambda: reread_config(c))


def test_retry_delay_and_max_per_stage_and_overlay(write: Write) -> None:
    path = write(
        "[stage-a]\nPROGRAM = /bin/a\nRETRY_DELAY = 500 ms\nRETRY_DELAY_MAX = 5 min\n"
        "[stage-b]\nPROGRAM = /bin/b\nRETRY_DELAY =\n"
        "[stage-c]\nPROGRAM = /bin/c\nRETRY_DELAY = 0\n"
        "[stage-d]\nPROGRAM = /bin/d\n"
    )
    c = load_config(str(path))
    assert (c.stages["a"].retry_delay, c.stages["a"].retry_delay_max) == (0.5, 300.0)
    for name in "bcd":  # empty, 0 or unset: off (today's behaviour)
        assert (c.stages[name].retry_delay, c.stages[name].retry_delay_max) == (None, None)
    new = apply_overlay(c, [("stage-d", "RETRY_DELAY", "2 s"), ("stage-a", "RETRY_DELAY", "")])
    assert new.stages["d"].retry_delay == 2.0
    assert new.stages["a"].retry_delay is None and new.stages["a"].retry_delay_max == 300.0


def test_bad_retry_delay_names_file_and_line(write: Write) -> None:
    path = write("[stage-a]\nPROGRAM = /bin/a\nRETRY_DELAY = soon\n")
    message = error_of(lambda: load_config(str(path)))
    assert f"{path}:3" in message and "RETRY_DELAY" in message and "not a time value" in message
