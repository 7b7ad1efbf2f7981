"""``nys approx-error``: ``command`` (config -> rows, tables, figures) and the numerical work,
one job per module.

``sources``: where Q, K, V come from (synthetic draws, a real BERT); ``methods``: the
approximations at budget m and the matrix each implies; ``metrics``: error measures;
``evaluate``: exact reference and every metric per head; ``summary``: mean and spread per
method and budget; ``plots``: error versus budget, and S next to Ŝ; ``sample_text``: the
built-in offline text.
"""
