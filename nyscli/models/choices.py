"""The names a model's config chooses among, torch-free: the command line checks a choice
against them before torch is imported (``nyscli.launch.compose.early_refusal``)."""

# How the encoder's Linear layers start; embeddings are N(0, init_std) either way.
# normal: N(0, init_std) weights and zero biases, as BERT's reference code (pre-training, and
#   every BERT checkpoint's architecture).
# torch: PyTorch's own default (Kaiming-uniform weights and biases), as the paper's LRA code
#   (mlpen/Nystromformer LRA/code), whose Linear layers are never re-initialised. With a
#   width of 64 that is ~3x larger weights than N(0, 0.02); after 200 Image steps it gave
#   64.7% dev accuracy instead of 56.4% (Nyström, 3 seeds; docs/results/training-profile.md).
INITS = ("normal", "torch")
POOLINGS = ("mean", "cls")  # how a sequence becomes one vector (pooling.pool)
