#!/usr/bin/env bash
# nvcc for FlashInfer's JIT in the engine check's sm75 mode (run_device.sh names it FLASHINFER_NVCC):
# FlashInfer builds `-gencode=arch=compute_75,code=sm_75`, Turing machine code that the lent H100
# cannot load; here every `code=sm_75` becomes `code=compute_75`, so the module embeds sm_75 PTX
# (FlashInfer's Turing path: mma m16n8k8) and the driver compiles it for the card at start, as it
# does for our Triton kernels. NVCC names the real compiler (default /usr/local/cuda/bin/nvcc).
args=()
for a in "$@"; do args+=("${a//code=sm_75/code=compute_75}"); done
exec "${NVCC:-/usr/local/cuda/bin/nvcc}" "${args[@]}"
