#!/usr/bin/env bash
# Build a local stand-in for `python:3.11-slim` from Debian bookworm packages, for sites
# (and CI) that reach a Debian mirror but no image registry. Debian 12's python3 is 3.11.
#
#   deploy/build-base-image.sh [TAG]        (default TAG: privet/python:3.11-bookworm)
#
# Needs root, debootstrap and a running Docker engine. The root file system tarball is
# cached in $PRIVET_CACHE (default /var/cache/privet-ci), so a rebuild only re-imports it.
# Then: docker build --build-arg BASE_IMAGE=privet/python:3.11-bookworm -t privet .
set -euo pipefail
TAG="${1:-privet/python:3.11-bookworm}"
CACHE="${PRIVET_CACHE:-/var/cache/privet-ci}"
MIRROR="${DEBIAN_MIRROR:-}"
if [[ -z "$MIRROR" ]]; then
    # the mirror this machine's apt already uses (deb822 or one-line format)
    MIRROR="$(grep -hoE '^URIs: *\S+/debian/?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')"
    [[ -z "$MIRROR" ]] && MIRROR="$(grep -hoE '^deb +\S+/debian/? +bookworm' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')"
    MIRROR="${MIRROR:-http://deb.debian.org/debian}"
fi

if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "base image $TAG already present"
    exit 0
fi
mkdir -p "$CACHE"
TARBALL="$CACHE/bookworm-python3.11-rootfs.tar"
if [[ ! -s "$TARBALL" ]]; then
    command -v debootstrap >/dev/null || { echo "debootstrap is required (apt-get install debootstrap)" >&2; exit 1; }
    ROOTFS="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
    trap 'rm -rf "$ROOTFS"' EXIT
    echo "==> debootstrap bookworm (minbase + python3, python3-venv) from $MIRROR"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$ROOTFS" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -30 "$CACHE/debootstrap.log" >&2; exit 1; }
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
        "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
    tar -C "$ROOTFS" -cf "$TARBALL.tmp" . && mv "$TARBALL.tmp" "$TARBALL"
fi
echo "==> docker import $TARBALL as $TAG"
docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$TARBALL" "$TAG" >/dev/null
echo "base image $TAG ready"
