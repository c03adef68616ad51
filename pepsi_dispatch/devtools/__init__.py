"""Developer tooling run from a checkout (benchmark, demo, embedded cluster); not in the wheel."""
