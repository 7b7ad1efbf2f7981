"""Long Range Arena data: generators (ListOps, Pathfinder) and readers for every task, and the
other commands' text (pre-training corpora, GLUE, tables of labelled text).

Each LRA ``load_*`` returns a :class:`~nyscli.data.common.TaskData` with ``train``/``val``/
``test`` torch datasets, ``vocab_size``, ``num_classes`` and a ``collate`` for DataLoader:

* :func:`~nyscli.data.listops.load_listops` (generated, or the release's ``basic_*.tsv``),
* :func:`~nyscli.data.text.load_imdb` (aclImdb folder, CSV, or HF ``imdb``),
* :func:`~nyscli.data.retrieval.load_aan` (release ``new_aan_pairs.*.tsv``; pairs of documents),
* :func:`~nyscli.data.image.load_cifar10` and :func:`~nyscli.data.image.load_fashion_mnist`
  (grey 32x32 images),
* :func:`~nyscli.data.pathfinder.load_pathfinder` (generated, or the release's
  ``pathfinder32`` folder).

User-facing problems raise :class:`~nyscli.data.common.DataError` (a ValueError) with a
one-line message. ``choices`` holds the names a data config chooses among; this file imports
nothing, so ``nyscli.data.choices`` loads without torch.
"""
