"""vLLM's side of the exports: its tuned-config file names, where it reads them, and (loaded from a
vLLM source the user supplies, never committed here) its Triton kernels with launches of our own."""
