#!/usr/bin/env bash
# Build the test environment if it is missing (vLLM 0.21.0 from PyPI + this project with its
# test extras), then run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CAOVAN_TEST_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('vllm') == '0.21.0'" 2>/dev/null; then
  echo "== creating $VENV with vllm==0.21.0 (about 5 minutes, 8 GB)"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "vllm==0.21.0"
fi
"$VENV/bin/pip" install -q -e ".[test]"
echo "== running the tests"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
