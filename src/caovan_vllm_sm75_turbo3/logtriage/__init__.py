"""Log triage: read a vLLM server log and explain, in plain words, what failed and how to fix it.

`triage.triage_path(path)` gives a `Triage`; `render.render_text(triage)` is its report in words;
`signatures.SIGNATURES` are the known messages (`python -m caovan_vllm_sm75_turbo3.logtriage.signatures`
prints them as the table in docs/logtriage.md). Nothing here imports torch, triton or vllm.
"""
