#!/bin/bash
# Debian's own source package of a newer release, fetched with apt-get from the mirror this
# machine's apt sources already name (sourced by the build scripts under deploy/):
#
#   . deploy/debian-source.sh
#   debian_source PACKAGE SUITE DIR    # DIR/src: PACKAGE's upstream and Debian tarballs
#
# apt-get checks each file against the release's signed Sources index. The .dsc itself is not
# needed (some mirrors lack it): the tarballs are unpacked and Debian's patches applied here.

# The Debian archive URI this machine's apt uses (deb822 .sources or one-line sources.list);
# the security archive is skipped: source packages of a release live in the main archive.
debian_mirror() {
    {
        cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}'
        cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
            | awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) {print $i; break}}'
    } | grep -E '/debian/?$' | grep -v -- '-security' | head -n 1
}

debian_source() {
    local package=$1 suite=$2 dir=$3 mirror
    mirror=$(debian_mirror || true)
    if [ -z "$mirror" ]; then
        echo "$package: no Debian archive in /etc/apt/sources*; add one or set up apt first" >&2
        return 1
    fi
    mkdir -p "$dir/sources" "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/src"
    cat > "$dir/sources/$suite-src.sources" <<SRC
Types: deb-src
URIs: $mirror
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    local apt=(-q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$dir/sources"
               -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache"
               -o APT::Sandbox::User=root)
    apt-get "${apt[@]}" update >"$dir/apt.log" 2>&1 || { cat "$dir/apt.log" >&2; return 1; }
    (cd "$dir/src" && apt-get "${apt[@]}" source --download-only "$package" >>"$dir/apt.log" 2>&1) \
        || true  # a missing .dsc fails the command after the tarballs came
    if ! debian_file "$dir/src/${package}_*.orig.tar.*" >/dev/null \
        || ! debian_file "$dir/src/${package}_*.debian.tar.*" >/dev/null; then
        cat "$dir/apt.log" >&2
        echo "$package: Debian $suite's source package did not download" >&2
        return 1
    fi
}

# The one file of a source package that matches a glob (its signature, .asc, left out).
debian_file() {
    local f
    for f in $1; do
        case "$f" in *.asc) ;; *) [ -f "$f" ] && { echo "$f"; return 0; } ;; esac
    done
    return 1
}

# Unpack the upstream tarball into DIR/PACKAGE and apply Debian's patches (its series file).
debian_unpack() {
    local package=$1 dir=$2 orig debian tree series patch
    orig=$(debian_file "$dir/src/${package}_*.orig.tar.*") || return 1
    debian=$(debian_file "$dir/src/${package}_*.debian.tar.*") || return 1
    mkdir -p "$dir/unpack" || return 1
    tar -xf "$orig" -C "$dir/unpack" || return 1
    tree=$(find "$dir/unpack" -mindepth 1 -maxdepth 1 -type d | head -n 1)
    [ -n "$tree" ] && mv "$tree" "$dir/$package" || return 1
    tar -xf "$debian" -C "$dir/$package" || return 1
    series=$dir/$package/debian/patches/series
    [ -f "$series" ] || return 0
    while read -r patch _; do
        case "$patch" in '' | '#'*) continue ;; esac
        patch -s -p1 -d "$dir/$package" <"$dir/$package/debian/patches/$patch" || return 1
    done <"$series"
}
