"""The HTTP front end: ``pepsi-httpd [-c FILE] [-l LOGFILE] [--listen HOST:PORT]
[--allow-actions] [--allowed-host NAME]...``.

Routes:
  GET  /metrics            Prometheus text (exposition.py)
  GET  /healthz            200 "ok" while the database answers and a dispatcher is live
                           (registered, its session connected, and a session holding the
                           dispatcher lock), and no stage with pending messages has been
                           held off longer than --held-off-limit; else 503 with the reason
  GET  /, /messages, /failures, /message/ID   the dashboard (one page, static/app.js
                           renders the route); any other path but /api/...: 404 with
                           the dashboard's page saying so (its nav and banner)
  GET  /static/NAME, /favicon.ico   our own JS, CSS and icon (package data; no CDN)
  GET  /api/overview, /api/messages?status=&stage=&older_than=&where=&group=&limit=&before=,
       /api/failures?reason=&stage=, /api/message/ID, /api/schedules   JSON for the dashboard
  GET  /api/bulk?action=requeue|cancel&(the list's filters)   how many messages the
                           filter selects for the action, and the newest one's id
  POST /api/requeue {"ids": [...]}, /api/cancel {"ids": [...]},
       /api/bulk {"action": "requeue"|"cancel", the list's filters, "before": ID}
       (pepsi.requeue_matching / cancel_matching: every message of the filter below ID),
       /api/pause {"stage": S, "paused": bool}, /api/reschedule {"id": N, "in_seconds": S}
       only with --allow-actions (else 403); each is one pepsi.dashboard_* function,
       but /api/pause: pepsi.pause_stage, as pepsi-queue pause/resume (paused false
       also ends the stage's hold-off: the Try now button)

Every request, read or action, must name this server in its Host header (the
listen address, localhost, or an --allowed-host name; guard.py), and an Origin
header must match it: else 421/403 with the reason. Connections are capped and
must deliver their request within --request-timeout (limits.py).

The database is PEPSI_DSN, else [database] DSN of the configuration (-c);
of the rest it reads only [pepsi-httpd] HELD_OFF_LIMIT (CONFIG_OPTIONS): the
stage graph comes from the registry the dispatcher writes. Connect as a login
role in pepsi_dashboard (docs/OPERATIONS.md).
"""

from __future__ import annotations

import html
import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import click
import psycopg

from .. import __version__
from ..cli.logsetup import setup_logging
from ..cli.messages import MESSAGE_LIST_MAX_ROWS, STATUSES
from ..cli.shell import config_option, run_click, version_option
from ..config import ConfigError, load_config, parse_time
from ..errors import UsageError
from . import exposition
from .app import (
    HELD_OFF_LIMIT,
    LIST_ROWS,
    ActionRefused,
    App,
    DatabaseDown,
    held_too_long,
)
from .guard import HostGuard
from .limits import DEFAULT_MAX_CONNECTIONS, DEFAULT_REQUEST_TIMEOUT, BoundedHTTPServer

PROG = "pepsi-httpd"
DEFAULT_LISTEN = "127.0.0.1:9187"
#: What pepsi-httpd reads of its ``[pepsi-httpd]`` section (docs/CONFIG.md, pepsi.conf(5)).
CONFIG_OPTIONS = ("HELD_OFF_LIMIT",)
log = logging.getLogger("pepsi_dispatch.httpd")

STATIC_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".svg": "image/svg+xml",
}
PAGE_ROUTES = re.compile(r"^/(?:failures|messages|message/\d+)?$")
POST_ROUTES = ("/api/requeue", "/api/cancel", "/api/pause", "/api/reschedule", "/api/bulk")
MAX_BODY = 64 * 1024
#: The list's filters a /api/bulk body may carry (as /api/messages' query string).
BULK_FILTERS = ("status", "stage", "older_than", "where", "group")
#: Message ids are bigint: a larger one names no message (and would reach
#: PostgreSQL as numeric, matching no function).
BIGINT_MAX = 2**63 - 1


def _static(name: str) -> bytes | None:
    if not re.fullmatch(r"[a-z0-9_-]+\.(?:js|css|html|svg)", name):
        return None
    try:
        return resources.files(__package__).joinpath("static", name).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None


class Handler(BaseHTTPRequestHandler):
    server_version = f"pepsi-httpd/{__version__}"
    app: App  # set on the subclass made by make_server
    guard: HostGuard  # likewise, once the port is known
    server: BoundedHTTPServer

    def parse_request(self) -> bool:
        """The stdlib's parsing, then the Host/Origin check (before any route runs)."""
        if not super().parse_request():
            return False
        refused = self.guard.refusal(self.headers.get("Host"), self.headers.get("Origin"))
        if refused is not None:
            self.close_connection = True
            status, reason = refused
            log.info("%s %s %s: %s", self.address_string(), self.command, self.path, reason)
            if urlsplit(self.path).path.startswith("/api/"):
                self._json(status, {"error": reason})
            else:
                self._text(status, reason + "\n")
            return False
        if self.command != "POST":
            self.server.request_arrived(self.connection)
        return True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    # -- replies ------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _text(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8")

    # -- GET ----------------------------------------------------------------------
    def do_HEAD(self) -> None:  # noqa: N802 - stdlib name
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        url = urlsplit(self.path)
        path = url.path
        try:
            if path == "/metrics":
                self._metrics()
            elif path == "/healthz":
                self._healthz()
            elif PAGE_ROUTES.match(path):
                self._page()
            elif path == "/favicon.ico":
                self._send(200, _static("favicon.svg") or b"", STATIC_TYPES[".svg"])
            elif path.startswith("/static/") and (body := _static(path[len("/static/") :])):
                self._send(200, body, STATIC_TYPES[path[path.rfind(".") :]])
            elif not self._api_get(path, url.query):
                self._not_found(path)
        except (ValueError, ConfigError) as exc:
            self._json(400, {"error": f"bad request: {exc}"})
        except ActionRefused as exc:  # the request's data, refused by the database
            self._json(400, {"error": f"refused: {exc}"})
        except DatabaseDown as exc:
            if path.startswith("/api/"):
                self._json(503, {"error": str(exc)})
            else:
                self._text(503, f"{exc}\n")

    def _api_get(self, path: str, query: str) -> bool:
        """GET /api/...; False if no such route."""
        if path == "/api/overview":
            self._json(200, self.app.overview())
        elif path == "/api/messages":
            self._json(200, {"rows": self.app.messages(*_list_filters(parse_qs(query)))})
        elif path == "/api/schedules":
            self._json(200, {"rows": self.app.schedules()})
        elif path == "/api/bulk":
            q = parse_qs(query)
            action = _bulk_action((q.get("action") or [""])[0])
            matched, _, newest = self.app.bulk(action, _list_filters(q)[:5], None, dry_run=True)
            self._json(200, {"action": action, "matched": matched, "newest_id": newest})
        elif path == "/api/failures":
            q = parse_qs(query)
            reason = q.get("reason", [None])[0]
            stage = q.get("stage", [None])[0] or None
            self._json(200, {"rows": self.app.failed(reason, stage)})
        elif m := re.fullmatch(r"/api/message/(\d+)", path):
            wid = int(m.group(1))
            row = self.app.message(wid) if wid <= BIGINT_MAX else None
            if row is None:
                self._json(404, {"error": f"no message {m.group(1)}"})
            else:
                self._json(200, {"message": row, "allow_actions": self.app.allow_actions})
        else:
            return False
        return True

    def _metrics(self) -> None:
        t0 = time.monotonic()
        try:
            snap = self.app.snapshot()
        except DatabaseDown:
            metrics = exposition.database_down()
        else:
            metrics = list(
                exposition.families(snap.data, self.app.paused_map(snap.data), snap.seconds)
            )
        body = exposition.render(metrics)
        log.debug("/metrics in %.1f ms", (time.monotonic() - t0) * 1000)
        self._send(200, body, exposition.CONTENT_TYPE)

    def _healthz(self) -> None:
        try:
            snap = self.app.snapshot()
        except DatabaseDown as exc:
            self._text(503, f"{exc}\n")
            return
        live = [d for d in snap.data.get("dispatchers") or [] if d.get("live")]
        if not live:
            self._text(503, "no live dispatcher: none is registered with its session connected\n")
            return
        # (Absent before migration 0016: the heartbeat alone decides, as it did.)
        if not snap.data.get("dispatcher_session", True):
            self._text(
                503,
                "no dispatcher session: no one holds the dispatcher lock, though a heartbeat"
                " is recent (a dispatcher killed, or reconnecting)\n",
            )
            return
        held = held_too_long(snap.data, self.app.held_off_limit)
        if held:
            self._text(503, "".join(_held_line(h) for h in held))
            return
        self._text(200, f"ok: {len(live)} live dispatcher(s)\n")

    def _page(self, status: int = 200, main: str = "") -> None:
        body = _static("index.html") or b""
        flag = b"true" if self.app.allow_actions else b"false"
        body = body.replace(b"__ALLOW_ACTIONS__", flag)
        if main:
            body = body.replace(b'<main id="main"></main>', main.encode())
        self._send(status, body, STATIC_TYPES[".html"])

    def _not_found(self, path: str) -> None:
        """404: JSON under /api/, else the dashboard's page (nav, banner) saying so."""
        if path.startswith("/api/"):
            self._json(404, {"error": "not found"})
            return
        self._page(
            404,
            '<main id="main" data-page="not-found"><section id="not-found"><h2>Not found</h2>'
            f"<p>No page at <code>{html.escape(path)}</code>. The dashboard has"
            ' <a href="/">Overview</a>, <a href="/messages">Messages</a>,'
            ' <a href="/failures">Failures</a> and /message/ID.</p></section></main>',
        )

    # -- POST ---------------------------------------------------------------------
    def _read_body(self) -> dict[str, Any]:
        """The JSON object of a POST (ValueError for anything else).

        The request deadline runs until the last byte of the body is in: a body
        that never arrives is cut off by the server's watchdog.
        """
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            raise ValueError("body missing or too large")
        raw = self.rfile.read(length)
        self.server.request_arrived(self.connection)
        if len(raw) < length:
            raise ValueError("the body ended early")
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        return body

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        path = urlsplit(self.path).path
        if path not in POST_ROUTES:
            self._json(404, {"error": "not found"})
            return
        if not self.app.allow_actions:
            self._json(403, {"error": "read-only: pepsi-httpd was started without --allow-actions"})
            return
        # A JSON body and a custom header: a cross-site form cannot send either.
        if self.headers.get("X-Pepsi-Action") != "1" or not (
            self.headers.get("Content-Type", "").startswith("application/json")
        ):
            self._json(
                400, {"error": "actions need Content-Type: application/json and X-Pepsi-Action: 1"}
            )
            return
        try:
            self._json(200, self._action(path, self._read_body()))
        except (KeyError, TypeError, ValueError) as exc:
            self._json(400, {"error": f"bad request: {exc}"})
        except ActionRefused as exc:
            self._json(400, {"error": f"refused: {exc}"})
        except DatabaseDown as exc:
            self._json(503, {"error": str(exc)})

    def _action(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One POST action's answer (ValueError, KeyError, TypeError for a bad body)."""
        if path == "/api/pause":
            stage = body["stage"]
            paused = body["paused"]
            if not isinstance(paused, bool):  # the stage: pause_stage checks
                raise ValueError("'paused' must be true or false")
            return {"changed": self.app.pause(stage, paused)}
        if path == "/api/reschedule":
            return {"due": self.app.reschedule(*_reschedule_args(body))}
        if path == "/api/bulk":
            before = body.get("before")
            if before is not None and not _is_bigint(before):
                raise ValueError("'before' must be a message id")
            q = {k: [str(body[k])] for k in BULK_FILTERS if body.get(k) not in (None, "")}
            filters = _list_filters(q)[:5]
            matched, acted, _ = self.app.bulk(_bulk_action(body.get("action")), filters, before)
            return {"matched": matched, "rows": acted}
        ids = body["ids"]
        if not (isinstance(ids, list) and ids and all(_is_bigint(i) for i in ids)):
            raise ValueError("'ids' must be a non-empty list of integers (message ids)")
        return {"rows": self.app.requeue(ids) if path == "/api/requeue" else self.app.cancel(ids)}


def _bulk_action(action: Any) -> str:
    """The action of a /api/bulk request (ValueError unless requeue or cancel)."""
    if action not in ("requeue", "cancel"):
        raise ValueError("'action' must be requeue or cancel")
    return action


def _reschedule_args(body: dict[str, Any]) -> tuple[int, float]:
    """(id, seconds from now) of a /api/reschedule body; ValueError when malformed."""
    wid, secs = body["id"], body.get("in_seconds", 0)
    if not _is_bigint(wid) or isinstance(secs, bool) or not isinstance(secs, int | float):
        raise ValueError("'id' must be a message id and 'in_seconds' a number")
    if not 0 <= secs <= 3.2e9:
        raise ValueError("'in_seconds' must be 0 or more (at most about 100 years)")
    return wid, float(secs)


def _held_line(h: dict[str, Any]) -> str:
    return (
        f"stage {h['stage']} {h['state'].replace('_', ' ')} for {h['held_seconds']:.0f} s"
        f" with {h['pending']} pending message(s): {h.get('cause') or 'cause unknown'}\n"
    )


def _list_filters(
    q: dict[str, list[str]],
) -> tuple[str | None, str | None, float | None, str | None, str | None, int, int | None]:
    """The message list's filters from a query string (ValueError when one is malformed)."""

    def one(name: str) -> str | None:
        return (q.get(name) or [""])[0].strip() or None

    status = one("status")
    if status is not None and status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}")
    older = one("older_than")
    where = one("where")
    if where is not None:
        if not isinstance(json.loads(where), dict):
            raise ValueError("'where' must be a JSON object (payload containment)")
    limit = int(one("limit") or LIST_ROWS)
    before = one("before")
    return (
        status,
        one("stage"),
        parse_duration(older) if older else None,
        where,
        one("group"),
        max(1, min(limit, MESSAGE_LIST_MAX_ROWS)),
        int(before) if before else None,
    )


def parse_duration(text: str) -> float:
    """Seconds of ``90s``, ``10m``, ``1h30m`` or the configuration's ``5 min`` form."""
    return parse_time(re.sub(r"(\d)m(?![a-z])", r"\1 min", text.strip(), flags=re.IGNORECASE))


def _is_bigint(value: Any) -> bool:
    return type(value) is int and -BIGINT_MAX - 1 <= value <= BIGINT_MAX


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def make_server(
    app: App,
    listen: str,
    allowed_hosts: Sequence[str] = (),
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> BoundedHTTPServer:
    """The server on ``listen``, answering only requests that name it (see :mod:`.guard`)."""
    handler: type[Handler] = type("BoundHandler", (Handler,), {"app": app})
    host, _port = parse_listen(listen)
    server = BoundedHTTPServer(parse_listen(listen), handler, max_connections, request_timeout)
    handler.guard = HostGuard.build(host, server.server_address[1], allowed_hosts)
    return server


@click.command(name=PROG, context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    metavar="HOST:PORT",
    help="Address to serve on (port 0: any free port; the address is logged).",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Enable the dashboard's requeue, cancel and pause/resume buttons (POST).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests whose Host is NAME (repeatable); localhost and the"
    " listen address always are. Any other Host is refused (DNS rebinding).",
)
@click.option(
    "--max-connections",
    default=DEFAULT_MAX_CONNECTIONS,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Open connections at most (lowered to fit the open-file limit); at the cap a"
    " new one replaces the one that has waited longest for its request.",
)
@click.option(
    "--request-timeout",
    default=DEFAULT_REQUEST_TIMEOUT,
    show_default=True,
    type=click.FloatRange(0.1, 3600),
    metavar="SECONDS",
    help="A connection that has not sent its whole request (headers and body) this"
    " long after it opened is closed.",
)
@click.option(
    "--held-off-limit",
    metavar="DURATION",
    default=None,
    help="/healthz answers 503 once a stage with pending messages has been held off this"
    " long (e.g. 90s, 2m; default: [pepsi-httpd] HELD_OFF_LIMIT of the configuration,"
    f" else {HELD_OFF_LIMIT:.0f} s).",
)
@click.option("-L", "--log-level", default="INFO", show_default=True, help="Logging level.")
@click.option(
    "-l",
    "--logfile",
    metavar="LOGFILE",
    help="Append the log here instead of stderr (reopened when logrotate moves it).",
)
@version_option(PROG)
def cli(
    config_path: str | None,
    listen: str,
    allow_actions: bool,
    allowed_hosts: tuple[str, ...],
    max_connections: int,
    request_timeout: float,
    held_off_limit: str | None,
    log_level: str,
    logfile: str | None,
) -> int:
    """Serve /metrics, /healthz and the web dashboard of a pepsi work queue; needs only a DSN."""
    config = load_config(config_path)
    # As pepsi-dispatch -l: one line per record, to stderr (the journal's levels
    # under systemd) or appended to LOGFILE, reopened after a rotation; a file that
    # cannot be opened is a usage error (exit 2).
    setup_logging(log_level, logfile, "text", PROG)
    limit = _held_off_limit(held_off_limit, config.sections.get("pepsi-httpd", {}))
    parse_listen(listen)  # a bad --listen is a usage error before the database is tried
    app = App(config.dsn, allow_actions, limit)
    try:
        problem = app.check_database()
    except psycopg.ProgrammingError:
        # (Not the parser's text: it quotes the DSN, password and all.)
        raise UsageError(
            "the database DSN (PEPSI_DSN, else [database] DSN) does not parse: write"
            " key=value pairs or a postgresql://user@host/dbname URI"
        ) from None
    if problem:
        log.error("at start: %s (serving 503 until that changes)", problem)
    try:
        server = make_server(app, listen, allowed_hosts, max_connections, request_timeout)
    except OSError as exc:
        raise UsageError(f"cannot listen on {listen}: {exc}") from None
    host, port = server.server_address[:2]
    log.info(
        "listening on http://%s:%d/ (%s; Host must be one of %s; at most %d connections,"
        " %.1f s to send a request)",
        host,
        port,
        "actions allowed" if allow_actions else "read-only",
        ", ".join(sorted(server.RequestHandlerClass.guard.names)),
        server.max_connections,
        server.request_timeout,
    )
    app.start_sampler()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        app.close()
    return 0


def _held_off_limit(option: str | None, section: dict[str, str]) -> float:
    """--held-off-limit, else [pepsi-httpd] HELD_OFF_LIMIT, else the default (seconds)."""
    text, where = option, "--held-off-limit"
    if text is None and "HELD_OFF_LIMIT" in section:
        text, where = section["HELD_OFF_LIMIT"], "[pepsi-httpd] HELD_OFF_LIMIT"
    if text is None:
        return HELD_OFF_LIMIT
    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise UsageError(f"{where}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> None:
    def report(text: str) -> None:
        print(f"{PROG}: error: {text}", file=sys.stderr)

    sys.exit(run_click(cli, PROG, sys.argv[1:] if argv is None else argv, report))
