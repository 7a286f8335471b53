#!/usr/bin/env bash
# The whole in-engine check on the lent GPU machine, in one call. From the repository root there:
#   bash benchmarks/engine/run_device.sh native   # capability reported as 7.5, Triton builds for the GPU
#   bash benchmarks/engine/run_device.sh sm75     # and every Triton kernel built as sm_75 PTX (driver JIT)
# Needs .carry/ from pack.py (carry it: the device tool's `carry` argument). Writes $OUT (or ./.e2e-out):
# one JSON and one log per mode, then summary.json from compare.py. Each mode has a time limit.
set -u
SHIM=${1:-native}
OUTDIR=${OUT:-$PWD/.e2e-out}
mkdir -p "$OUTDIR"
E2E=/tmp/e2e
HERE=benchmarks/engine
if [ ! -d $E2E/site ]; then
  mkdir -p $E2E && tar xJf .carry/site.tar.xz -C $E2E || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --target $E2E/ours .carry/caovan/*.whl || exit 3
fi
export TRITON_PTXAS_PATH=${TRITON_PTXAS_PATH:-/usr/local/cuda/bin/ptxas}   # Triton 3.6's own is older than CUDA 13
export CAOVAN_FACTS=$PWD/$HERE/facts-sm75-proxy.json
export PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=INFO
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$OUTDIR/gpu.txt"

run_mode() {   # NAME PLUGIN(on|off) LIMIT_S ARGS...
  local name=$1 plugin=$2 limit=$3; shift 3
  local path=$E2E/site
  [ "$plugin" = on ] && path=$E2E/ours:$path
  echo "== $name (plugin $plugin, limit ${limit}s) $(date -u +%T)"
  PYTHONPATH=$path TRITON_CACHE_DIR=$E2E/triton-$name VLLM_CACHE_ROOT=$E2E/vllm-$name \
    timeout -k 10 "$limit" python3 $HERE/engine_check.py --model $HERE/qwen36-27b-tp2-8layer \
      --shim "$SHIM" --out "$OUTDIR/$name.json" "$@" > "$OUTDIR/$name.log" 2>&1
  echo "   exit $? $(date -u +%T); $(grep -c 'Caovan' "$OUTDIR/$name.log") Caovan lines"
  tail -3 "$OUTDIR/$name.log"
}

START=$(date +%s)
left() { echo $(( ${DEADLINE_S:-570} - ($(date +%s) - START) )); }   # the device tool stops a call at 600 s
run_mode "$SHIM-on" on "${LIMIT_ON:-250}" --speed
run_mode "$SHIM-off" off "$(( $(left) < ${LIMIT_OFF:-250} ? $(left) : ${LIMIT_OFF:-250} ))" --speed
[ "$(left)" -gt 60 ] && run_mode "$SHIM-on-ngram" on "$(left)" --ngram
python3 $HERE/compare.py "$OUTDIR" --shim "$SHIM" > "$OUTDIR/summary.json"
cat "$OUTDIR/summary.json"
