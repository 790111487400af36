#!/bin/bash
# build-rpm.sh — build ravnest's binary .rpm with rpmbuild.
#
#   packaging/build-rpm.sh [OUTDIR]
#
# Makes ravnest-<version>.tar.gz from the project (see export-tree.sh),
# puts it, units/ravnest.sysusers and packaging/rpm/ravnest.spec in a
# scratch rpmbuild tree, runs `rpmbuild -bb` and copies the .rpm files to
# OUTDIR (default build-packages/rpm in the project, which git ignores).
# Nothing else in the project is written to.
#
# On a Fedora-family system with the build dependencies installed, this is
# an ordinary build. On Debian the rpm database is empty, so rpmbuild runs
# with --nodeps (the build dependencies are then Debian's -dev packages).
#
# Environment:
#   RAVNEST_KEEP=1   keep the scratch directory (its path is printed)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=packaging/export-tree.sh
. "$here/export-tree.sh"

outdir=${1:-$root/build-packages/rpm}
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)

command -v rpmbuild >/dev/null || { echo "build-rpm.sh: rpmbuild is missing (apt-get install rpm)" >&2; exit 1; }

version=$(project_version "$root")
spec_version=$(sed -n 's/^Version: *//p' "$here/rpm/ravnest.spec")
if [ "$spec_version" != "$version" ]; then
        echo "build-rpm.sh: packaging/rpm/ravnest.spec is at $spec_version but meson.build at $version:" \
             "update Version: and %changelog" >&2
        exit 1
fi

scratch=$(mktemp -d /var/tmp/ravnest-build-rpm.XXXXXX)
cleanup() {
        if [ "${RAVNEST_KEEP:-0}" = 1 ]; then echo "build-rpm.sh: kept $scratch"
        else rm -rf --one-file-system "$scratch"; fi
}
trap cleanup EXIT

top=$scratch/rpmbuild
mkdir -p "$top"/{SOURCES,SPECS,BUILD,BUILDROOT,RPMS,SRPMS} "$scratch/tree"
export_tree "$root" "$scratch/tree/ravnest-$version"
tar -C "$scratch/tree" --owner=0 --group=0 -czf "$top/SOURCES/ravnest-$version.tar.gz" "ravnest-$version"
cp "$root/units/ravnest.sysusers" "$top/SOURCES/"
cp "$here/rpm/ravnest.spec" "$top/SPECS/"

# No rpm database that knows the build dependencies: Debian's rpm.
nodeps=
rpm -q rpm >/dev/null 2>&1 || nodeps=--nodeps

t=$(date +%s)
if ! rpmbuild -bb $nodeps --define "_topdir $top" "$top/SPECS/ravnest.spec" >"$scratch/build.log" 2>&1; then
        tail -n 40 "$scratch/build.log" >&2
        echo "build-rpm.sh: rpmbuild failed (log: $scratch/build.log, kept)" >&2
        RAVNEST_KEEP=1
        exit 1
fi
cp "$scratch/build.log" "$outdir/build.log"
find "$top/RPMS" -name '*.rpm' -exec cp {} "$outdir/" \;
echo "build-rpm.sh: built in $(($(date +%s) - t))s${nodeps:+ (rpmbuild $nodeps: no rpm database here)}:"
ls -l "$outdir"/*.rpm
