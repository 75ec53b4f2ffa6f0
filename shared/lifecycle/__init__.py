"""The job-lifecycle store: the only code that knows RQ's storage layout and writes it.

A job's way, by file: ``submit`` (the API's side: enqueue, read back, cancel), ``claims`` (the worker's:
claim, pop, start, keep alive, give back, rescue), ``finish`` (the worker stores a batch's ends); ``bulk`` and
``upload`` the same for bulk batches. ``layout`` names RQ's keys, ``rqhash`` parses what RQ stores, ``scripts``
and ``bulk_scripts`` name the Lua scripts (each in ``lua/<name>.lua``, declaring its keys) and ``calls`` holds
what their calls share.
"""
