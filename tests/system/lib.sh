# shellcheck shell=bash
# lib.sh — what the system tests share (sourced by bash: test-systemd.sh,
# test-deb.sh, test-rpm.sh):
#
#   . "$here/lib.sh"
#   require_root systemd-nspawn unshare nsenter   # skip (77) without them
#   cache=$(rootfs_cache_path "$RECIPE" "$PACKAGES")
#   rootfs_ensure "$cache" "$PACKAGES"            # debootstrap, once
#   scratch_new ravnest-foo-test                  # $scratch, cleaned on exit
#   rootfs_copy "$cache" "$scratch/rootfs"
#   container_boot "$scratch/rootfs" --private-network
#   ct systemctl status                           # a command inside
#   check "name" ct systemctl is-active foo       # one PASS or FAIL line
#   container_poweroff
#   summary                                       # status: 1 if any failed
#
# Each check prints one PASS or FAIL line; skip() exits 77 with a reason.
#
# Environment:
#   RAVNEST_DEBIAN_MIRROR     (default http://deb.debian.org/debian)
#   RAVNEST_ROOTFS_CACHE_DIR  where cached rootfs live (default /var/tmp)
#   RAVNEST_KEEP=1            keep the scratch directory (its path is printed)

SUITE=bookworm
MIRROR=${RAVNEST_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache_dir=${RAVNEST_ROOTFS_CACHE_DIR:-/var/tmp}

# The rootfs test-systemd.sh and test-rpm.sh install ravnest into: systemd
# and D-Bus, ravnestd's shared libraries (ldd ravnestd, mapped to Debian 12
# packages) and procps for the unit's /bin/kill. Changing this list (or
# RUNTIME_RECIPE) builds a new cache.
# shellcheck disable=SC2034 # used by the scripts that source this
RUNTIME_PACKAGES="systemd,dbus,procps,libsystemd0,liburing2,libopenblas0-pthread,libgfortran5,libconfig9,zlib1g,libsodium23,libssl3,libmicrohttpd12"
# shellcheck disable=SC2034
RUNTIME_RECIPE=2

# ---- reporting ---------------------------------------------------------------
n_pass=0
n_fail=0
failed=()
t0=$(date +%s)

log() { printf '[%3ds] %s\n' $(($(date +%s) - t0)) "$*"; }
pass() { n_pass=$((n_pass + 1)); printf 'PASS: %s\n' "$1"; }
fail() {
        n_fail=$((n_fail + 1)); failed+=("$1")
        printf 'FAIL: %s\n' "$1"
        shift
        [ $# -gt 0 ] && printf '      %s\n' "$@"
        return 0
}
skip() {
        printf '\nSKIP (exit 77): %s\n\n' "$*"
        printf 'SKIP: %s\n' "$*" >&2
        exit 77
}
# check NAME COMMAND...: PASS if the command succeeds.
check() {
        local name=$1 out
        shift
        if out=$("$@" 2>&1); then pass "$name"; else fail "$name" "$(printf '%s' "$out" | tail -n 5)"; fi
}
# summary: the counts and the failed checks; status 1 if any failed.
summary() {
        printf '\n%d passed, %d failed in %ds\n' "$n_pass" "$n_fail" $(($(date +%s) - t0))
        local f
        for f in "${failed[@]}"; do printf '  failed: %s\n' "$f"; done
        [ "$n_fail" -eq 0 ]
}
# wait_for SECONDS COMMAND...: poll until the command succeeds.
wait_for() {
        local deadline=$(($(date +%s) + $1))
        shift
        until "$@" >/dev/null 2>&1; do
                [ "$(date +%s)" -ge "$deadline" ] && return 1
                sleep 0.5
        done
}

# ---- preconditions -----------------------------------------------------------
# require_root TOOL...: skip unless root with every TOOL.
require_root() {
        [ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap, systemd-nspawn, nsenter)"
        local tool
        for tool in "$@"; do
                command -v "$tool" >/dev/null ||
                        skip "$tool is missing (apt-get install systemd-container meson ninja-build util-linux)"
        done
}

# ---- the rootfs, built once ---------------------------------------------------
# rootfs_cache_path RECIPE PACKAGES [KEY...]: where the rootfs debootstrap
# makes with PACKAGES is cached; any change to its inputs names a new one.
rootfs_cache_path() {
        local recipe=$1
        shift
        printf '%s/ravnest-rootfs-%s\n' "$cache_dir" \
                "$(printf '%s\n' "$recipe" "$SUITE" "$MIRROR" "$@" | sha256sum | cut -c1-16)"
}

# rootfs_drop_apt_cache DIR: the default last step of a new rootfs.
rootfs_drop_apt_cache() {
        rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*
}

# rootfs_unavailable CACHE: succeeds, and says why, when CACHE is missing
# and cannot be built here.
rootfs_unavailable() {
        [ -d "$1" ] && return 1
        if ! command -v debootstrap >/dev/null; then
                echo "debootstrap is missing (apt-get install debootstrap) and $1 is not built yet"
        elif ! timeout 20 wget -q -O /dev/null "$MIRROR/dists/$SUITE/Release"; then
                echo "the Debian mirror $MIRROR is unreachable and $1 is not built yet"
        else
                return 1
        fi
}

# rootfs_ensure CACHE PACKAGES [HOOK]: build CACHE with debootstrap
# (minbase plus PACKAGES) unless it exists; skip (77) when that is needed
# and cannot be done. HOOK DIR (default rootfs_drop_apt_cache) finishes
# the new tree before it is moved into place; it fails the build by
# returning non-zero. Concurrent runs wait for each other.
rootfs_ensure() {
        local cache=$1 packages=$2 hook=${3:-rootfs_drop_apt_cache} t why
        why=$(rootfs_unavailable "$cache") && skip "$why"
        mkdir -p "$cache_dir"
        exec 9>"$cache.lock"
        flock 9 # another run may be building it
        if [ ! -d "$cache" ]; then
                t=$(date +%s)
                _rootfs_build "$cache" "$packages" "$hook" || { echo "FAIL: debootstrap of the rootfs"; exit 1; }
                log "rootfs built in $(($(date +%s) - t))s"
        fi
        flock -u 9
        exec 9>&-
}
_rootfs_build() {
        local cache=$1 packages=$2 hook=$3 tmp=$1.tmp.$$
        rm -rf --one-file-system "$tmp"
        log "building $cache (debootstrap $SUITE, about a minute)"
        if ! debootstrap --variant=minbase --include="$packages" "$SUITE" "$tmp" "$MIRROR" >"$tmp.log" 2>&1; then
                tail -n 20 "$tmp.log"
                rm -rf --one-file-system "$tmp" "$tmp.log"
                return 1
        fi
        rm -f "$tmp.log"
        if ! "$hook" "$tmp"; then
                rm -rf --one-file-system "$tmp"
                return 1
        fi
        # nspawn gives the container its machine ID; an empty file lets
        # systemd take it instead of finding a stale one.
        : >"$tmp/etc/machine-id"
        mv "$tmp" "$cache"
}

# ---- scratch directory and cleanup -------------------------------------------
scratch=
nspawn_pid=
leader=
cgroups=()

# scratch_new PREFIX: a new $scratch under /var/tmp (nspawn mounts a tmpfs
# on the container's /tmp), removed on exit with the container.
scratch_new() {
        scratch=$(mktemp -d "/var/tmp/$1.XXXXXX")
        trap cleanup EXIT
        trap 'exit 130' INT TERM
}

cleanup() {
        if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
                [ -n "$leader" ] && ct systemctl poweroff --no-block >/dev/null 2>&1
                for _ in $(seq 1 100); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done
                if kill -0 "$nspawn_pid" 2>/dev/null; then
                        log "the container did not power off; killing its init ($leader) and systemd-nspawn ($nspawn_pid)"
                        [ -n "$leader" ] && kill -KILL "$leader" 2>/dev/null
                        kill -KILL "$nspawn_pid" 2>/dev/null
                fi
                wait "$nspawn_pid" 2>/dev/null
        fi
        for g in "${cgroups[@]}"; do
                find "$g" -depth -type d -exec rmdir {} + 2>/dev/null || log "could not remove the cgroup $g"
        done
        [ -n "$scratch" ] || return 0
        if [ "${RAVNEST_KEEP:-0}" = 1 ]; then
                log "kept $scratch"
        else
                rm -rf --one-file-system "$scratch"
        fi
}

# rootfs_copy CACHE DEST: a copy of the cached rootfs to boot or change.
rootfs_copy() {
        local t
        t=$(date +%s)
        cp -a --reflink=auto "$1" "$2" || { echo "FAIL: copy of the rootfs"; exit 1; }
        log "copied the rootfs to $2 in $(($(date +%s) - t))s"
}

# ---- the container ------------------------------------------------------------
# container_boot ROOTFS [NSPAWN-ARG...]: boot ROOTFS with systemd-nspawn
# and wait until its systemd is running; sets $nspawn_pid and $leader (its
# init, for ct). The console goes to $scratch/console.log. Exits on a boot
# that does not come up.
container_boot() {
        local rootfs=$1 t state
        shift
        local nspawn_args=(-q -D "$rootfs" --register=no --keep-unit --boot --console=pipe "$@")
        # systemd-nspawn puts itself and the container into "supervisor" and
        # "payload" under the cgroup it starts in: when that is the root, as
        # here where PID 1 is not systemd, concurrent runs would share them.
        # Each run gets a cgroup of its own in every hierarchy nspawn uses.
        cgroups=()
        for h in /sys/fs/cgroup /sys/fs/cgroup/unified /sys/fs/cgroup/systemd; do
                [ "$(stat -f -c %T "$h" 2>/dev/null)" = cgroup2fs ] || [ "$h" = /sys/fs/cgroup/systemd ] || continue
                [ -w "$h/cgroup.procs" ] && mkdir "$h/${scratch##*/}" 2>/dev/null && cgroups+=("$h/${scratch##*/}")
        done
        # The container's systemd gets a cgroup v2 tree (what Debian 12 runs
        # on): in the host's hybrid layout it would find the v1 controllers
        # read-only and have no CPUUsageNSec.
        # The mount namespace keeps nspawn's tmpfs in /run/systemd/nspawn
        # private.
        (
                for g in "${cgroups[@]}"; do echo "$BASHPID" >"$g/cgroup.procs" || exit 1; done
                export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1
                exec unshare --mount --propagation private sh -c \
                        'mkdir -p /run/systemd/nspawn && mount -t tmpfs tmpfs /run/systemd/nspawn && exec systemd-nspawn "$@"' \
                        sh "${nspawn_args[@]}"
        ) </dev/null >"$scratch/console.log" 2>&1 &
        nspawn_pid=$!

        t=$(date +%s)
        for _ in $(seq 1 300); do
                kill -0 "$nspawn_pid" 2>/dev/null || break
                leader=$(_find_leader) && [ -S "/proc/$leader/root/run/systemd/private" ] && break
                leader=
                sleep 0.1
        done
        if [ -z "$leader" ]; then
                tail -n 30 "$scratch/console.log"
                fail "boot: /run/systemd/private did not appear within 30 s"
                exit 1
        fi
        state=$(ct timeout 60 systemctl is-system-running --wait 2>&1)
        case $state in
        running) pass "boot: systemd is running ($(($(date +%s) - t))s, init is PID $leader)" ;;
        *) fail "boot: systemd is '$state'" "$(ct systemctl --failed --no-legend 2>&1)" ;;
        esac
}

# The container's init: the descendant of nspawn that is PID 1 of its own
# PID namespace.
_find_leader() {
        local todo=("$nspawn_pid") p c
        while [ ${#todo[@]} -gt 0 ]; do
                p=${todo[0]}; todo=("${todo[@]:1}")
                if [ "$p" != "$nspawn_pid" ] && [ "$(awk '/^NSpid:/ { print $NF }' "/proc/$p/status" 2>/dev/null)" = 1 ]; then
                        echo "$p"; return 0
                fi
                for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do todo+=("$c"); done
        done
        return 1
}

# ct COMMAND...: run a command in the container, with a clean environment.
ct() {
        nsenter -t "$leader" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
                SYSTEMD_PAGER=cat SYSTEMD_COLORS=0 TERM=dumb "$@"
}
# ct_write PATH MODE: stdin to a file in the container.
ct_write() { ct sh -c 'umask 077 && cat >"$1" && chmod "$2" "$1"' sh "$1" "$2"; }

# container_poweroff: systemctl poweroff, and a check that it ends.
container_poweroff() {
        log "powering off"
        ct systemctl poweroff --no-block >/dev/null 2>&1
        for _ in $(seq 1 150); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done
        if kill -0 "$nspawn_pid" 2>/dev/null; then fail "systemctl poweroff: the container is still up after 30 s"
        else wait "$nspawn_pid" 2>/dev/null; pass "systemctl poweroff"; fi
        nspawn_pid=
}
