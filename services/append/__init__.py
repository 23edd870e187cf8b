"""append: commits all staged parts of a batch description with one compare-and-append on the
shard and publishes the new upper to `frontiers` (port of the seed's `append` operator; see
DESIGN §4).

The operator lands with issue #4; until then `python -m services.append` validates its
configuration and exits 3.
"""
