"""Long Range Arena data: generators (ListOps, Pathfinder) and readers for every task.

Each ``load_*`` returns a :class:`~nyscli.data.common.TaskData` with ``train``/``val``/
``test`` torch datasets, ``vocab_size``, ``num_classes`` and a ``collate`` for DataLoader:

* :func:`load_listops` (generated, or the release's ``basic_*.tsv``),
* :func:`load_imdb` (aclImdb folder, CSV, or HF ``imdb``),
* :func:`load_aan` (release ``new_aan_pairs.*.tsv``; pairs of documents),
* :func:`load_cifar10` and :func:`load_fashion_mnist` (grey 32x32 images),
* :func:`load_pathfinder` (generated, or the release's ``pathfinder32`` folder).

User-facing problems raise :class:`DataError` (a ValueError) with a one-line message.
"""

from nyscli.data.common import DataError, TaskData
from nyscli.data.image import load_cifar10, load_fashion_mnist
from nyscli.data.listops import ListOpsConfig, load_listops
from nyscli.data.pathfinder import PathfinderConfig, load_pathfinder
from nyscli.data.retrieval import load_aan
from nyscli.data.text import load_imdb

__all__ = [
    "DataError",
    "ListOpsConfig",
    "PathfinderConfig",
    "TaskData",
    "load_aan",
    "load_cifar10",
    "load_fashion_mnist",
    "load_imdb",
    "load_listops",
    "load_pathfinder",
]
