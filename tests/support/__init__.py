"""What test files share, one module per concept; no test file imports another.

Lanes (markers set by folder in tests/conftest.py): ``tests/unit`` runs in-process only; ``tests/integration``
adds the session's redis-server; ``tests/e2e`` starts processes (the API, workers, CLIs, Redis groups, docker).
``stack`` and ``ha`` start processes: only end-to-end tests import them.
"""
