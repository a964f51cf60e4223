#!/usr/bin/env bash
# The first run on a real GPU (docs/GPU_FIRST_RUN.md, steps 1-4 and 9), as one call of the
# `device` tool: the GPU machine has PyTorch, the NVRTC and NCCL wheels, compute-sanitizer
# and no Rust, so everything is built here first and carried (.ci/gpu_bundle.sh packs
# .device-bin/bundle.tar.xz). Writes at most 8 logs to $OUT (what the tool brings back).
#
#   on the GPU machine:  bash .ci/gpu_first_run.sh [PHASE_A_SECONDS] [PHASE_B_SECONDS]
#
# Phase A runs in parallel (16 cores, one GPU): the Rust GPU tests with ZERO_REQUIRE_GPU=1
# and the training example (cuda against cpu); zero-torch's test_cuda.py; the same under
# CUDA_LAUNCH_BLOCKING=1; compute-sanitizer's tools on the kernel and engine tests (API
# errors not reported: NCCL's probes of its kernels at start are reported as such). Phase B
# runs alone: the criterion GPU benches, PyTorch's baseline on the same sizes, the offload
# bench, zero_torch against plain PyTorch and against DeepSpeed 0.19.8 (installed from the
# bundle's ds-wheels/ into its own folder). The defaults are sized from run 1 (an H200,
# docs/GPU_FIRST_RUN.md), phase B's grown for the DeepSpeed comparison.
set -u
A=${1:-240}
B=${2:-330}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
: >"$OUT/summary.txt"
left() { echo $((A - 5 - $(date +%s) + T0)); } # seconds phase A has left
say() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$OUT/summary.txt"; }

ROOT=$PWD
export PATH="$PATH:/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer"
W=/tmp/zero-gpu
rm -rf "$W" && mkdir -p "$W" && tar -xJf .device-bin/bundle.tar.xz -C "$W" || { say "no bundle"; exit 1; }
BIN=$W/bin
mkdir -p "$(cat "$BIN/TARGET_TMPDIR")"
PY=$(command -v python3)
SITE=$($PY -c 'import site; print(site.getsitepackages()[0])')
$PY -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$W"/wheel/*.whl >>"$OUT/summary.txt" 2>&1
export PYTHONPATH="$W/site"
# DeepSpeed apart: only bench_gpu_vs_deepspeed.py's DeepSpeed processes see it.
$PY -m pip install -q --no-index --no-deps --no-compile --find-links "$W/ds-wheels" --target "$W/ds-site" \
  deepspeed einops hjson msgpack py-cpuinfo pydantic pydantic-core annotated-types typing-inspection \
  typing-extensions psutil >>"$OUT/summary.txt" 2>&1 || echo "DeepSpeed not installed" >>"$OUT/summary.txt"
NVRTC=$(find "$SITE/nvidia" -name 'libnvrtc.so.13*' ! -name '*builtins*' 2>/dev/null | sort | head -1)
NCCL=$(find "$SITE/nvidia" -name 'libnccl.so*' 2>/dev/null | sort | head -1)
[ -n "$NVRTC" ] && export ZERO_NVRTC_LIB="$NVRTC"
[ -n "$NCCL" ] && export ZERO_NCCL_LIB="$NCCL"
export ZERO_KERNEL_CACHE=$W/kernels
export CUBLAS_WORKSPACE_CONFIG=:4096:8
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $PY -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  echo "python $PY site $SITE"
  echo "ZERO_NVRTC_LIB=${ZERO_NVRTC_LIB:-unset} ZERO_NCCL_LIB=${ZERO_NCCL_LIB:-unset}"
  command -v compute-sanitizer
} >>"$OUT/summary.txt" 2>&1
say "setup done"

rust_tests() {
  export ZERO_REQUIRE_GPU=1
  for t in kernels_gpu candle_gpu device_group engine_gpu engine_gpu_memory engine_frozen hf_load offload_gpu offload_memlock checkpoint_gpu; do
    echo "== $t"
    s=$(date +%s)
    [ "$(left)" -gt 10 ] || { echo "== $t: no time left"; continue; }
    timeout "$(left)" "$BIN/$t" --show-output 2>&1
    echo "== $t exit $? in $(($(date +%s) - s)) s"
  done
  for d in cuda cpu; do
    echo "== train --device $d"
    [ "$(left)" -gt 10 ] || { echo "== train: no time left"; continue; }
    timeout "$(left)" $PY -m torch.distributed.run --nproc-per-node 1 --no-python "$BIN/train" \
      --device "$d" --steps 30 2>&1 | tail -5
  done
}
torch_tests() { # torch_tests LABEL PYTEST-ARGS... (-rP: the tests' printed measurements too)
  cd "$ROOT/zero-torch/tests/python" || return
  timeout $((A - 10)) $PY -m pytest -v -rs -rP -p no:cacheprovider --durations=10 "${@:2}" test_cuda.py 2>&1
  echo "== pytest $1 exit $?"
}
sanitize() { # sanitize "TOOL BINARY"...: each in turn while phase A has time
  export ZERO_BENCH_GPU_SIZES=1
  for run in "$@"; do
    set -- $run
    [ "$(left)" -gt 15 ] || { echo "== $1 $2: no time left"; continue; }
    echo "== compute-sanitizer --tool $1 $2"
    timeout "$(left)" compute-sanitizer --tool "$1" --report-api-errors no --target-processes all --print-limit 20 \
      "$BIN/$2" --test-threads 1 2>&1 | grep -v '^test .* ok$'
    echo "== $1 $2 exit ${PIPESTATUS[0]}"
  done
}

say "phase A (at most $A s)"
pids=()
(rust_tests >"$OUT/rust.log" 2>&1) & pids+=($!)
(torch_tests default -n 4 >"$OUT/pytest.log" 2>&1) & pids+=($!)
(export CUDA_LAUNCH_BLOCKING=1; torch_tests blocking -n 2 -k "agree or side_stream or all_reduce" \
  >"$OUT/pytest_blocking.log" 2>&1) & pids+=($!)
(sanitize "memcheck kernels_gpu" "memcheck engine_gpu" "memcheck checkpoint_gpu" "memcheck offload_gpu" \
  >"$OUT/sanitizer_memcheck.log" 2>&1) & pids+=($!)
(sanitize "racecheck engine_gpu" "racecheck kernels_gpu" "synccheck kernels_gpu" "initcheck kernels_gpu" \
  "synccheck engine_gpu" "initcheck engine_gpu" >"$OUT/sanitizer_other.log" 2>&1) & pids+=($!)
wait "${pids[@]}"
say "phase A done"
grep -h '^== .*exit\|^test result\|SKIPPED\|passed\|failed\|ERROR SUMMARY\|final loss' \
  "$OUT"/rust.log "$OUT"/pytest*.log "$OUT"/sanitizer*.log >>"$OUT/summary.txt" 2>/dev/null

TB=$(date +%s)
say "phase B (at most $B s)"
{ # GPU_SIZES, GPU_BENCH_FILTER (a criterion regex; empty: all), TORCH_BASELINE=0 and
  # OFFLOAD_BENCH=0 trim it; zero_torch's GPU bench (GPT-2 124M, bf16) runs last.
  export ZERO_BENCH_GPU_SIZES=${GPU_SIZES:-16,256,1024}
  cd "$W" && timeout $((B * 2 / 11)) "$BIN/bench_gpu" --bench ${GPU_BENCH_FILTER:-} 2>&1 | grep -v '^$\|^Benchmarking'
  echo "== bench_gpu exit $?"
  if [ "${TORCH_BASELINE:-1}" != 0 ]; then
    cd "$ROOT" && timeout $((B / 11)) $PY benches/torch_baseline.py --sizes "$ZERO_BENCH_GPU_SIZES" 2>&1
    echo "== torch_baseline exit $?"
  fi
  if [ "${OFFLOAD_BENCH:-1}" != 0 ]; then
    cd "$W" && ZERO_BENCH_GPU_OFFLOAD_SIZES=16,256 timeout $((B / 11)) "$BIN/bench_gpu_offload" --bench 2>&1
    echo "== bench_gpu_offload exit $?"
  fi
  cd "$ROOT" && left_b=$((B / 11)); [ $left_b -gt 30 ] || left_b=30
  timeout $left_b $PY zero-torch/benches/bench_zero_torch.py --only gpu 2>&1
  echo "== bench_zero_torch gpu exit $?"
  left_b=$((B - $(date +%s) + TB)); [ $left_b -gt 30 ] || left_b=30
  ZERO_BENCH_DS_PATH="$W/ds-site" timeout $left_b $PY zero-torch/benches/bench_gpu_vs_deepspeed.py 2>&1
  echo "== bench_gpu_vs_deepspeed exit $?"
} >"$OUT/bench.log" 2>&1
say "all done"
