#!/bin/bash
# Build libnfs >= 5 and its nfs-cp, nfs-ls, nfs-cat, nfs-stat into a venv (called by
# `make test`): a user-space client that writes over NFSv4, for the NFS tests and the bench.
#
#   deploy/nfs-client/libnfs.sh VENV
#
# Debian 12's libnfs 4.0 cannot write over NFSv4: it encodes every COMPOUND into a fixed
# 4 KiB buffer, so a WRITE of more than about 3.9 KB fails before it is sent ("ZDR error:
# Failed to encode COMPOUND4args"), after an OPEN that created the file. libnfs 5 sizes the
# buffer for the data. So this builds Debian's own source package of the trixie release
# (libnfs 5.0.2, with Debian's patches) with cmake + ninja into VENV/nfs, plus
# deploy/nfs-client/libnfs-fixes.patch: libnfs before 7.0 tests `flags | O_EXCL` (always
# true) and so creates every file with EXCLUSIVE4, whose verifier the server keeps in the new
# file's atime and mtime (a date in 2105 until a write sets the mtime); and it prints a debug
# line on stdout at each reconnect. Takes ~10 s.
set -euo pipefail

VENV=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=$VENV/nfs
SUITE=${NFS_SOURCE_SUITE:-trixie}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckptgw-libnfs.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# shellcheck source=deploy/debian-source.sh
. "$HERE/../debian-source.sh"
echo "building libnfs from Debian $SUITE source into $PREFIX"
debian_source libnfs "$SUITE" "$WORK"
debian_unpack libnfs "$WORK" >"$WORK/unpack.log" 2>&1 || { cat "$WORK/unpack.log" >&2; exit 1; }
patch -s -p1 -d "$WORK/libnfs" <"$HERE/libnfs-fixes.patch"
version=$(grep -A4 '^project(libnfs' "$WORK/libnfs/CMakeLists.txt" \
    | sed -n 's/.*VERSION \([0-9.]*\).*/\1/p' | head -n 1)
case "$version" in
    [5-9].* | [1-9][0-9].*) ;;
    *) echo "libnfs: Debian $SUITE has libnfs ${version:-?}; NFSv4 writes need >= 5" >&2; exit 1 ;;
esac
cmake -S "$WORK/libnfs" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib -DENABLE_UTILS=ON \
    -DENABLE_EXAMPLES=OFF -DENABLE_TESTS=OFF -DENABLE_DOCUMENTATION=OFF \
    -DCMAKE_INSTALL_RPATH="$PREFIX/lib" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON >"$WORK/cmake.log" 2>&1 \
    || { cat "$WORK/cmake.log" >&2; exit 1; }
ninja -C "$WORK/build" install >"$WORK/ninja.log" 2>&1 || { cat "$WORK/ninja.log" >&2; exit 1; }
for tool in nfs-cp nfs-ls nfs-cat nfs-stat; do  # built, not installed by upstream's cmake
    install -D -m 0755 "$WORK/build/utils/$tool" "$PREFIX/bin/$tool"
done
usage=$("$PREFIX/bin/nfs-ls" 2>&1 || true)  # no URL: it prints its usage and exits 1
case "$usage" in
    *Usage*) ;;
    *) echo "libnfs: the built nfs-ls does not run: $usage" >&2; exit 1 ;;
esac
echo "$version" >"$PREFIX/.built"
