"""pepsi-httpd: /metrics, /healthz and the web dashboard, a process of its own.

The dispatcher's loop stays LISTEN, pipes and timers; everything HTTP lives
here and reads the database through the ``pepsi.dashboard_*`` functions
(role ``pepsi_dashboard``). See docs/OPERATIONS.md.
"""
