"""``nys bench`` (Table 1): ``command`` (config -> rows, table, plot), ``rounds`` (interleaved
timing of one n across rows), ``worker`` (one point in a fresh process), ``timing`` and
``memory`` (how a call is timed and its peak memory read)."""
