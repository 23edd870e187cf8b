"""mint: mints batch descriptions `(lower, upper, append_worker)` and broadcasts them on the
single-partition `<sink>.descs` topic (port of the seed's `mint` operator; see
DESIGN §4). One active instance per sink replica: a second one is fenced by the Kafka
transaction id `mint.<sink>`.

The operator lands with issue #4; until then `python -m services.mint` validates its
configuration and exits 3.
"""
