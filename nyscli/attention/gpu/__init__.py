"""The attention core's GPU ops: Triton kernels, their launchers and the CUDA graphs."""
