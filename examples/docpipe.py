#!/usr/bin/env python3
"""docpipe: a sample pepsi-dispatch pipeline that turns raw invoices into rows.

    fetch ──(fused)──▶ normalise ──▶ extract ──▶ store

* fetch      "downloads" the document named in the payload (no network here: the
             documents are generated from the payload's doc_id). The source is
             flaky: some documents are busy on the first tries, and the stage
             pauses them briefly; the dispatcher retries them at this stage
             (a few never come back: their retries run out and they fail).
* normalise  collapses whitespace and unifies case and separators; fused into
             fetch's pass (Advance("normalise", fuse=True)), so it costs no
             extra round through the dispatcher.
* extract    pulls invoice number, customer, date and total out of the text;
             malformed documents fail here with a reason.
* store      upserts the result into docpipe.invoices through msg.db, in the
             same transaction as the row's final transition (exactly once).

Run by the dispatcher as ``docpipe.py [-c CONFIG] worker`` (see pepsi.conf next
to this file). ``docpipe.py init`` creates the docpipe.invoices table.
"""

from __future__ import annotations

import os
import re
import sys
from datetime import date, timedelta

from pepsi_dispatch.worker import Advance, Fail, Finish, Message, Pause, run

CUSTOMERS = ["Acme GmbH", "Globex Ltd", "Initech SA", "Umbrella AG", "Hooli Inc", "Stark & Co"]
#: Every FLAKY-th document is busy on its first BUSY_TRIES fetches.
FLAKY, BUSY_TRIES = 7, 2
#: Every GONE-th document is never available: its retries run out (MAX_RETRIES).
GONE = 97
#: Every MALFORMED-th document has no total and fails in extract.
MALFORMED = 41
RETRY_DELAY = float(os.environ.get("DOCPIPE_RETRY_DELAY", "0.3"))

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS docpipe;
CREATE TABLE IF NOT EXISTS docpipe.invoices (
    doc_id     bigint PRIMARY KEY,
    number     text NOT NULL,
    customer   text NOT NULL,
    issued     date NOT NULL,
    total      numeric(12, 2) NOT NULL,
    message_id bigint NOT NULL,
    stored_at  timestamptz NOT NULL DEFAULT now()
);
"""


def generate(doc_id: int) -> str:
    """The raw text of document ``doc_id``: messy spacing and case, like a real scan."""
    customer = CUSTOMERS[doc_id % len(CUSTOMERS)]
    issued = date(2026, 1, 1) + timedelta(days=doc_id % 330)
    cents = (doc_id * 7919) % 500_000 + 100
    lines = [
        f"  INVOICE   No.  INV-{doc_id:06d}",
        f"Customer :   {customer.upper() if doc_id % 2 else customer}",
        f"Date:{issued.isoformat()}",
        f"  {doc_id % 5 + 1}  x  widget\t\t{cents / 100:.2f}",
    ]
    if doc_id % MALFORMED != 0:
        lines.append(f"TOTAL   DUE :  EUR {cents / 100:,.2f}")
    return "\r\n".join(lines)


def fetch(msg: Message) -> Advance | Pause:
    doc_id = int(msg.payload["doc_id"])
    if doc_id % GONE == 0 or (doc_id % FLAKY == 0 and msg.retries < BUSY_TRIES):
        return Pause(RETRY_DELAY, reason=f"source busy (try {msg.retries + 1})")
    msg.state["raw"] = generate(doc_id)
    return Advance("normalise", fuse=True)


def normalise(msg: Message) -> Advance:
    lines = (" ".join(line.split()) for line in msg.state.pop("raw").splitlines())
    msg.state["text"] = "\n".join(line.lower().replace(" :", ":") for line in lines if line)
    return Advance("extract")


FIELDS = {
    "number": re.compile(r"invoice no\. (inv-\d+)"),
    "customer": re.compile(r"customer: (.+)"),
    "issued": re.compile(r"date:\s*(\d{4}-\d{2}-\d{2})"),
    "total": re.compile(r"total due: eur ([\d,]+\.\d{2})"),
}


def extract(msg: Message) -> Advance | Fail:
    text = msg.state["text"]
    found = {name: rx.search(text) for name, rx in FIELDS.items()}
    missing = [name for name, m in found.items() if m is None]
    if missing:
        return Fail(f"malformed document {msg.payload['doc_id']}: no {', '.join(missing)}")
    fields = {name: m.group(1) for name, m in found.items() if m is not None}
    fields["number"] = fields["number"].upper()
    fields["customer"] = fields["customer"].title()
    fields["total"] = fields["total"].replace(",", "")
    msg.state["fields"] = fields
    del msg.state["text"]
    return Advance("store")


def store(msg: Message) -> Finish:
    f = msg.state["fields"]
    msg.db.execute(
        "INSERT INTO docpipe.invoices (doc_id, number, customer, issued, total, message_id)"
        " VALUES (%s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (doc_id) DO UPDATE SET number = EXCLUDED.number,"
        " customer = EXCLUDED.customer, issued = EXCLUDED.issued, total = EXCLUDED.total,"
        " message_id = EXCLUDED.message_id, stored_at = now()",
        (msg.payload["doc_id"], f["number"], f["customer"], f["issued"], f["total"], msg.id),
    )
    return Finish()


def init(dsn: str | None = None) -> None:
    """Create the docpipe.invoices table (idempotent)."""
    import psycopg

    from pepsi_dispatch.enqueue import resolve_dsn

    with psycopg.connect(resolve_dsn(dsn), autocommit=True) as conn:
        conn.execute(SCHEMA)


if __name__ == "__main__":
    if sys.argv[1:] == ["init"]:
        init()
    else:
        # group_commit: the ids already waiting are handled in one transaction, one commit.
        run(
            {"fetch": fetch, "normalise": normalise, "extract": extract, "store": store},
            group_commit=os.environ.get("DOCPIPE_GROUP_COMMIT", "1") != "0",
        )
