"""GPU kernels, their torch references, and the sm_75 tensor-core rewrite. Imports neither vLLM nor the layers above."""
