"""The HTTP API: accepts jobs, answers with IDs, serves results and events."""
