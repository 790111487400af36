# containers/oci-env.sh — source it (". containers/oci-env.sh") to point
# buildah, podman and skopeo at a private container store, with the settings
# measured to work on the build machines (../shared/PLATFORM.md in the
# workspace; Debian 12's podman 4.3, buildah 1.28, skopeo 1.9):
#
#   storage driver vfs      (each layer a full copy: slow and big, but works)
#   isolation chroot        for the RUN steps of a build
#   runtime runc            crun rejects this host's cgroup layout
#   cgroup_manager cgroupfs PID 1 is not systemd
#   ulimits lowered         root lacks CAP_SYS_RESOURCE to raise them
#   netns none              no podman bridge (it would leave iptables rules
#                           and CNI state on the host); tests make their own
#                           network namespaces and pass --network ns:PATH
#
# Everything lives under $RAVNEST_OCI_DIR (default /var/tmp/ravnest-oci):
# images, containers, volumes, run state and logs; removing that directory
# undoes it all. After sourcing, plain "podman images" or "podman ps -a"
# show the private store. One file escapes: containers/image (in podman 4.3
# and skopeo 1.9) keeps its blob-info cache in /var/lib/containers/cache for
# root, with no setting to move it; ravnest_oci_tidy removes it again when
# /var/lib/containers did not exist before (call it on exit).
#
# Healthchecks: podman runs them from a systemd timer, which needs systemd
# as PID 1. DISABLE_HC_SYSTEMD=true keeps "podman run" from trying (the
# container starts either way, but with two "unable to get systemd
# connection" errors); "podman healthcheck run NAME" runs the image's
# HEALTHCHECK on demand instead.

RAVNEST_OCI_DIR=${RAVNEST_OCI_DIR:-/var/tmp/ravnest-oci}
export RAVNEST_OCI_DIR

if [ -e /var/lib/containers ]; then ravnest_oci_varlib_existed=1; else ravnest_oci_varlib_existed=0; fi
ravnest_oci_tidy() {
        if [ "$ravnest_oci_varlib_existed" = 0 ] && [ -d /var/lib/containers ]; then
                rm -f /var/lib/containers/cache/blob-info-cache-v1.boltdb
                rmdir /var/lib/containers/cache /var/lib/containers 2>/dev/null || true
        fi
}

mkdir -p "$RAVNEST_OCI_DIR/storage" "$RAVNEST_OCI_DIR/run" "$RAVNEST_OCI_DIR/tmp" \
         "$RAVNEST_OCI_DIR/cni" "$RAVNEST_OCI_DIR/etc"

cat > "$RAVNEST_OCI_DIR/etc/storage.conf" <<EOF
# written by containers/oci-env.sh
[storage]
driver = "vfs"
graphroot = "$RAVNEST_OCI_DIR/storage"
runroot = "$RAVNEST_OCI_DIR/run"
EOF

cat > "$RAVNEST_OCI_DIR/etc/containers.conf" <<EOF
# written by containers/oci-env.sh
[containers]
default_ulimits = [ "nofile=20000:20000", "nproc=32768:32768" ]
log_driver = "k8s-file"
netns = "none"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$RAVNEST_OCI_DIR/run/events.log"
tmp_dir = "$RAVNEST_OCI_DIR/run/libpod"
volume_path = "$RAVNEST_OCI_DIR/storage/volumes"
static_dir = "$RAVNEST_OCI_DIR/storage/libpod"
image_default_transport = "containers-storage:"

[network]
network_backend = "cni"
network_config_dir = "$RAVNEST_OCI_DIR/cni"
EOF

export CONTAINERS_STORAGE_CONF="$RAVNEST_OCI_DIR/etc/storage.conf"
export CONTAINERS_CONF="$RAVNEST_OCI_DIR/etc/containers.conf"
export BUILDAH_ISOLATION=chroot
export DISABLE_HC_SYSTEMD=true
# buildah and podman keep temporary files (layer diffs, archives) in TMPDIR
export TMPDIR="$RAVNEST_OCI_DIR/tmp"
