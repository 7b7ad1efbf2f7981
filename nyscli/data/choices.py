"""The names a data config chooses among, torch-free: the command line checks a choice against
them before torch is imported (``nyscli.launch.compose.early_refusal``)."""

# Pathfinder's difficulty -> the contour length of its paths (pathfinder.py draws them).
DIFFICULTY_CONTOUR_LENGTH = {"easy": 6, "intermediate": 9, "hard": 14}
CORPUS_SOURCES = ("folder", "hf", "wiki_summaries")  # pre-training text (corpus.read_corpus)
TOKENIZER_KINDS = ("wordpiece", "vocab_file", "bert_base_uncased")  # pretraining.py
