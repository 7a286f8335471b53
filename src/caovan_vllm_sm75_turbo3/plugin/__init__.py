"""Code that runs inside vLLM processes (the `vllm.general_plugins` entry point)."""
