#!/bin/bash
# Build libfuse >= 3.17 and pyfuse3 with FUSE passthrough into a venv (called by `make`).
#
#   deploy/passthrough/fuse-passthrough.sh VENV
#
# libfuse comes from Debian's own source package of the trixie release (Debian 12 ships 3.14,
# which has no passthrough), fetched with apt-get from the mirror this machine's apt sources
# already name, built with meson + ninja into VENV/fuse. pyfuse3 3.5.0 is built from its sdist
# with deploy/passthrough/pyfuse3-passthrough.patch (backing ids, FileInfo.backing_id and
# noflush, the INIT flag; small enough to offer upstream), linked to VENV/fuse/lib by rpath.
# Takes ~30 s.
# FUSE_EXAMPLES=1 (make floor-tools) also builds libfuse's passthrough_hp into VENV/fuse/bin,
# which the benchmark's floor section runs beside ckptgw.
set -euo pipefail

VENV=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=$VENV/fuse
PYFUSE3=3.5.0
EXAMPLES=$([ "${FUSE_EXAMPLES:-0}" = 1 ] && echo true || echo false)
SUITE=${FUSE_SOURCE_SUITE:-trixie}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckptgw-fuse.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# shellcheck source=deploy/debian-source.sh
. "$HERE/../debian-source.sh"
echo "building libfuse from Debian $SUITE source (fuse3) into $PREFIX"
debian_source fuse3 "$SUITE" "$WORK"
debian_unpack fuse3 "$WORK" >"$WORK/unpack.log" 2>&1 || { cat "$WORK/unpack.log" >&2; exit 1; }
mv "$WORK/fuse3" "$WORK/src/fuse3"
version=$(sed -n "s/^ *version *: *'\([0-9.]*\)'.*/\1/p" "$WORK/src/fuse3/meson.build" | head -n 1)
case "$version" in
    3.1[7-9]* | 3.[2-9]* | [4-9]*) ;;
    *) echo "fuse-passthrough: Debian $SUITE has libfuse $version; passthrough needs >= 3.17" >&2; exit 1 ;;
esac
meson setup "$WORK/build" "$WORK/src/fuse3" --prefix="$PREFIX" --libdir=lib --buildtype=release \
    -Dutils=false -Dexamples="$EXAMPLES" -Dtests=false -Duseroot=false -Dinitscriptdir= \
    >"$WORK/meson.log" || { cat "$WORK/meson.log" >&2; exit 1; }
ninja -C "$WORK/build" install >"$WORK/ninja.log" || { cat "$WORK/ninja.log" >&2; exit 1; }
if [ "$EXAMPLES" = true ]; then
    install -D -m 0755 "$WORK/build/example/passthrough_hp" "$PREFIX/bin/passthrough_hp"
fi

echo "building pyfuse3 $PYFUSE3 with passthrough against libfuse $version"
"$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary pyfuse3 \
    "pyfuse3==$PYFUSE3" -d "$WORK/py"
tar -xzf "$WORK/py/pyfuse3-$PYFUSE3.tar.gz" -C "$WORK/py"
patch -s -p1 -d "$WORK/py/pyfuse3-$PYFUSE3" <"$HERE/pyfuse3-passthrough.patch"
PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig LDFLAGS="-Wl,-rpath,$PREFIX/lib" \
    "$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps \
    "$WORK/py/pyfuse3-$PYFUSE3"
"$VENV/bin/pip" install -q --disable-pip-version-check "trio >= 0.15"  # pyfuse3's dependency
"$VENV/bin/python" -c 'import pyfuse3, sys; sys.exit(not hasattr(pyfuse3, "passthrough_open"))' \
    || { echo "fuse-passthrough: pyfuse3 did not build with passthrough" >&2; exit 1; }
touch "$PREFIX/.built"
