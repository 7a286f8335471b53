#!/usr/bin/env bash
# The in-engine check on the lent GPU machine. From the repository root there:
#   bash benchmarks/engine/run_device.sh native   # capability reported as 7.5, Triton builds for the GPU
#   bash benchmarks/engine/run_device.sh sm75     # and every Triton kernel built as sm_75 PTX (driver JIT)
# Needs .carry/ from pack.py (carry it: the device tool's `carry` argument; CARRY=.carry24 names
# another). A call runs the modes of MODES (default "on off on-ngram"; one mode a call keeps a slow
# plugin-off start inside the device's 10 minutes):
#   on / off         plugin on / off, TRITON_ATTN, --speed
#   on-ngram         plugin on, n-gram speculation against plain greedy
#   on-custom        plugin on, our attention backend (--attention-backend CUSTOM), --speed
#   on-custom-fp8    the same with fp8 (e4m3) KV
#   on-flashinfer    plugin on, --attention-backend FLASHINFER, --speed (needs pack.py --flashinfer: its
#                    kernels are built there by FlashInfer's JIT, as sm_75 PTX in sm75 mode: nvcc_ptx.sh)
#   on-flashinfer-fp8  the same with fp8 (e4m3) KV
#   <mode>-mtp       any of the on modes but on-ngram with MTP (--spec mtp, DRAFT draft tokens, default
#                    3; DRAFT_ATTN=B gives the drafter attention backend B, else vLLM 0.24+ picks its own); where <mode><TAG>.json is already in $OUT (run it first, same call), its greedy tokens
#                    are replayed as drafts and decode is timed at each acceptance 0..N (--reference)
#   <mode>-mtp-unfixed  the same without our fix of MTP prefix-cache hits (--cache-fix off)
# ARGS is added to every mode (e.g. "--long-context 32768 131072", "--tensor-parallel-size 2": workers
# get the shim through worker_site/sitecustomize.py), TAG to every output's name.
# CACHE=plugin shares one Triton and vLLM cache among the modes of one plugin state (the first is
# cold, later ones warm); the default gives each mode its own (every start cold). DEADLINE_S or
# END_AT bound the call (below).
# Writes $OUT (or ./.e2e-out): one JSON and one log per mode, then summary.json from compare.py.
# ENGINE_CHECK_STACKS=N dumps every thread's stack into the mode's log every N seconds.
set -u
SHIM=${1:-native}
OUTDIR=${OUT:-$PWD/.e2e-out}
CARRY=${CARRY:-.carry}
mkdir -p "$OUTDIR"
E2E=/tmp/e2e-$(basename "$CARRY")   # one unpacked site per carry: a warm machine may have had another
HERE=benchmarks/engine
if [ ! -d $E2E/site ]; then
  mkdir -p $E2E && tar xJf "$CARRY/site.tar.xz" -C $E2E || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --target $E2E/ours "$CARRY"/caovan/*.whl || exit 3
fi
if [ -f "$CARRY/flashinfer.tar.xz" ] && [ ! -d $E2E/flashinfer-site ]; then
  tar xJf "$CARRY/flashinfer.tar.xz" -C $E2E || exit 3
fi
export TRITON_PTXAS_PATH=${TRITON_PTXAS_PATH:-/usr/local/cuda/bin/ptxas}   # Triton 3.6's own is older than CUDA 13
export CAOVAN_FACTS=$PWD/$HERE/facts-sm75-proxy.json
export PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=INFO
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$OUTDIR/gpu.txt"
PYTHONPATH=$E2E/site python3 -c "import vllm, torch, triton; print('vllm', vllm.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" \
  | tee "$OUTDIR/stack.txt"

mode_args() {   # MODE -> plugin state, then engine_check arguments
  case "$1" in
    *-unfixed) local inner; inner=$(mode_args "${1%-unfixed}") || return 1
           echo "$inner --cache-fix off"; return 0 ;;
    *-mtp) local base; base=$(mode_args "${1%-mtp}") || return 1
           echo "$base --spec mtp --draft-tokens ${DRAFT:-3}"
           [ -n "${DRAFT_ATTN:-}" ] && echo " --draft-attention-backend $DRAFT_ATTN"
           local ref="$OUTDIR/$SHIM-${1%-mtp}${TAG:-}.json"
           [ -f "$ref" ] && echo " --reference $ref"
           return 0 ;;
    on) echo "on --speed" ;;
    off) echo "off --speed" ;;
    on-ngram) echo "on --ngram" ;;
    on-custom) echo "on --speed --attention-backend CUSTOM" ;;
    on-custom-fp8) echo "on --speed --attention-backend CUSTOM --kv-cache-dtype fp8" ;;
    on-flashinfer) echo "on --speed --attention-backend FLASHINFER" ;;
    on-flashinfer-fp8) echo "on --speed --attention-backend FLASHINFER --kv-cache-dtype fp8" ;;
    *) echo "run_device.sh: unknown mode '$1' (on, off, on-ngram, on-custom, on-custom-fp8, on-flashinfer," \
            "on-flashinfer-fp8, each of the on modes with -mtp)" >&2; return 1 ;;
  esac
}

# The device tool stops a call at 600 s: DEADLINE_S from this script's start, or END_AT (epoch
# seconds) shared by several runs of this script in one call.
END=${END_AT:-$(( $(date +%s) + ${DEADLINE_S:-570} ))}
left() { echo $(( END - $(date +%s) )); }

run_mode() {   # MODE
  local spec plugin name path cache
  spec=$(mode_args "$1" | tr -d '\n') || return 1
  plugin=${spec%% *}
  name=$SHIM-$1${TAG:-}
  path=$E2E/site
  [ "$plugin" = on ] && path=$E2E/ours:$path
  cache=$name
  [ "${CACHE:-mode}" = plugin ] && cache=$SHIM-$plugin
  local fi_env=()
  if [[ "$spec" == *FLASHINFER* ]]; then   # FlashInfer only where a mode asks it: the others run as before
    if [ ! -d $E2E/flashinfer-site ]; then
      echo "== $name skipped: no FlashInfer in $CARRY (python3 benchmarks/engine/pack.py --flashinfer)"; return 0
    fi
    path=$E2E/flashinfer-site:$path
    fi_env=(CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" FLASHINFER_WORKSPACE_BASE=$E2E/flashinfer-$cache)
    [ "$SHIM" = sm75 ] && fi_env+=(FLASHINFER_CUDA_ARCH_LIST=7.5 "FLASHINFER_NVCC=bash $PWD/$HERE/nvcc_ptx.sh")   # bash: whether or not the copy kept its mode
  fi
  if [ "$(left)" -lt 60 ]; then echo "== $name skipped: $(left) s left"; return 0; fi
  echo "== $name (plugin $plugin, limit $(left) s) $(date -u +%T)"
  # shellcheck disable=SC2086  # the mode's arguments and ARGS are words
  env ${fi_env[@]+"${fi_env[@]}"} PYTHONPATH=$path TRITON_CACHE_DIR=$E2E/triton-$cache VLLM_CACHE_ROOT=$E2E/vllm-$cache \
    timeout -k 10 "$(left)" python3 $HERE/engine_check.py --model $HERE/qwen36-27b-tp2-8layer \
      --shim "$SHIM" --out "$OUTDIR/$name.json" ${spec#* } ${ARGS:-} > "$OUTDIR/$name.log" 2>&1
  echo "   exit $? $(date -u +%T); $(grep -c 'Caovan' "$OUTDIR/$name.log") Caovan lines"
  grep '^engine_check:' "$OUTDIR/$name.log" | tail -12
  grep -h "Caovan SM75 Turbo3 fix" "$OUTDIR/$name.log" | sort -u | cut -c1-160
  grep -v '^engine_check:' "$OUTDIR/$name.log" | tail -3
}

for mode in ${MODES:-on off on-ngram}; do run_mode "$mode"; done
python3 $HERE/compare.py "$OUTDIR" --shim "$SHIM" ${COMPARE:-} > "$OUTDIR/summary${TAG:-}.json"
cat "$OUTDIR/summary${TAG:-}.json"
# The device tool brings back at most 8 files: every result and log in one archive too.
tar czf "$OUTDIR/engine-results.tgz" -C "$OUTDIR" --exclude engine-results.tgz . 2>/dev/null || true
