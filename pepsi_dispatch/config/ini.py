"""The GNUnet-style INI reader under pepsi.conf: no knowledge of pepsi's options.

What it does: read a file into sections and options (``#``/``;`` comments, quotes,
``@INLINE@`` includes), remember where each value came from (``FILE:LINE``), expand
``$NAME``, ``${NAME}``, ``${NAME:-default}`` and ``$$`` from [PATHS] and the
environment, merge overlay rows (section, option, value) from elsewhere, and format
errors as one line::

    FILE:LINE: [section] OPTION = 'value': what is wrong; how to fix

Which sections and options exist, their types and defaults, is the schema's business
(:mod:`pepsi_dispatch.config`).

Section names and option names are case-insensitive: sections are stored lower-case
(:attr:`Ini.names` keeps the spelling of the first header), options upper-case.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pepsi_dispatch.errors import UsageError

__all__ = [
    "PATHS",
    "BadValue",
    "ConfigError",
    "Expander",
    "Ini",
    "error",
    "expand",
    "expand_sections",
    "merge_rows",
    "read_file",
    "strip_value",
    "suggest",
]

#: The section whose entries ``$NAME`` refers to (before the environment).
PATHS = "paths"
VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_EXPANSION_DEPTH = 32
MAX_INLINE_DEPTH = 10
_INLINE = "@INLINE@"
_TRAILING_COMMENT_RE = re.compile(r"\s#.*$")


class ConfigError(UsageError, ValueError):
    """A configuration problem; ``str()`` is one line: where, what is wrong, how to fix.

    Subclass of :class:`pepsi_dispatch.errors.UsageError` (exit 2) and of
    :class:`ValueError` (so value parsers can be used where a ValueError is expected).
    """


class BadValue(ValueError):
    """A value-level problem without a location; the caller turns it into a ConfigError."""


# --------------------------------------------------------------------------- errors


def _where(origin: str | None, section: str | None, option: str | None, value: str | None) -> str:
    parts = []
    if origin:
        parts.append(f"{origin}:")
    if section is not None:
        sec = f"[{section}]"
        if option is not None:
            sec += f" {option}"
            if value is not None:
                sec += f" = '{value}'"
        parts.append(sec + ":")
    return " ".join(parts)


def error(
    what: str,
    origin: str | None = None,
    section: str | None = None,
    option: str | None = None,
    value: str | None = None,
) -> ConfigError:
    """A one-line ConfigError: ``origin: [section] option = 'value': what``."""
    where = _where(origin, section, option, value)
    msg = f"{where} {what}" if where else what
    return ConfigError(" ".join(msg.split("\n")))


def suggest(word: str, choices: Iterable[str], cutoff: float = 0.6, quote: str = "") -> str:
    """Return ``did you mean X?`` for the closest choice (case-insensitive first), or ''."""
    options = list(choices)
    same = [c for c in options if c.lower() == word.lower()]
    match = same or difflib.get_close_matches(word, options, n=1, cutoff=cutoff)
    return f"did you mean {quote}{match[0]}{quote}?" if match else ""


# --------------------------------------------------------------------------- expansion


def _undefined(name: str) -> BadValue:
    return BadValue(
        f"undefined variable ${name}; define it in [PATHS] or the environment, "
        f"or write ${{{name}:-default}}"
    )


def _closing_brace(value: str, start: int) -> int:
    """The index just past the ``}`` that closes the ``${`` ending at ``start``."""
    level = 1
    j = start
    while j < len(value) and level:
        if value[j] == "{":
            level += 1
        elif value[j] == "}":
            level -= 1
        j += 1
    if level:
        raise BadValue("unclosed '${'; write ${NAME} or ${NAME:-default}")
    return j


@dataclass(frozen=True)
class Expander:
    """Expands references against one [PATHS] section and one environment.

    ``expanded_paths``: the [PATHS] values are already expanded (a loaded file's),
    use them as they are.
    """

    paths: Mapping[str, str]
    env: Mapping[str, str]
    expanded_paths: bool = False

    def expand(self, value: str, depth: int = 0, active: frozenset[str] = frozenset()) -> str:
        """Expand ``$NAME``, ``${NAME}``, ``${NAME:-default}`` and ``$$`` (a literal ``$``).

        Names are looked up in [PATHS] (case-insensitively) first, then in the
        environment. The default applies when the variable is unset or empty.
        ``active``: the [PATHS] entries being expanded (they refer to the environment).
        """
        if depth > MAX_EXPANSION_DEPTH:
            raise BadValue(
                "variable expansion nested too deeply; does a [PATHS] entry refer to itself?"
            )
        if "$" not in value:
            return value
        out: list[str] = []
        i = 0
        while i < len(value):
            text, i = self._piece(value, i, depth, active)
            out.append(text)
        return "".join(out)

    def _piece(self, value: str, i: int, depth: int, active: frozenset[str]) -> tuple[str, int]:
        """The expansion of the piece of ``value`` at ``i``, and where the next one starts."""
        if value[i] != "$":
            end = value.find("$", i)
            end = len(value) if end < 0 else end
            return value[i:end], end
        if i + 1 >= len(value):
            return "$", i + 1
        nxt = value[i + 1]
        if nxt == "$":
            return "$", i + 2
        if nxt == "{":
            return self._braced(value, i, depth, active)
        return self._bare(value, i, depth, active)

    def _braced(self, value: str, i: int, depth: int, active: frozenset[str]) -> tuple[str, int]:
        """``${NAME}`` or ``${NAME:-default}`` at ``i``."""
        end = _closing_brace(value, i + 2)
        inner = value[i + 2 : end - 1]
        name, sep, default = inner.partition(":-")
        if not VAR_NAME_RE.fullmatch(name):
            raise BadValue(
                f"bad variable reference '${{{inner}}}'; write ${{NAME}} or ${{NAME:-default}}"
            )
        found = self._lookup(name, depth, active)
        if not found and sep:
            found = self.expand(default, depth + 1, active)
        if found is None:
            raise _undefined(name)
        return found, end

    def _bare(self, value: str, i: int, depth: int, active: frozenset[str]) -> tuple[str, int]:
        """``$NAME`` at ``i``; a ``$`` not followed by a name is itself."""
        m = VAR_NAME_RE.match(value, i + 1)
        if m is None:
            return "$", i + 1
        found = self._lookup(m.group(0), depth, active)
        if found is None:
            raise _undefined(m.group(0))
        return found, m.end()

    def _lookup(self, name: str, depth: int, active: frozenset[str]) -> str | None:
        key = name.upper()
        if key in self.paths and key not in active:
            if self.expanded_paths:
                return self.paths[key]
            # Inside the expansion of [PATHS] NAME, $NAME means the environment's NAME,
            # so that NAME = ${NAME:-/default} works.
            return self.expand(self.paths[key], depth + 1, active | {key})
        return self.env.get(name)


def expand(
    value: str, paths: Mapping[str, str], env: Mapping[str, str], expanded_paths: bool = False
) -> str:
    """Expand the references in ``value`` (see :meth:`Expander.expand`).

    Raises:
        BadValue: an undefined variable, a malformed reference, or runaway nesting.
    """
    return Expander(paths, env, expanded_paths).expand(value)


# --------------------------------------------------------------------------- reading


@dataclass
class Ini:
    """What was read: options by section, the sections' spellings, and origins.

    ``origins`` maps (section, OPTION) to ``"FILE:LINE"`` (or an overlay's name);
    (section, "") is the section header.
    """

    sections: dict[str, dict[str, str]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # lower -> first spelling
    origins: dict[tuple[str, str], str] = field(default_factory=dict)


def strip_value(value: str) -> str:
    """Strip blanks, a trailing `` # comment`` and one pair of surrounding double quotes."""
    v = value.strip()
    if v.startswith('"'):
        end = v.find('"', 1)
        if end > 0:
            rest = v[end + 1 :].strip()
            if not rest or rest.startswith("#"):
                return v[1:end]
    if v.startswith("#"):
        return ""
    v = _TRAILING_COMMENT_RE.sub("", v)
    return v.strip()


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error("configuration file does not exist; check the path", str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise error(
            f"cannot read configuration file: {reason}; fix it or its permissions", str(path)
        ) from None


@dataclass
class _Reader:
    """One file being read into ``ini``; ``section`` is the current section (lower-case)."""

    path: Path
    ini: Ini
    env: Mapping[str, str]
    depth: int
    section: str | None = None

    def read(self) -> None:
        text = _read_text(self.path)
        for lineno, line in enumerate(text.splitlines(), 1):
            s = line.strip()
            if not s or s[0] in "#;":
                continue
            loc = f"{self.path}:{lineno}"
            if s.upper().startswith(_INLINE):
                self._inline(s[len(_INLINE) :].strip(), loc)
            elif s.startswith("["):
                self._header(s, loc)
            else:
                self._option(s, loc)

    def _inline(self, target: str, loc: str) -> None:
        if not target:
            raise error("@INLINE@ needs a file name", loc)
        if self.depth >= MAX_INLINE_DEPTH:
            raise error("@INLINE@ nested too deeply (does a file include itself?)", loc)
        try:
            target = expand(target, self.ini.sections.get(PATHS, {}), self.env)
        except BadValue as exc:
            raise error(f"@INLINE@ {target}: {exc}", loc) from None
        inc = Path(target).expanduser()
        if not inc.is_absolute():
            inc = self.path.parent / inc
        if not inc.is_file():
            raise error(f"@INLINE@ file '{inc}' does not exist; fix the path", loc)
        _Reader(inc, self.ini, self.env, self.depth + 1).read()
        self.section = None  # an included file does not continue this file's section

    def _header(self, s: str, loc: str) -> None:
        s = _TRAILING_COMMENT_RE.sub("", s).rstrip()  # [section]   # comment
        if not s.endswith("]"):
            raise error(f"bad section header '{s}'; write it as [name]", loc)
        name = s[1:-1].strip()
        if not name:
            raise error("empty section name '[]'; write it as [name]", loc)
        self.section = name.lower()
        self.ini.names.setdefault(self.section, name)
        self.ini.sections.setdefault(self.section, {})
        self.ini.origins.setdefault((self.section, ""), loc)

    def _option(self, s: str, loc: str) -> None:
        if "=" not in s:
            raise error(
                f"cannot parse line '{s}'; expected KEY = value, [section] or # comment", loc
            )
        key, value = s.split("=", 1)
        key = key.strip().upper()
        if not key:
            raise error(f"missing option name in '{s}'; expected KEY = value", loc)
        if self.section is None:
            raise error(f"option {key} outside any section; put it under a [section] header", loc)
        self.ini.sections[self.section][key] = strip_value(value)
        self.ini.origins[(self.section, key)] = loc


def read_file(path: Path, ini: Ini, env: Mapping[str, str] | None = None) -> None:
    """Read ``path`` (and the files it ``@INLINE@``\\s) into ``ini``; later values win.

    ``env`` (default ``os.environ``) expands references in ``@INLINE@`` file names.

    Raises:
        ConfigError: the file is unreadable or a line does not parse, naming FILE:LINE.
    """
    _Reader(path, ini, os.environ if env is None else env, depth=0).read()


def expand_sections(
    ini: Ini, env: Mapping[str, str], strict: Callable[[str], bool]
) -> dict[str, dict[str, str]]:
    """Every value of ``ini`` expanded, by section.

    A value that does not expand is an error in the sections ``strict`` accepts; in
    the others (another tool's, or [PATHS] entries only checked where they are used)
    it is kept as written.

    Raises:
        ConfigError: a value of a strict section does not expand, naming where it is.
    """
    paths = ini.sections.get(PATHS, {})
    out: dict[str, dict[str, str]] = {}
    for sec, opts in ini.sections.items():
        expanded: dict[str, str] = {}
        for key, value in opts.items():
            try:
                expanded[key] = expand(value, paths, env)
            except BadValue as exc:
                if strict(sec):
                    raise error(
                        str(exc), ini.origins.get((sec, key)), ini.names.get(sec, sec), key, value
                    ) from None
                expanded[key] = value  # another tool's section: leave it to that tool
        out[sec] = expanded
    return out


def merge_rows(
    ini: Ini,
    rows: Iterable[tuple[str, str, str | None]],
    origin: str,
    wanted: Callable[[str], bool],
    env: Mapping[str, str],
) -> None:
    """Merge overlay rows (section, option, value) into ``ini``, which is already expanded.

    Rows whose (lower-case) section ``wanted`` rejects are skipped. Values are
    expanded like file values, against ``ini``'s (expanded) [PATHS]; ``origin``
    names where they came from, in ``ini.origins`` and in errors.

    Raises:
        ConfigError: an empty option name, a NULL value or a value that does not expand.
    """
    paths = ini.sections.get(PATHS, {})
    for section, option, value in rows:
        sec_name = (section or "").strip()
        sec = sec_name.lower()
        if not wanted(sec):
            continue
        key = (option or "").strip().upper()
        if not key:
            raise error("empty option name; delete the row", origin, sec_name)
        if value is None:
            raise error("value is NULL; set a value or delete the row", origin, sec_name, key)
        try:
            expanded = expand(value.strip(), paths, env, expanded_paths=True)
        except BadValue as exc:
            raise error(str(exc), origin, sec_name, key, value) from None
        ini.sections.setdefault(sec, {})[key] = expanded
        ini.names.setdefault(sec, sec_name)
        ini.origins[(sec, key)] = origin
        ini.origins.setdefault((sec, ""), origin)
