"""``nys approx-error``: ``command`` (config -> rows, tables, figures) and the numerical work,
one job per module.

``settings``: what the config's open keys come to (n, budgets, dtype, budget unit);
``sources``: where Q, K, V come from (synthetic draws, a real BERT); ``methods``: the
approximations at budget m and the matrix each implies; ``metrics``: error measures;
``evaluate``: exact reference and every metric per head; ``cache``: the work a sweep's jobs
share; ``memory``: the peak estimated and refused before anything is allocated; ``summary``:
mean and spread per method and budget; ``tables``: the summary as rich tables; ``plots``: error
versus budget, and S next to Ŝ; ``fidelity``: a checkpoint's sentence embeddings against exact
attention's; ``progress``: the bar and the run log; ``sample_text``: the built-in offline text.
"""
