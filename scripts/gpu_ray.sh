#!/usr/bin/env bash
# Ray for the H200 machine (issue 14: the Ray executor's bench against the local one on one GPU). The image has no
# Ray and reaches no registry, and Ray's wheel (79 MB) is over what one device call carries (64 MiB), so it
# travels in two git-ignored folders, one per call:
#   .gpuray1/  the first half of the wheel
#   .gpuray2/  the second half, Ray's dependencies and install.sh
# On the GPU machine, after the two calls of docs/CONTRIBUTING-gpu.md: a call carrying .gpuray1 (any command), then a call
# carrying .gpuray2 that starts `source .gpu2/env.sh && source .gpuray2/install.sh && ...`. Folders a call does not
# carry stay on the machine while it is warm, so the halves meet there. Ray and its dependencies go last on the
# path: where the image has a package (filelock, requests, ... that torch uses), the image's copy wins.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
cache="${HOME}/.cache/coda-gpu/ray"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
rm -rf "$cache" .gpuray1 .gpuray2 && mkdir -p "$cache" .gpuray1 .gpuray2
version="$(.venv/bin/python -c 'import ray; print(ray.__version__)')"  # the Ray the CPU tests ran with
python3 -m pip download -q "${plat[@]}" -d "$cache" "ray==$version"
wheel="$(ls "$cache"/ray-*.whl)"
split -b 40M -d "$wheel" "$cache/ray.part"
mv "$cache/ray.part00" .gpuray1/
mv "$cache"/ray.part0[1-9] .gpuray2/
find "$cache" -name '*.whl' ! -name 'ray-*' -exec cp {} .gpuray2/ \;
cat > .gpuray2/install.sh <<EOF
# GPU machine, sourced after .gpu2/env.sh: Ray and its dependencies in /tmp/pyray, last on PYTHONPATH.
if [ ! -d /tmp/pyray/ray ]; then
  [ -f .gpuray1/ray.part00 ] || { echo "install.sh: .gpuray1 is not on this machine: carry it in a call first" >&2; return 3; }
  cat .gpuray1/ray.part00 .gpuray2/ray.part0* > /tmp/$(basename "$wheel")
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/pyray /tmp/$(basename "$wheel") .gpuray2/*.whl || return 4
fi
export PYTHONPATH="\$PYTHONPATH:/tmp/pyray" PATH="\$PATH:/tmp/pyray/bin"
python3 -c "import ray; print('ray', ray.__version__, 'ready')" || return 5
EOF
du -sh .gpuray1 .gpuray2
