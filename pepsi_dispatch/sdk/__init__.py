"""The parts of the Python SDK for stage programs (issue 7); the public API is
:mod:`pepsi_dispatch.worker`, which re-exports what stage programs use.

* :mod:`.transitions` -- what a handler sees and returns (Message, Advance, ...);
* :mod:`.pipe` -- the pipe protocol: reading id lines, writing answer lines;
* :mod:`.connection` -- the one database connection and its reconnect;
* :mod:`.statements` -- the SQL API calls a transition becomes;
* :mod:`.transaction` -- transaction scopes and group commit;
* :mod:`.dispatch` -- handler dispatch: one message through its handlers;
* :mod:`.runner` -- :class:`~.runner.StageRunner`, the read/process/answer loop;
* :mod:`.entry` -- start-up (:func:`~.entry.run`).
"""
