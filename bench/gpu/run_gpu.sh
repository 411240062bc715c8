#!/usr/bin/env bash
# The GPU bench of rlprobe-patch: installs the carried wheels, patches the installed verl with
# `rlprobe-patch apply --python`, runs verl's real FSDP and Megatron engines with the hooks off
# (against the unpatched tree) and on, and leaves the results in $OUT. bench/gpu/README.md.
#
#   bash bench/gpu/run_gpu.sh                    # on the device (OUT set by the tool)
#   QUICK=1 PY=/venv/bin/python WHL=/wheels-cp311 OUT=/tmp/o bash bench/gpu/run_gpu.sh   # CPU dry run
set -u -o pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-python3}
WHL=${WHL:-$REPO/.whl}
OUT=${OUT:-/tmp/rlprobe-gpu-out}
WORK=${WORK:-/tmp/rlprobe-gpu}
QUICK=${QUICK:-0}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
rm -rf "$WORK"; mkdir -p "$WORK/res" "$OUT"
RES=$WORK/res SITE=$WORK/site PRISTINE=$WORK/pristine STUBS=$REPO/bench/gpu/stubs
exec > >(tee -a "$OUT/log.txt") 2>&1
T0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
pack() { (cd "$WORK" && tar czf "$OUT/results.tar.gz" res) ; }  # after each run: survives a timeout

if [ "$QUICK" = 1 ]; then
  SIZE="--hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 256 --seq-min 24 --seq-max 40 --prompt-len 8 --micro-batches 2 --micro-batch-size 2"
  FSTEPS="--steps ${NSTEPS:-3} --warmup 1"; MSTEPS="--steps ${NSTEPS:-3} --warmup 1"; FSDP_BUDGET=${FSDP_BUDGET:-5}; MCORE_BUDGET=${MCORE_BUDGET:-5}
else
  SIZE="--hidden 1024 --intermediate 2816 --layers 8 --heads 16 --kv-heads 4 --vocab 32768 --seq-min 384 --seq-max 512 --prompt-len 64 --micro-batches 4 --micro-batch-size 4"
  FSTEPS="--steps ${NSTEPS:-12} --warmup 3"; MSTEPS="--steps ${NSTEPS:-10} --warmup 3"
fi
FSDP_BUDGET=${FSDP_BUDGET:-60}     # seconds of ABBA rounds (pristine vs patched methods) per engine
MCORE_BUDGET=${MCORE_BUDGET:-60}
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1 RLPROBE_PATCH_STATE_HOME=$WORK/state
unset DUMP_ON DUMP_PHASE MSPROBE_ACTOR_CONFIG

stamp "install the carried wheels into $SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHL"/*.whl || exit 1
export PYTHONPATH=$SITE:$STUBS
if ! "$PY" -c "import datasets" 2>"$WORK/datasets_err.txt"; then
  echo "carried datasets does not import ($(tail -1 "$WORK/datasets_err.txt")): using bench/gpu/stubs_fallback"
  export PYTHONPATH=$PYTHONPATH:$REPO/bench/gpu/stubs_fallback
fi

stamp "environment"
"$PY" - <<'PYEOF' | tee "$RES/env.json"
import importlib.metadata as md, json, platform, shutil, subprocess, sys
import torch
def v(n):
    try: return md.version(n)
    except Exception: return None
import datasets, ray
info = {"python": sys.version.split()[0], "platform": platform.platform(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_count": torch.cuda.device_count(), "git": shutil.which("git"),
        "ray_standin": getattr(ray, "STANDIN", False), "datasets_standin": getattr(datasets, "STANDIN", False),
        "versions": {n: v(n) for n in ("verl", "transformers", "tokenizers", "accelerate", "peft", "numpy", "tensordict",
                     "megatron-core", "mbridge", "mindstudio-probe", "hydra-core", "omegaconf", "datasets", "pyarrow",
                     "libcst", "transformer_engine", "apex", "flash_attn")}}
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm",
                                         "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
except Exception as exc:
    info["nvidia_smi"] = repr(exc)
print(json.dumps(info, indent=1))
PYEOF

stamp "keep a pristine copy of verl, then patch the installed tree with rlprobe-patch"
mkdir -p "$PRISTINE" && cp -a "$SITE/verl" "$PRISTINE/verl"
RP() { PYTHONPATH=$REPO/src:$PYTHONPATH "$PY" -m rlprobe_patch "$@"; }
APPLIED=1
for backend in fsdp2 megatron; do
  RP apply --python "$PY" --backend $backend --json > "$RES/apply_$backend.json"; rc=$?
  echo "apply --backend $backend: exit $rc"; [ $rc = 0 ] || APPLIED=0
done
if [ $APPLIED = 0 ] && [ -d "$WHL/prepatched" ]; then
  # Fallback: the files rlprobe-patch wrote into the same wheel's tree on the dev machine.
  echo "rlprobe-patch apply failed here (git: $(command -v git || echo absent)): using $WHL/prepatched"
  for e in fsdp megatron; do cp "$WHL/prepatched/$e/transformer_impl.py" "$SITE/verl/workers/engine/$e/"; done
  echo '{"prepatched": true}' > "$RES/prepatched.json"
fi
RP verify --json > "$RES/verify.json"; echo "verify: exit $?"
RP status --verl-root "$SITE" --json > "$RES/status.json"; echo "status: exit $?"
cp "$SITE"/.rlprobe-patch/diffs/*.diff "$RES/" 2>/dev/null
grep -c "_should_dump" "$SITE/verl/workers/engine/fsdp/transformer_impl.py" "$PRISTINE/verl/workers/engine/fsdp/transformer_impl.py"
pack

UNPATCHED=$PRISTINE:$PYTHONPATH   # the pristine copy shadows the patched tree
PATCHED=$PYTHONPATH
FP=$PRISTINE/verl/workers/engine/fsdp/transformer_impl.py
MP=$PRISTINE/verl/workers/engine/megatron/transformer_impl.py
run() {  # run NAME PYTHONPATH CMD...
  local name=$1 pp=$2; shift 2
  stamp "$name"
  PYTHONPATH=$pp timeout "$STEP_TIMEOUT" "$PY" "$@" --out "$RES/$name.json" > "$RES/$name.log" 2>&1
  local rc=$?
  grep -v -E "Warning|warnings.warn|^\s*$|Loading weights|is_fx_tracing|^TF config|\[INFO\]" "$RES/$name.log" | tail -40
  echo "$name: exit $rc"
  pack
}
msprobe_config() {  # msprobe_config NAME -> path of a statistics/mix config dumping to $WORK/dump-NAME
  echo "{\"task\": \"statistics\", \"dump_path\": \"$WORK/dump-$1\", \"rank\": [], \"step\": [], \"level\": \"mix\", \"async_dump\": false}" > "$WORK/msprobe-$1.json"
  echo "$WORK/msprobe-$1.json"
}

# Each engine: an unpatched-tree process (reference losses), and a patched-tree process that runs
# the same steps with DUMP_ON unset (MSPROBE_ACTOR_CONFIG set, as a user's environment would be),
# then ABBA rounds of pristine vs patched methods in that process, then sets DUMP_ON=1 and dumps.
F="$REPO/bench/gpu/fsdp_bench.py --model-dir $WORK/qwen2 --attn eager $SIZE"
M="$REPO/bench/gpu/megatron_bench.py --model-dir $WORK/qwen2-mcore $SIZE"
RUNS=${RUNS:-"fsdp_unpatched fsdp_patched megatron_unpatched megatron_patched"}
for r in $RUNS; do
  case $r in
    fsdp_unpatched) STEP_TIMEOUT=${T_FU:-$STEP_TIMEOUT} run fsdp_steps_unpatched "$UNPATCHED" $F --mode steps $FSTEPS ;;
    fsdp_patched) MSPROBE_ACTOR_CONFIG=$(msprobe_config fsdp) STEP_TIMEOUT=${T_FP:-$STEP_TIMEOUT} \
        run fsdp_steps_patched "$PATCHED" $F --mode steps $FSTEPS --pristine-file "$FP" --interleave 200 \
        --interleave-budget "$FSDP_BUDGET" --interleave-nondeterministic --then-dump "${FSDP_DUMP_PHASES:-default,update_actor,all}" ;;
    megatron_unpatched) STEP_TIMEOUT=${T_MU:-$STEP_TIMEOUT} run megatron_steps_unpatched "$UNPATCHED" $M --mode steps $MSTEPS ;;
    megatron_patched) MSPROBE_ACTOR_CONFIG=$(msprobe_config megatron) STEP_TIMEOUT=${T_MP:-$STEP_TIMEOUT} \
        run megatron_steps_patched "$PATCHED" $M --mode steps $MSTEPS --pristine-file "$MP" --interleave 200 \
        --interleave-budget "$MCORE_BUDGET" --interleave-nondeterministic --then-dump "${MCORE_DUMP_PHASES:-default,update_actor,all}" ;;
  esac
done

stamp "off-path cost of the inserted statements (timeit, patched tree)"
PYTHONPATH=$PATCHED "$PY" "$REPO/bench/gpu/offpath_cost.py" --out "$RES/offpath_cost.json" 2>&1 | grep -v -i warn
pack

stamp "revert, and check the tree is the wheel's again"
RP revert --json > "$RES/revert.json"; echo "revert: exit $?"
diff -r -q -x __pycache__ -x .rlprobe-patch "$PRISTINE/verl" "$SITE/verl" && echo "tree identical to the pristine copy after revert"
stamp "summary"
"$PY" "$REPO/bench/gpu/summarize.py" "$RES" --out "$OUT/summary.json"
pack
stamp "done"
