#!/usr/bin/env bash
# Packs what .ci/gpu_first_run.sh needs on the GPU machine (which has no Rust) into
# .device-bin/bundle.tar.xz (git-ignored; the `device` tool carries it, 64 MiB at most):
# the GPU test binaries (test profile, as CI), the GPU benches, the training example and
# the zero_torch wheel, stripped. The wheel is taken from ZERO_TORCH_WHEEL, else built.
# Beside them, in ds-wheels/, DeepSpeed 0.19.8 (built here from its sdist, as CI builds it)
# and the wheels it needs that a machine with PyTorch and transformers may lack (for
# CPython 3.10-3.13), installed there apart from zero_torch for
# zero-torch/benches/bench_gpu_vs_deepspeed.py.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/wheel" "$stage/ds-wheels" .device-bin
DS_WHEELS="einops hjson msgpack py-cpuinfo pydantic pydantic-core annotated-types typing-inspection typing-extensions psutil"
DS_BUILD_OPS=0 PYTHONPATH="$PWD/target/py-torch" python3 -m pip wheel --quiet --disable-pip-version-check \
  --no-deps --no-build-isolation -w "$stage/ds-wheels" deepspeed==0.19.8
for v in 3.10 3.11 3.12 3.13; do
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --python-version "$v" \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --no-deps \
    -d "$stage/ds-wheels" $DS_WHEELS
done

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
ls -la "$stage"/bin "$stage"/wheel "$stage"/ds-wheels
tar -cJf .device-bin/bundle.tar.xz -C "$stage" bin wheel ds-wheels
rm -rf "$stage"
ls -la .device-bin/bundle.tar.xz
