"""Reads the machine (GPUs via NVML, toolchain, versions, memory). Read-only; never raises on a missing piece."""
