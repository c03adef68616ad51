"""The stage runner: read ids, process them, answer; reconnect and redo after a lost connection.

Its states (:class:`RunnerState`) are drawn in docs/INTERNALS.md, "The runner's
states".
"""

from __future__ import annotations

import signal
import sys
import time
from enum import Enum
from types import FrameType
from typing import Any

import psycopg

from .adapters import Ids
from .ahead import ReadAhead
from .connection import ConnectionHolder
from .inhand import InHand
from .loading import (
    GET_MESSAGES,
    RELOAD,
    Loaded,
    carries_row,
    load_batch,
    loaded_lines,
    parse_ids,
    split_runs,
)
from .pinning import Pin, PinnedRows
from .pipe import LineReader, one_line, parse_id, write_answers
from .routing import Attempt, HandlerDispatch
from .transaction import SET_BASED, BatchFailed, CommitMode, GroupBatch, Scope, TransactionEnded

__all__ = ["GROUP_WINDOW", "RunnerState", "StageRunner"]

#: Group commit: a group takes no more messages once its handlers have run this
#: long (seconds); it commits and answers, and the next group goes on.
GROUP_WINDOW = 0.5


class RunnerState(Enum):
    """What the runner is doing, as far as a stop signal is concerned."""

    WORKING = "starting, or processing ids: a stop signal lets the message in hand finish"
    READING = "blocked reading ids: a stop signal ends the runner at once"
    STOPPING = "a stop signal came: finish and answer the message in hand, then exit 0"


class _Stop(Exception):
    """Raised by the signal handler while the runner waits for input."""


class StageRunner:
    """Serves one stage: reads id lines, has each message processed, writes the answers.

    With :attr:`CommitMode.GROUP` the ids already waiting are processed in one
    transaction and answered after its commit; otherwise each message is
    committed and answered before the next starts.
    """

    def __init__(
        self,
        dispatch: HandlerDispatch,
        connection: ConnectionHolder,
        commit_mode: CommitMode,
        answer_fd: int,
        input_fd: int,
        in_hand: InHand | None = None,
    ) -> None:
        self.dispatch = dispatch
        #: names the message whose handler runs, for the dispatcher's crash blame
        self.in_hand = in_hand if in_hand is not None else InHand(None)
        self.connection = connection
        self.commit_mode = commit_mode
        self.answer_fd = answer_fd
        self.reader = LineReader(input_fd, self._before_read, self._after_read)
        #: group commit: the kinds sent through a set-based function (sdk/entry.py)
        self.set_based: frozenset[str] = frozenset(SET_BASED)
        #: the check that a message's row is still our dispatcher's before its
        #: handler starts (sdk/pinning.py); None without a dispatcher id
        self.pin: Pin | None = None
        #: the ids pinned after the last commit and what the pin returned: its
        #: transaction is open, for the batch of those ids (:meth:`_take_pinned`)
        self._pinned_ahead: tuple[frozenset[int], PinnedRows] | None = None
        # Two variables, not one: the main code writes only the phase and the
        # signal handler only the stop request, so neither can overwrite the
        # other's news between a test and a write.
        self._phase = RunnerState.WORKING
        self._stop_requested = False
        #: group commit: id lines taken from stdin while a batch committed, and their
        #: rows if loaded in the commit's round trip; served before stdin is read again
        self._ahead_lines: list[bytes] = []
        self._ahead_line_ids: list[int | None] = []  # their parse_ids
        self._ahead_rows: dict[int, tuple[Any, ...]] | None = None
        self._ahead_ids: set[int] = set()

    @property
    def state(self) -> RunnerState:
        """The runner's state (STOPPING once a stop signal came)."""
        return RunnerState.STOPPING if self._stop_requested else self._phase

    # -- signals

    def install_signals(self) -> None:
        """SIGTERM and SIGINT stop the runner (see :class:`RunnerState`)."""
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)

    def _before_read(self) -> None:
        self._phase = RunnerState.READING
        if self._stop_requested:
            raise _Stop

    def _after_read(self) -> None:
        self._phase = RunnerState.WORKING

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """A stop signal: stop now while reading, else after the message in hand."""
        self._stop_requested = True
        if self._phase is RunnerState.READING:
            raise _Stop

    # -- the loop

    def serve(self) -> int:
        """Serve until EOF or a stop signal (0), or a fatal error (1).

        A lost connection that reconnecting cannot repair raises
        :class:`psycopg.OperationalError`.
        """
        try:
            while self.state is not RunnerState.STOPPING:
                lines, ids = self._ahead_lines, self._ahead_line_ids
                self._ahead_lines = []
                if not lines:
                    self._take_pinned([], Attempt.REDO)  # none: not left open while idle
                    lines, ids = self.reader.lines(), None
                if not lines:
                    return 0  # EOF
                self._run_batch(lines, ids)
        except _Stop:
            return 0
        except BatchFailed as exc:
            print(f"pepsi worker: {exc}; exiting", file=sys.stderr)
            return 1
        except BrokenPipeError:
            print("pepsi worker: the dispatcher closed our stdout; exiting", file=sys.stderr)
            return 1
        finally:
            self._let_go_of_pins()
        return 0

    def _let_go_of_pins(self) -> None:
        """Ending: the rows pinned for a batch that will not run go (best effort:
        the session's end would end the transaction too)."""
        try:
            self._take_pinned([], Attempt.REDO)
        except psycopg.Error:
            pass

    def _run_batch(self, lines: list[bytes], ids: list[int | None] | None = None) -> None:
        """Process the lines (``ids``: their :func:`~.loading.parse_ids`, if parsed).
        A group commit batch never holds one id twice: the second copy starts the
        next batch, loaded after the first committed."""
        if self.commit_mode is not CommitMode.GROUP:
            self._run_lines(lines)
            return
        for run, run_ids in split_runs(lines, parse_ids(lines) if ids is None else ids):
            self._run_lines(run, run_ids)
            if self.state is RunnerState.STOPPING:
                return

    def _run_lines(self, lines: list[bytes], ids: list[int | None] | None = None) -> None:
        """Process the lines; after a lost connection reconnect and redo what is unanswered.

        ``ids`` (the lines' ids, if parsed) serve the first group only: what
        is left after it is parsed again."""
        attempt = Attempt.FIRST
        while True:
            try:
                if self.commit_mode is CommitMode.GROUP and len(lines) > 1:
                    self._batch_group(lines, attempt, ids)
                else:
                    self._batch_single(lines, attempt)  # removes the lines it answered
                return
            except psycopg.OperationalError as exc:
                if not self.connection.broken:
                    raise
                print(f"pepsi worker: database connection lost: {exc}", file=sys.stderr)
                self._ahead_rows = None  # read before the loss: load again
                self._pinned_ahead = None  # its transaction is gone
                self.connection.reconnect()
                attempt = Attempt.REDO
                ids = None

    def _batch_single(self, lines: list[bytes], attempt: Attempt) -> None:
        """Commit and answer one message at a time, removing its line when answered.

        Without group commit, lines that arrive meanwhile are read ahead with a
        message's commit (:class:`~.ahead.ReadAhead`), appended to ``lines`` and
        served in turn. (With group commit a lone id comes here too; what
        arrives meanwhile waits for the next batch, to be committed together.)
        """
        if self.pin is not None:
            self._single_pinned(lines, attempt, self.pin)
            return
        conn = self.connection.conn
        ahead = None
        if self.commit_mode is CommitMode.PER_MESSAGE:
            ahead = ReadAhead(self.reader.ready, lines)
        todo = self._load(conn, lines, attempt)
        while todo:
            for loaded in todo:
                if loaded.row is RELOAD:  # a second copy: read after the first committed
                    loaded = load_batch(conn, [loaded.line], use_lines=False)[0]
                scope = Scope(conn, ahead=ahead)
                self.in_hand.hold(loaded.message_id)
                answer = self.dispatch.process(loaded, scope, attempt)
                scope.commit()
                self.in_hand.clear()
                write_answers(self.answer_fd, [answer])
                del lines[0]
                attempt = Attempt.FIRST  # only the message in hand may have committed unanswered
                if self.state is RunnerState.STOPPING:
                    return
            todo = ahead.take(conn) if ahead is not None else []

    def _single_pinned(self, lines: list[bytes], attempt: Attempt, pin: Pin) -> None:
        """:meth:`_batch_single` with the pin: each message's transaction begins
        with its row pinned (one round trip, which is also its load); a message
        whose row is no longer ours is answered without starting its handler."""
        conn = self.connection.conn
        while lines:
            line = lines[0]
            message_id = parse_id(line)
            row, holder = None, None
            if message_id is not None:
                pinned = self._take_pinned([message_id], attempt)
                if pinned is None:
                    pinned = pin.begin(conn, [message_id])
                row, holder = pinned.get(message_id, (None, None))
            else:
                self._take_pinned([], Attempt.REDO)
            scope = Scope(conn, pinned=message_id is not None)
            if message_id is not None and not pin.startable(row, holder):
                answer = self._taken_over(pin, message_id, holder)
            else:
                self.in_hand.hold(message_id)
                answer = self.dispatch.process(Loaded(line, message_id, row), scope, attempt)
            scope.commit()
            self.in_hand.clear()
            write_answers(self.answer_fd, [answer])
            del lines[0]
            attempt = Attempt.FIRST
            if self.state is RunnerState.STOPPING:
                return

    @staticmethod
    def _taken_over(pin: Pin, message_id: int, holder: int | None) -> str:
        """Say on stderr that a message is not started; its answer."""
        answer = pin.taken_over(message_id, holder)
        print(f"pepsi worker: {answer[2:]}", file=sys.stderr)
        return answer

    def _batch_group(
        self, lines: list[bytes], attempt: Attempt, ids: list[int | None] | None = None
    ) -> None:
        """One transaction for the batch; statements of messages whose handler did not
        touch ``msg.db`` are deferred and sent together in one pipeline before the commit.

        A statement that fails without a savepoint of its own (a NUL in a string
        of ``msg.state``, say) aborts the transaction: nothing of the batch
        committed. The batch is then redone one message at a time, each in its
        own transaction, so that the failing statement fails only its own
        message (its handler runs again, as after a lost connection)."""
        while lines:
            try:
                done = self._group_once(lines, attempt, ids)
            except BatchFailed as exc:
                print(
                    f"pepsi worker: {exc}; redoing its {len(lines)} messages one at a time",
                    file=sys.stderr,
                )
                self._batch_single(lines, attempt)
                return
            del lines[:done]  # answered: a redo after a lost connection skips them
            attempt = Attempt.FIRST
            ids = None
            if self.state is RunnerState.STOPPING:
                return

    def _group_once(
        self, lines: list[bytes], attempt: Attempt, ids: list[int | None] | None = None
    ) -> int:
        """One transaction for the first of ``lines`` (all of them, unless the
        handlers have run for :data:`GROUP_WINDOW`); how many were answered.
        Raises :class:`BatchFailed`, rolled back, when it cannot commit."""
        conn = self.connection.conn
        batch = GroupBatch(conn, self.set_based)
        try:
            if self.pin is not None:
                loaded = self._pin_group(batch, lines, attempt, ids)
            else:
                loaded = self._load(conn, lines, attempt, ids)
            answers, ending = self._group_messages(loaded, batch, attempt)
            if isinstance(ending, TransactionEnded):
                return self._settle_ended(lines, answers, batch)
            self._read_ahead(batch)
            batch.commit()
            self._ahead_rows = batch.ahead_rows
            if batch.ahead_pinned is not None and batch.pin_ahead is not None:
                self._pinned_ahead = (frozenset(batch.pin_ahead[1]), batch.ahead_pinned)
        except BaseException:
            batch.rollback()
            raise
        for slot, lost in batch.lost.items():
            print(f"pepsi worker: {lost}", file=sys.stderr)
            answers[slot] = f"1 {one_line(lost)}"
        write_answers(self.answer_fd, answers)
        if ending is not None:
            raise ending
        return len(answers)

    def _settle_ended(self, lines: list[bytes], answers: list[str], batch: GroupBatch) -> int:
        """A handler ended the batch's transaction (its message, the last of
        ``answers``, is failed and answered so): the messages before it were
        committed with it, or rolled back. Each whose row has moved on (its
        transition committed) is answered as its handler said; each still
        running at our stage is run again on its own. In order, each line
        removed from ``lines`` once answered (a lost connection meanwhile redoes
        only the rest); 0 (none left to remove)."""
        offender = len(answers) - 1
        for slot, lost in batch.lost.items():
            if slot < offender:
                print(f"pepsi worker: {lost}", file=sys.stderr)
                answers[slot] = f"1 {one_line(lost)}"
        ids = parse_ids(lines[:offender])
        wanted = [i for i in ids if i is not None]
        conn = self.connection.conn
        rows = {}
        if wanted:
            rows = {r[0]: r for r in conn.execute(GET_MESSAGES, (Ids(wanted),)).fetchall()}
        self._ahead_rows = None  # read before: not for a message run again
        for slot, message_id in enumerate(ids):
            row = rows.get(message_id) if message_id is not None else None
            if row is not None and row[2] == "running" and row[1] == self.dispatch.stage:
                self._batch_single(lines[:1], Attempt.REDO)  # rolled back: again
            else:
                write_answers(self.answer_fd, [answers[slot]])
            del lines[0]
        write_answers(self.answer_fd, [answers[offender]])
        del lines[0]
        return 0

    def _load(
        self,
        conn: psycopg.Connection,
        lines: list[bytes],
        attempt: Attempt,
        ids: list[int | None] | None = None,
    ) -> list[Loaded]:
        """The lines with their rows (``ids``: theirs, parsed here if not given):
        from row lines, or read ahead with the last commit, when every id was
        (once, and not after a lost connection), else loaded now. After a lost
        connection every row is loaded again (it may have moved since)."""
        if ids is None:
            ids = parse_ids(lines)
        first = attempt is Attempt.FIRST
        rows = self._ahead_rows
        wanted = {i for i in ids if i is not None}
        if rows is not None and first and wanted <= self._ahead_ids:
            self._ahead_rows = None  # each row read ahead is used once
            return load_batch(conn, lines, ids, read=rows)
        return load_batch(conn, lines, ids, use_lines=first)

    def _pin_group(
        self,
        batch: GroupBatch,
        lines: list[bytes],
        attempt: Attempt,
        ids: list[int | None] | None,
    ) -> list[Loaded]:
        """The lines with their rows, pinned (sdk/pinning.py): with the last
        commit when they were waiting then, else in the batch's first round
        trip. Current rows: rows on the lines and rows read ahead are not used."""
        assert self.pin is not None
        if ids is None:
            ids = parse_ids(lines)
        self._ahead_rows = None
        wanted = [i for i in ids if i is not None]
        pinned = self._take_pinned(wanted, attempt)
        if pinned is not None:
            return loaded_lines(lines, batch.adopt(pinned), ids)
        return loaded_lines(lines, batch.pin(self.pin, wanted), ids)

    def _take_pinned(self, ids: list[int], attempt: Attempt) -> PinnedRows | None:
        """The rows pinned with the last commit, if they are these ids' (the first
        attempt); its transaction is then the caller's. Otherwise that
        transaction, if any, is rolled back (its pins go) and None returned."""
        ahead, self._pinned_ahead = self._pinned_ahead, None
        if ahead is None:
            return None
        pinned_ids, rows = ahead
        if ids and attempt is Attempt.FIRST and pinned_ids.issuperset(ids):
            return rows
        conn = self.connection.conn
        if not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
        return None

    def _read_ahead(self, batch: GroupBatch) -> None:
        """Take the id lines waiting on stdin (if none are taken yet), for the
        batch's commit to load their rows in its round trip."""
        if self._ahead_lines:
            return
        self._ahead_lines = lines = self.reader.ready()
        self._ahead_line_ids = line_ids = parse_ids(lines)
        self._ahead_ids = {i for i in line_ids if i is not None}
        if self.pin is not None:
            # The next batch's rows: pinned after this batch's COMMIT, in its round trip.
            wanted = [i for i in line_ids if i is not None]
            if wanted and self.state is not RunnerState.STOPPING:
                batch.pin_ahead = (self.pin, wanted)
            return
        # A row line brings its row: only bare ids are read with the commit.
        batch.read_ahead = Ids(
            i
            for line, i in zip(lines, line_ids, strict=True)
            if i is not None and not carries_row(line)
        )

    def _group_messages(
        self, loaded: list[Loaded], batch: GroupBatch, attempt: Attempt
    ) -> tuple[list[str], BaseException | None]:
        """Process the batch's messages, each in its savepoint; their answers, and the
        SystemExit or KeyboardInterrupt a handler raised (to re-raise after answering).

        Once the handlers have run for :data:`GROUP_WINDOW` the group stops taking
        messages (the rest go in the next one): a slow handler does not hold the
        answers of the messages before it, whose time the dispatcher counts
        against MAX_RUNTIME."""
        answers: list[str] = []
        started = time.monotonic()
        holders, pin = batch.holders, self.pin
        for slot, item in enumerate(loaded):
            batch.slot = slot
            if holders is not None and pin is not None and item.message_id is not None:
                holder = holders.get(item.message_id)
                if not pin.startable(item.row, holder):
                    answers.append(self._taken_over(pin, item.message_id, holder))
                    continue
            scope = Scope(batch.conn, CommitMode.GROUP, batch)
            self.in_hand.hold(item.message_id)
            try:
                answer = self.dispatch.process(item, scope, attempt)
            except TransactionEnded as exc:
                # The handler committed or rolled back the batch's transaction:
                # its message is failed (on its own); the batch is settled by
                # :meth:`_settle_ended`, the rest go in the next one.
                self.in_hand.clear()
                answers.append(exc.answer or "1 failed")
                return answers, exc
            except (SystemExit, KeyboardInterrupt) as exc:
                # A handler ends the process (sys.exit): commit and answer the
                # messages before it first, so that this one is the head of line
                # the dispatcher blames, not the group's first, innocent message.
                scope.rollback_to(0)
                batch.forget(slot)
                return answers, exc
            scope.commit()
            self.in_hand.clear()
            answers.append(answer)
            if self.state is RunnerState.STOPPING:
                break
            if time.monotonic() - started >= GROUP_WINDOW:
                break
        return answers, None
