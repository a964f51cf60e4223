#!/usr/bin/env bash
# Packs what .ci/gpu_first_run.sh needs on the GPU machine (which has no Rust) into
# .device-bin/bundle.tar.xz (git-ignored; the `device` tool carries it, 64 MiB at most):
# the GPU test binaries (test profile, as CI), the GPU benches, the training example and
# the zero_torch wheel, stripped. The wheel is taken from ZERO_TORCH_WHEEL, else built.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/wheel" .device-bin

exe() { # exe TARGET-NAME MANIFEST-DIR CARGO-ARGS...: the executable cargo built for it
  local name=$1 dir=$2
  shift 2
  cargo "$@" --message-format=json 2>/dev/null | python3 -c '
import json, sys
name, dir = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == name and m["manifest_path"].endswith(dir + "/Cargo.toml"):
        print(m["executable"])
' "$name" "$dir"
}
tests="--test gpu --test device_group --test engine_gpu --test engine_gpu_memory --test engine_frozen --test hf_load --test offload_gpu --test offload_memlock --test checkpoint_gpu"
# shellcheck disable=SC2086
{
  cp "$(exe gpu zero-kernels test --workspace --no-run $tests)" "$stage/bin/kernels_gpu"
  cp "$(exe gpu zero-candle test --workspace --no-run $tests)" "$stage/bin/candle_gpu"
  for t in device_group engine_gpu engine_gpu_memory engine_frozen hf_load offload_gpu offload_memlock checkpoint_gpu; do
    cp "$(exe "$t" "" test --workspace --no-run $tests)" "$stage/bin/$t"
  done
}
cp "$(exe train zero-runtime build --profile test --workspace --example train)" "$stage/bin/train" 2>/dev/null \
  || cp "$(exe train "" build --profile test --workspace --example train)" "$stage/bin/train"
cp "$(exe gpu benches bench --workspace --no-run --bench gpu --bench gpu_offload)" "$stage/bin/bench_gpu"
cp "$(exe gpu_offload benches bench --workspace --no-run --bench gpu --bench gpu_offload)" "$stage/bin/bench_gpu_offload"
strip "$stage"/bin/*
# The tests' scratch folder, compiled in (env!("CARGO_TARGET_TMPDIR")): created there.
echo "$PWD/target/tmp" >"$stage/bin/TARGET_TMPDIR"
if [ -n "${ZERO_TORCH_WHEEL:-}" ]; then
  cp "$ZERO_TORCH_WHEEL" "$stage/wheel/"
else
  target/py-torch/bin/maturin build --release --quiet -m zero-torch/Cargo.toml --out "$stage/wheel"
fi
ls -la "$stage"/bin "$stage"/wheel
tar -cJf .device-bin/bundle.tar.xz -C "$stage" bin wheel
rm -rf "$stage"
ls -la .device-bin/bundle.tar.xz
