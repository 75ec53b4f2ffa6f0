"""The benchmark: `make bench` (python -m bench.run)."""
