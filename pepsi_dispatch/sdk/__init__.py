"""The parts of the Python SDK for stage programs; the public API is
:mod:`pepsi_dispatch.worker`, which re-exports what stage programs use.

* :mod:`.message` -- what a handler sees and returns (Message, Advance, ...);
* :mod:`.pipe` -- the pipe protocol: reading id lines, writing answer lines;
* :mod:`.loading` -- id lines parsed and their rows loaded;
* :mod:`.ahead` -- rows read ahead with a message's commit;
* :mod:`.connection` -- the one database connection and its reconnect;
* :mod:`.statements` -- the SQL API calls a transition becomes;
* :mod:`.transaction` -- transaction scopes and group commit;
* :mod:`.inhand` -- the in-hand slot: which message's handler runs (crash blame);
* :mod:`.template` -- the template process that forks a stage's workers;
* :mod:`.routing` -- handler routing: one message through its handlers;
* :mod:`.runner` -- :class:`~.runner.StageRunner`, the read/process/answer loop;
* :mod:`.entry` -- start-up (:func:`~.entry.run`).
"""
