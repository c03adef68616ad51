"""The worker contract's constants, each defined once.

Both sides of the pipe protocol read them from here: the dispatcher (which
classifies answers and exits) and the Python SDK (which writes answers and
chooses its exit code). Stage programs in other languages find the same
values in docs/WORKERS.md.
"""

from __future__ import annotations

import re
from typing import Final

#: Exit code of a worker that could not reach the database (EX_TEMPFAIL of
#: sysexits.h): nothing it held is done; the dispatcher releases its messages
#: without failing any and cools the stage down.
EX_TEMPFAIL: Final = 75

#: Exit code of a worker whose own stage is not in the configuration it found
#: (EX_CONFIG of sysexits.h): it processed nothing; the dispatcher releases its
#: messages, logs an ERROR naming the fix and holds the stage off.
EXIT_NO_STAGE: Final = 78

#: Answer lines longer than this are cut (and, being no valid answer of that
#: length, end up as protocol errors or failures with a truncated reason).
MAX_LINE: Final = 8192

#: An answer's number longer than this is no number but garbage (a protocol
#: error). Python itself refuses int() of more than 4,300 digits.
MAX_NUMBER_DIGITS: Final = 4300

#: What a stage name may be made of (config sections, NEXT, ``fused=`` lists).
STAGE_NAME_RE: Final = re.compile(r"[A-Za-z0-9_.-]+")

#: A stage's MAX_RETRIES when the configuration does not say.
DEFAULT_MAX_RETRIES: Final = 10

#: "Never": a deadline that is not due, the timeout of a selector with nothing to wait for.
INF: Final = float("inf")

#: The in-hand slot (an opt-in extension of the protocol, docs/WORKERS.md): the
#: environment variable naming its file descriptor, a shared memory file of
#: INHAND_SIZE bytes. Its first word (INHAND_WORD: a signed 64-bit integer in
#: the machine's byte order) is 0 while the worker does not use it,
#: NONE_IN_HAND while no handler runs, else the id of the message whose handler
#: runs; its second word holds capability bits (CAN_TEMPLATE, CAN_TAKE_ROWS).
INHAND_ENV: Final = "PEPSI_INHAND_FD"
INHAND_WORD: Final = "=q"
INHAND_SIZE: Final = 16
NONE_IN_HAND: Final = -1
#: Capability bit: the program can be started as a template that forks the
#: stage's workers on request (TEMPLATE_ENV names its socket).
CAN_TEMPLATE: Final = 1
#: Capability bit: the worker takes rows on its pipe. The dispatcher may then
#: write a claimed message as one line "ID<TAB>STAGE<TAB>RETRIES<TAB>PAYLOAD<TAB>STATE"
#: (payload and state in jsonb's text form, which holds no tab or newline)
#: instead of the bare id, so that the worker need not read the row itself. A
#: bare id line can still come (a row longer than ROW_LINE_MAX bytes, a claim
#: made before the bit was seen); the answers are the same either way.
CAN_TAKE_ROWS: Final = 2
#: The longest row line the dispatcher writes (bytes, newline excluded).
ROW_LINE_MAX: Final = 4096
TEMPLATE_ENV: Final = "PEPSI_TEMPLATE_FD"
#: Offered to an exec'd worker of a stage that has no template yet: a socket on
#: which the worker may fork the stage's template from itself, before it connects
#: (it sends ``ready PID`` once the dispatcher is the template's parent).
TEMPLATE_OFFER_ENV: Final = "PEPSI_TEMPLATE_OFFER_FD"


#: The oldest schema revision (alembic, migrations/versions/) this code runs
#: against: the dispatcher refuses to start below it (exit 2, "run
#: pepsi-queue migrate"), so no code path serves an older schema. It is the
#: newest migration shipped with this package (a test keeps them equal).
SCHEMA_FLOOR = "0045"
