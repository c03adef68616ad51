"""Which stderr lines of a worker that died say why (coordinator/workers/lastwords.py;
no database, no processes): real crash reports of Node.js, Python and bash."""

from __future__ import annotations

from pepsi_dispatch.coordinator.workers.lastwords import (
    CAUSE_CHARS,
    LastWords,
    looks_like_error,
    stderr_cause,
)

#: node v20.20.2 running a stage whose `require('pg')` finds no module (verbatim).
NODE_MISSING_MODULE = """\
node:internal/modules/cjs/loader:1210
  throw err;
  ^

Error: Cannot find module 'pg'
Require stack:
- /srv/stages/store.js
    at Module._resolveFilename (node:internal/modules/cjs/loader:1207:15)
    at Module._load (node:internal/modules/cjs/loader:1038:27)
    at Module.require (node:internal/modules/cjs/loader:1289:19)
    at require (node:internal/modules/helpers:182:18)
    at Object.<anonymous> (/srv/stages/store.js:1:12)
    at Module._compile (node:internal/modules/cjs/loader:1521:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1623:10)
    at Module.load (node:internal/modules/cjs/loader:1266:32)
    at Module._load (node:internal/modules/cjs/loader:1091:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:164:12) {
  code: 'MODULE_NOT_FOUND',
  requireStack: [ '/srv/stages/store.js' ]
}

Node.js v20.20.2
"""

PYTHON_TRACEBACK = """\
starting stage store
Traceback (most recent call last):
  File "/srv/stages/store.py", line 3, in <module>
    import psycopg_pool
ModuleNotFoundError: No module named 'psycopg_pool'
"""

PYTHON_CHAINED = """\
Traceback (most recent call last):
  File "/srv/stages/store.py", line 9, in load
    return json.loads(text)
json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/srv/stages/store.py", line 14, in <module>
    CONFIG = load(open("/etc/store.json").read())
  File "/srv/stages/store.py", line 11, in load
    raise RuntimeError("bad /etc/store.json") from None
RuntimeError: bad /etc/store.json
"""

BASH_ERROR = """\
fetch: reading /etc/fetch.conf
/srv/stages/fetch.sh: line 4: curlx: command not found
"""


def test_node_missing_module_names_the_error_not_the_version_banner() -> None:
    assert stderr_cause(NODE_MISSING_MODULE) == (
        "Error: Cannot find module 'pg' … at Function.executeUserEntryPoint [as runMain]"
        " (node:internal/modules/run_main:164:12) { | code: 'MODULE_NOT_FOUND',"
        " | requireStack: [ '/srv/stages/store.js' ]"
    )


def test_python_traceback_names_its_exception() -> None:
    assert stderr_cause(PYTHON_TRACEBACK) == "ModuleNotFoundError: No module named 'psycopg_pool'"


def test_python_chained_traceback_names_the_first_and_the_last_exception() -> None:
    cause = stderr_cause(PYTHON_CHAINED)
    assert cause.startswith("json.decoder.JSONDecodeError: Expecting value: line 1 column 1")
    assert cause.endswith(" | RuntimeError: bad /etc/store.json")


def test_bash_error_is_the_cause() -> None:
    assert stderr_cause(BASH_ERROR) == "/srv/stages/fetch.sh: line 4: curlx: command not found"


def test_without_an_error_line_the_last_lines_are_the_cause() -> None:
    assert stderr_cause("one\ntwo\n\nthree\nfour\n") == "two | three | four"
    assert stderr_cause("") == "" and stderr_cause("\n  \n}\n") == ""


def test_lines_arriving_in_pieces_give_the_same_cause() -> None:
    words = LastWords()
    lines = NODE_MISSING_MODULE.splitlines()
    for i in range(0, len(lines), 4):
        words.note(lines[i : i + 4])
    assert words.cause() == stderr_cause(NODE_MISSING_MODULE)


def test_the_cause_is_bounded_and_keeps_the_error_first() -> None:
    text = "Error: " + "x" * 1000 + "\n" + "\n".join(f"line {i} " + "y" * 400 for i in range(50))
    cause = stderr_cause(text)
    assert len(cause) == CAUSE_CHARS and cause.startswith("Error: xxx") and cause.endswith("…")


def test_frames_and_log_lines_do_not_look_like_errors() -> None:
    for line in (
        "at Module._load (node:internal/modules/cjs/loader:1038:27)",
        'File "/srv/stages/store.py", line 3, in <module>',
        'raise RuntimeError("bad")',
        "Traceback (most recent call last):",
        "starting stage store",
        "Node.js v20.20.2",
    ):
        assert not looks_like_error(line), line
    for line in (
        "Error: Cannot find module 'pg'",
        "TypeError [ERR_INVALID_ARG_TYPE]: The path argument must be of type string",
        "ModuleNotFoundError: No module named 'x'",
        'Exception in thread "main" java.lang.NoClassDefFoundError: org/postgresql/Driver',
        "panic: runtime error: invalid memory address",
        "fatal: not a git repository",
        "ERROR:root:cannot connect",
        "/srv/stage.sh: 3: curlx: not found",
        "/usr/bin/env: 'nodee': No such file or directory",
    ):
        assert looks_like_error(line), line
