#!/bin/bash
# build-deb.sh — build ravnest's .deb with dpkg-buildpackage and check it
# with lintian.
#
#   packaging/build-deb.sh [OUTDIR]
#
# Copies the project (see export-tree.sh) into a scratch directory, puts
# packaging/debian/ there as debian/, runs `dpkg-buildpackage -us -uc -b`
# and moves the .deb, .buildinfo and .changes to OUTDIR (default
# build-packages/deb in the project, which git ignores). Then lintian
# checks the .changes; its report is also in OUTDIR/lintian.txt. Nothing
# else in the project is written to.
#
# Needs dpkg-dev, debhelper and the build dependencies of
# packaging/debian/control (scripts/install-deps installs them); lintian
# is run when it is installed.
#
# Exit status: 0 built (lintian: no errors), 1 the build failed, 2
# lintian reported errors.
#
# Environment:
#   DEB_BUILD_OPTIONS   passed on; parallel=<online CPUs> unless it sets one
#   RAVNEST_KEEP=1      keep the scratch directory (its path is printed)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=packaging/export-tree.sh
. "$here/export-tree.sh"

outdir=${1:-$root/build-packages/deb}
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)

for tool in dpkg-buildpackage dh; do
        command -v "$tool" >/dev/null ||
                { echo "build-deb.sh: $tool is missing (apt-get install dpkg-dev debhelper)" >&2; exit 1; }
done

version=$(project_version "$root")
deb_version=$(dpkg-parsechangelog -l "$here/debian/changelog" -S Version)
if [ "${deb_version%%-*}" != "$version" ]; then
        echo "build-deb.sh: packaging/debian/changelog is at $deb_version but meson.build at $version:" \
             "add a changelog entry (dch -v $version)" >&2
        exit 1
fi

scratch=$(mktemp -d /var/tmp/ravnest-build-deb.XXXXXX)
cleanup() {
        if [ "${RAVNEST_KEEP:-0}" = 1 ]; then echo "build-deb.sh: kept $scratch"
        else rm -rf --one-file-system "$scratch"; fi
}
trap cleanup EXIT

src=$scratch/ravnest-$version
export_tree "$root" "$src"
rm -rf "$src/debian"
cp -a "$here/debian" "$src/debian"

case " ${DEB_BUILD_OPTIONS:-} " in
*" parallel="*) ;;
*) DEB_BUILD_OPTIONS="${DEB_BUILD_OPTIONS:+$DEB_BUILD_OPTIONS }parallel=$(nproc)"; export DEB_BUILD_OPTIONS ;;
esac

t=$(date +%s)
if ! (cd "$src" && dpkg-buildpackage -us -uc -b) >"$scratch/build.log" 2>&1; then
        tail -n 40 "$scratch/build.log" >&2
        echo "build-deb.sh: dpkg-buildpackage failed (log: $scratch/build.log, kept)" >&2
        RAVNEST_KEEP=1
        exit 1
fi
cp "$scratch/build.log" "$outdir/build.log"
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
changes=ravnest_${deb_version}_$arch.changes
# The .changes names what the build made.
for f in "$changes" $(sed -n '/^Files:/,/^[^ ]/ s/^ [0-9a-f]\{32\} [0-9]\+ [^ ]\+ [^ ]\+ //p' "$scratch/$changes"); do
        mv -f "$scratch/$f" "$outdir/"
done
echo "build-deb.sh: built in $(($(date +%s) - t))s:"
ls -l "$outdir"/*.deb

if ! command -v lintian >/dev/null; then
        echo "build-deb.sh: lintian is missing (apt-get install lintian): not checked" >&2
        exit 0
fi
t=$(date +%s)
status=0
# --fail-on error: warnings are reported, not fatal.
lintian --info --display-info --fail-on error "$outdir/$changes" >"$outdir/lintian.txt" 2>&1 || status=2
echo "build-deb.sh: lintian ($(($(date +%s) - t))s): $(grep -c '^E:' "$outdir/lintian.txt") errors," \
     "$(grep -c '^W:' "$outdir/lintian.txt") warnings, $(grep -c '^I:' "$outdir/lintian.txt") infos"
sed 's/^/  /' "$outdir/lintian.txt"
exit $status
