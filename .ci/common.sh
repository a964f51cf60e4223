# Shared by .ci/run and .ci/gpusim (sourced, from the repository root): pinned packages
# from PyPI, each in its own folder under target/, reusing pip's cache. Nothing is put on
# the library path.

# A clean clone builds once: incremental caches would only take disk (gigabytes of it).
export CARGO_INCREMENTAL=0

# PyTorch, transformers, DeepSpeed (built from its sdist; its ops are not built until a
# test asks), ninja (DeepSpeed's JIT needs it), pytest and maturin, pinned, for
# zero-torch's tests and the launcher (torchrun), and Lightning (with the torchmetrics and
# lightning-utilities it was tested with) for the client suite's Lightning case: one
# folder, target/py-torch.
TORCH_SITE="$PWD/target/py-torch"
TORCH_PKGS="torch==2.11.0 transformers==5.23.0 deepspeed==0.19.8 accelerate==1.15.0 ninja==1.13.0 numpy==2.2.6 pytest==8.4.2 maturin==1.16.0 lightning==2.6.6 pytorch-lightning==2.6.6 lightning-utilities==0.15.3 torchmetrics==1.9.0 peft==0.21.2"

# Installs $TORCH_PKGS into $TORCH_SITE unless it holds them (three tries).
install_torch() {
  [ "$(cat "$TORCH_SITE/.installed" 2>/dev/null)" = "$TORCH_PKGS" ] && return 0
  for attempt in 1 2 3; do
    rm -rf "$TORCH_SITE.partial"
    # shellcheck disable=SC2086
    if python3 -m pip install --disable-pip-version-check --target "$TORCH_SITE.partial" $TORCH_PKGS; then
      rm -rf "$TORCH_SITE"
      mv "$TORCH_SITE.partial" "$TORCH_SITE"
      echo "$TORCH_PKGS" > "$TORCH_SITE/.installed"
      return 0
    fi
    sleep 10
  done
  return 1
}

# CUDA libraries from PyPI, each in its own folder under target/cuda-pip (no GPU and no
# CUDA toolkit is needed).
CUDA_PIP="$PWD/target/cuda-pip"
NVRTC12=nvidia/cuda_nvrtc/lib/libnvrtc.so.12
NVRTC13=nvidia/cu13/lib/libnvrtc.so.13
NCCL=nvidia/nccl/lib/libnccl.so.2

# wheel SPEC FOLDER FILE: installs SPEC into $CUDA_PIP/FOLDER unless FILE is there.
wheel() {
  local dir="$CUDA_PIP/$2"
  [ -e "$dir/$3" ] && return 0
  echo "== installing $1 into $dir"
  for attempt in 1 2 3; do
    if python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" "$1"; then
      return 0
    fi
    sleep 10
  done
  echo "could not install $1 from PyPI" >&2
  exit 1
}

# The four NVRTCs CI compiles the kernels with (.ci/run) and whose PTX the stand-in's
# interpreter parses (.ci/gpusim): 12.2 (the oldest driver we support), 12.9 (the newest
# 12.x), 13.0 (the stand-in's own, its driver's version) and 13.5 (the newest 13.x).
install_nvrtc_wheels() {
  wheel nvidia-cuda-nvrtc-cu12==12.2.140 nvrtc-12.2 "$NVRTC12"
  wheel nvidia-cuda-nvrtc-cu12==12.9.86 nvrtc-12.9 "$NVRTC12"
  wheel nvidia-cuda-nvrtc==13.0.88 nvrtc-13.0 "$NVRTC13"
  wheel nvidia-cuda-nvrtc==13.5.37 nvrtc-13.5 "$NVRTC13"
}
