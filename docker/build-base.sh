#!/usr/bin/env bash
# A base image made locally, for machines that reach no container registry: Debian bookworm
# (minbase) with python3 3.11 and venv, by mmdebstrap from the Debian mirror apt uses, imported into the
# engine as localhost/shardstream-base:bookworm. Use it as BASE_IMAGE for docker/Dockerfile (with
# --build-arg TORCH=torch==2.13.0) and docker/store.Dockerfile.
# Usage: docker/build-base.sh [ENGINE] [TAG]     ENGINE: podman (default if installed) or docker
set -euo pipefail
engine="${1:-$(command -v podman >/dev/null && echo podman || echo docker)}"
tag="${2:-localhost/shardstream-base:bookworm}"
command -v mmdebstrap >/dev/null || { echo "mmdebstrap is not installed (apt-get install mmdebstrap)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv --format=tar bookworm "$tmp/base.tar"
"$engine" import "$tmp/base.tar" "$tag" >/dev/null
echo "$tag"
