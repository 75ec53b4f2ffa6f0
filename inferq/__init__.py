"""The `inferq` command line: composes the API, workers and an embedded Redis."""
