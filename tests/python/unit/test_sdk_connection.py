"""Unit tests of the SDK (no database): the connection holder."""

from __future__ import annotations

import psycopg
import pytest
from sdk_fakes import FakeConn

from pepsi_dispatch.sdk.connection import ConnectionHolder


def test_connection_holder_without_connect_cannot_reconnect() -> None:

    holder = ConnectionHolder(FakeConn(), None, timeout=0)
    with pytest.raises(psycopg.OperationalError, match="no way to reconnect"):
        holder.reconnect()
