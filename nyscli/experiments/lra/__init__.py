"""``nys lra`` (Table 3): ``command`` (one task, one attention: train, test, rows), ``tasks``
(task name -> data and objective), ``table`` (the paper's Table 3 beside our rows)."""
