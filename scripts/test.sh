#!/usr/bin/env bash
# Usage: bash scripts/test.sh [--fast] [PYTEST ARGS...]
#
#   (default)  the full suite, in the vLLM venv: .venv (CAOVAN_TEST_VENV), built if missing
#              (vllm==0.21.0 from PyPI, about 5 minutes and 8 GB). Every marked test runs there.
#   --fast     only the tests that need neither vLLM, torch nor Triton (markers vllm, torch,
#              triton, triton_compile in pyproject.toml), in a light venv: .venv-fast
#              (CAOVAN_TEST_FAST_VENV) with this project and its test extras only. About a minute.
#   --help     this text.
#
# Both install this project editable with its test extras first. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

case "${1:-}" in
  -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  --fast) shift; lane=fast ;;
  *) lane=full ;;
esac

if [ "$lane" = fast ]; then
  VENV=${CAOVAN_TEST_FAST_VENV:-.venv-fast}
  LANE_ARGS=(-m "not vllm and not torch and not triton and not triton_compile")
  if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating $VENV (this project and its test extras only)"
    "$PY" -m venv "$VENV"
  fi
else
  VENV=${CAOVAN_TEST_VENV:-.venv}
  LANE_ARGS=(--full-lane)  # tests/conftest.py: a missing vLLM, torch or Triton is an error here, not a skip
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('vllm') == '0.21.0'" 2>/dev/null; then
    echo "== creating $VENV with vllm==0.21.0 (about 5 minutes, 8 GB)"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q "vllm==0.21.0"
  fi
fi
"$VENV/bin/pip" install -q -e ".[test]"
echo "== running the $lane tests"
# pytest's exit status is ours: 5 (no test collected) fails CI like a failing test.
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs "${LANE_ARGS[@]}" "$@"
