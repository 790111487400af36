#!/bin/bash
# containers/build-image.sh — build the ravnest OCI image with podman and
# export it as an OCI archive, on a machine without a registry.
#
#   containers/build-image.sh [--output FILE] [--no-export] [--force] [--rebuild-base]
#
# 1. The base: a Debian bookworm minbase made once with debootstrap from the
#    Debian mirror, kept as a tarball in $RAVNEST_OCI_DIR/base and imported
#    with "podman import" as localhost/ravnest-base:bookworm.
# 2. The image: "podman build" of containers/Containerfile with the
#    repository root as context, tagged localhost/ravnest:<version> and
#    :latest. Skipped when the image exists and nothing it is built from
#    changed (a checksum of the Containerfile and the sources it copies, in
#    $RAVNEST_OCI_DIR/image.inputs); --force builds anyway. Layers are cached:
#    a source change recompiles and takes two to three minutes on 2 cores
#    (with vfs each cached layer that a later step uses is copied whole).
# 3. The archive: "podman save --format oci-archive" to FILE (default
#    $RAVNEST_OCI_DIR/ravnest-<version>.oci.tar), which "skopeo inspect
#    oci-archive:FILE", "podman load -i FILE" and "docker load -i FILE"
#    (Docker 25 or later) read; and beside it FILE with .oci.tar replaced by
#    .docker.tar, a docker-archive. The OCI image format has no HEALTHCHECK:
#    only the docker-archive carries it (with the OCI archive, give
#    "--health-cmd 'ravnestctl status'" to podman run or docker run).
#
# All container state lives under $RAVNEST_OCI_DIR (default
# /var/tmp/ravnest-oci; see containers/oci-env.sh). Needs root, podman, runc
# and (for the base, once) debootstrap. Exit status 77 when one is missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
output=
export_archive=1
rebuild_base=0
force=0
while [ $# -gt 0 ]; do
        case $1 in
        --output) output=$2; shift 2 ;;
        --output=*) output=${1#--output=}; shift ;;
        --no-export) export_archive=0; shift ;;
        --rebuild-base) rebuild_base=1; shift ;;
        --force) force=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-image.sh: unknown argument $1" >&2; exit 64 ;;
        esac
done

skip() { echo "build-image.sh: SKIP: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, and podman's vfs store with runc)"
for t in podman runc; do
        command -v "$t" >/dev/null || skip "$t is missing: apt-get install podman runc"
done

. "$here/oci-env.sh"
trap ravnest_oci_tidy EXIT

version=$(sed -n "s/^ *version: *'\([^']*\)'.*/\1/p" "$root/meson.build" | head -n1)
[ -n "$version" ] || { echo "build-image.sh: no version in meson.build" >&2; exit 1; }
image=localhost/ravnest:$version
base=localhost/ravnest-base:bookworm
mirror=${RAVNEST_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${RAVNEST_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
output=${output:-$RAVNEST_OCI_DIR/ravnest-$version.oci.tar}

t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 ))s; }

# ---- 1. the base -------------------------------------------------------------
tarball=$RAVNEST_OCI_DIR/base/bookworm-minbase.tar
if [ "$rebuild_base" = 1 ]; then
        rm -f "$tarball"
        podman rmi -f "$base" >/dev/null 2>&1 || true
fi
if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || skip "debootstrap is missing (apt-get install debootstrap): it makes the base once"
        echo "build-image.sh: debootstrap bookworm (minbase) from $mirror, once"
        rootfs=$RAVNEST_OCI_DIR/base/rootfs
        rm -rf "$rootfs"
        mkdir -p "$rootfs"
        debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$RAVNEST_OCI_DIR/base/debootstrap.log" 2>&1 || {
                tail -n 20 "$RAVNEST_OCI_DIR/base/debootstrap.log" >&2
                echo "build-image.sh: debootstrap failed (log: $RAVNEST_OCI_DIR/base/debootstrap.log)" >&2
                exit 1
        }
        # What debian:bookworm has: updates and security, no caches, no
        # recommends (the Containerfile says --no-install-recommends anyway).
        cat > "$rootfs/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security_mirror bookworm-security main
EOF
        echo 'APT::Install-Recommends "false";' > "$rootfs/etc/apt/apt.conf.d/90ravnest-no-recommends"
        rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log
        tar --numeric-owner --xattrs -C "$rootfs" -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$rootfs"
        echo "build-image.sh: base tarball $(du -h "$tarball" | cut -f1) in $(elapsed)"
fi
if ! podman image exists "$base"; then
        podman import --quiet --change 'CMD ["/bin/bash"]' --message "debootstrap --variant=minbase bookworm" \
                "$tarball" "$base" >/dev/null
        echo "build-image.sh: imported $base"
fi

# ---- 2. the image ------------------------------------------------------------
build() {
        podman build \
                --file "$here/Containerfile" \
                --ignorefile "$here/Containerfile.dockerignore" \
                --format docker \
                --layers \
                --pull=never \
                --isolation chroot \
                --build-arg "BASE_IMAGE=$base" \
                --build-arg "VERSION=$version" \
                "$@" \
                "$root" >> "$RAVNEST_OCI_DIR/build.log" 2>&1 || {
                tail -n 40 "$RAVNEST_OCI_DIR/build.log" >&2
                echo "build-image.sh: podman build failed (log: $RAVNEST_OCI_DIR/build.log)" >&2
                exit 1
        }
}

# What the image is built from: when none of it changed, the image stands.
inputs=$(cd "$root" && {
        echo "version $version base $(podman image inspect --format '{{.Id}}' "$base")"
        sha256sum containers/Containerfile containers/Containerfile.dockerignore
        find meson.build meson_options.txt daemon config man units -type f -print0 | sort -z | xargs -0 sha256sum
} | sha256sum | cut -d' ' -f1)
stamp=$RAVNEST_OCI_DIR/image.inputs   # "<inputs> <image id>" of the last build
up_to_date=0
if [ "$force" = 0 ] && [ -s "$stamp" ] && [ "$(cut -d' ' -f1 "$stamp")" = "$inputs" ] &&
   [ "$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null)" = "$(cut -d' ' -f2 "$stamp")" ]; then
        up_to_date=1
        echo "build-image.sh: $image is up to date with the sources (--force builds anyway)"
else
        rm -f "$stamp"
        revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || true)
        if [ -n "$revision" ] &&
           [ -n "$(git -C "$root" status --porcelain -- meson.build meson_options.txt daemon config man units 2>/dev/null)" ]; then
                revision="$revision-dirty"
        fi
        source_url=${RAVNEST_SOURCE_URL:-$(git -C "$root" remote get-url origin 2>/dev/null || true)}
        labels=(--label "org.opencontainers.image.created=$(date -u +%Y-%m-%dT%H:%M:%SZ)")
        [ -z "$revision" ] || labels+=(--label "org.opencontainers.image.revision=$revision")
        [ -z "$source_url" ] || labels+=(--label "org.opencontainers.image.source=$source_url")

        echo "build-image.sh: building $image (podman build, storage vfs, isolation chroot)"
        t1=$(date +%s)
        : > "$RAVNEST_OCI_DIR/build.log"
        # The build stage first, tagged: its layers are the next build's cache
        # (apt-get of the compilers takes minutes), and the tag keeps them from
        # the prune below, which removes earlier builds' images (with vfs each
        # layer is a full copy of the file system).
        build --target build --tag localhost/ravnest-build:cache
        build "${labels[@]}" --tag "$image" --tag localhost/ravnest:latest
        podman image prune -f >/dev/null 2>&1 || true
        echo "$inputs $(podman image inspect --format '{{.Id}}' "$image")" > "$stamp"
        size=$(podman image inspect --format '{{.Size}}' "$image")
        echo "build-image.sh: built $image in $(( $(date +%s) - t1 ))s, $(( size / 1000000 )) MB"
fi

# ---- 3. the archive ----------------------------------------------------------
docker_output=${output%.oci.tar}.docker.tar
[ "$docker_output" != "$output" ] || docker_output=$output.docker.tar
if [ "$export_archive" = 1 ] && [ "$up_to_date" = 1 ] && [ "$output" -nt "$stamp" ] && [ "$docker_output" -nt "$stamp" ]; then
        echo "build-image.sh: $output is up to date"
elif [ "$export_archive" = 1 ]; then
        rm -f "$output" "$docker_output"
        podman save --quiet --format oci-archive --output "$output" "$image"
        podman save --quiet --format docker-archive --output "$docker_output" "$image"
        echo "build-image.sh: wrote $output ($(du -h "$output" | cut -f1)) and $docker_output"
fi
echo "build-image.sh: done in $(elapsed)"
