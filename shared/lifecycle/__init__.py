"""The job-lifecycle store: the only code that knows RQ's storage layout and writes it.

``layout`` names RQ's keys, ``scripts`` holds the named Lua scripts (each declaring its keys), and
``store`` is the Python API the API and the workers call.
"""
