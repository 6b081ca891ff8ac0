"""A slow oracle for T5's relative position buckets, one position at a time.

Follows the definition of Raffel et al. (2020), "Exploring the Limits of Transfer Learning
with a Unified Text-to-Text Transformer", §2.1, as written in mesh-tensorflow's
``transformer_layers._relative_position_bucket``: one relative position at a time, in
plain Python integers and ``math.log``; no torch, so it shares no code with attnkit.

``relative_position`` is ``memory_position - query_position`` (key minus query): negative
when the key lies in the past.

* bidirectional: half the buckets for keys in the past or at the query, half for keys in
  the future; within each half, ``max_exact = num_buckets_per_direction // 2`` buckets hold
  the distances 0 .. max_exact - 1 exactly, the rest cover max_exact .. max_distance on a
  log scale, and every distance >= max_distance shares the last bucket of its half.
* unidirectional (decoders): keys in the future all share bucket 0, the query's own
  (they are masked anyway); keys in the past use all ``num_buckets`` buckets as above.
"""

from __future__ import annotations

import math


def bucket(relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """The bucket of one relative position (key position minus query position)."""
    n = -relative_position  # distance into the past
    ret = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:  # the key is in the future: second half of the buckets
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    # log-spaced: max_exact + floor(log(n / max_exact) / log(max_distance / max_exact)
    #                               * (num_buckets - max_exact)), capped at the last bucket
    scaled = math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    large = max_exact + int(scaled)  # int() truncates toward 0; scaled >= 0 here
    return ret + min(large, num_buckets - 1)


def buckets(relative_positions: list[int], bidirectional: bool, num_buckets: int, max_distance: int) -> list[int]:
    return [bucket(r, bidirectional, num_buckets, max_distance) for r in relative_positions]
