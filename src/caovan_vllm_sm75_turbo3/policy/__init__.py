"""Pure decisions: facts + settings -> checks, env changes, vLLM arguments, status lines. No I/O."""
