#!/usr/bin/env bash
# Usage: bash scripts/test.sh [--fast | --tritons] [PYTEST ARGS...]
#
#   (default)  the full suite, in the vLLM venv: .venv (CAOVAN_TEST_VENV), built if missing
#              (vllm==0.21.0 from PyPI, about 5 minutes and 8 GB). Every marked test runs there.
#   --fast     only the tests that need neither vLLM, torch nor Triton (markers vllm, torch,
#              triton, triton_compile in pyproject.toml), in a light venv: .venv-fast
#              (CAOVAN_TEST_FAST_VENV) with this project and its test extras only. About a minute.
#   --tritons  our own GDN kernels and the Turbo hook against every other Triton that a supported
#              vLLM release pins (data/vllm_release_pins.json; 0.21.0's is the full lane's), each in
#              a venv holding Triton, this project and its test extras only (.venv-triton37, ...; no
#              torch, no vLLM): the hook's protocol and compile tests, then `caovan-sm75-kernels check`
#              of _prep_kernel and _state_kernel (every pinned config plain and turbo for sm_75), and
#              one recorded passing config of each vLLM FLA GDN variant that ships with that Triton
#              (tests/test_fla_releases.py, committed copies in tests/data/fla_variants/; about 40 s).
#              About 4 minutes per Triton on 2 cores, plus its 200-250 MB wheel.
#   --vllm034  the tests marked vllm034 (our attention backend against a real vLLM 0.34), in
#              .venv-vllm034 (CAOVAN_TEST_VLLM034_VENV), built if missing: vllm==0.34.0 without
#              its FlashInfer pin (0.7.3 is not on the index; the tests do not use it), then its
#              other requirements. About 2 minutes from a warm pip cache, 9 GB.
#   --help     this text.
#
# Both install this project editable with its test extras first. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

case "${1:-}" in
  -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  --fast) shift; lane=fast ;;
  --vllm034) shift; lane=vllm034 ;;
  --tritons) shift; lane=tritons ;;
  *) lane=full ;;
esac

if [ "$lane" = tritons ]; then
  pins=$("$PY" -c '
import json
rel = json.load(open("src/caovan_vllm_sm75_turbo3/data/vllm_release_pins.json"))["releases"]
print(" ".join(sorted({r["triton"] for r in rel.values()} - {rel["0.21.0"]["triton"]})))')
  for pin in $pins; do
    case "$pin" in [0-9]*) req="triton==$pin" ;; *) req="triton$pin" ;; esac
    VENV=.venv-triton$(echo "$pin" | sed -E 's/^[^0-9]*([0-9]+)\.([0-9]+).*/\1\2/')
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q "$req"
    "$VENV/bin/pip" install -q -e ".[test]"
    echo "== Triton $("$VENV/bin/python" -c 'import triton; print(triton.__version__)') ($req, $VENV)"
    # The compile tests run in this process: nothing here has run Triton's interpreter.
    CAOVAN_TURBO_TEST_CHILD=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs \
      tests/test_kernels_turbo_protocol.py tests/test_kernels_turbo_hook.py tests/test_kernels_turbo_compile.py \
      tests/test_fla_releases.py tests/test_kernels_attention_fit.py "$@"   # our attention kernel's turbo builds (its check also judges
    # the plain fallback, which does not fit Turing for the d256 prefill: docs/attention.md, known limits)
    "$VENV/bin/caovan-sm75-kernels" check --kernel _prep_kernel --kernel _state_kernel
  done
  exit 0
fi

if [ "$lane" = fast ]; then
  VENV=${CAOVAN_TEST_FAST_VENV:-.venv-fast}
  LANE_ARGS=(-m "not vllm and not torch and not triton and not triton_compile and not vllm034")
  if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating $VENV (this project and its test extras only)"
    "$PY" -m venv "$VENV"
  fi
elif [ "$lane" = vllm034 ]; then
  VENV=${CAOVAN_TEST_VLLM034_VENV:-.venv-vllm034}
  LANE_ARGS=(-m vllm034)
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('vllm') == '0.34.0'" 2>/dev/null; then
    echo "== creating $VENV with vllm==0.34.0 (its requirements less the FlashInfer pin)"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" download -q --no-deps "vllm==0.34.0" -d "$VENV/wheel"
    "$PY" - "$VENV"/wheel/vllm-0.34.0-*.whl > "$VENV/requirements.txt" <<'PYEOF'
import sys, zipfile
from email.parser import Parser
meta = next(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith(".dist-info/METADATA"))
for req in Parser().parsestr(zipfile.ZipFile(sys.argv[1]).read(meta).decode()).get_all("Requires-Dist"):
    if "extra ==" not in req and not req.startswith("flashinfer-python"):
        print(req)
PYEOF
    "$VENV/bin/pip" install -q -r "$VENV/requirements.txt"
    "$VENV/bin/pip" install -q --no-deps "$VENV"/wheel/vllm-0.34.0-*.whl
    rm -rf "$VENV/wheel"
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
