"""``python -m pepsi_dispatch.httpd``: the same as ``pepsi-httpd``."""

from .server import main

main()
