"""``nys finetune`` (Table 2): ``command`` (train and test one task), ``model`` (the encoder a
run starts from), ``tasks`` (task -> examples and objective), ``evaluate`` (``eval_only``:
direct deployment of a trained classifier with another attention)."""
