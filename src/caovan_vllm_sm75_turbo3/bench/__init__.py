"""`caovan-sm75-bench`: what a running vLLM server really decodes and prefills, and why it may be slow."""
