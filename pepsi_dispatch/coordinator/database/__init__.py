"""The coordinator's database side: connections, calls, the link's states, one wake's round trip."""
