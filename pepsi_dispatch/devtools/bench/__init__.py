"""The benchmark: make bench (python -m pepsi_dispatch.devtools.bench)."""
