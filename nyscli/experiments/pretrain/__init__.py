"""``nys pretrain`` (Fig. 5/6): ``command`` (corpus, model, training, checkpoint) and
``objectives`` (MLM + SOP, and hidden-state distillation)."""
