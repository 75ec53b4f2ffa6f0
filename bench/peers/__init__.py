"""Peers for the benchmark, each built the way its users build it, behind one HTTP contract:

POST /jobs (raw input bytes) -> 202 {"id"} (or 200 with the result, for a synchronous server);
GET /jobs/{id}?wait=S -> {"id", "status", "result"}; GET /healthz.
"""
