#!/bin/bash
# test-deb.sh — the .deb as an operator meets it: built, checked by lintian,
# installed with apt in a booted Debian 12 container, used, removed and
# purged.
#
# (a) packaging/build-deb.sh builds the package from a copy of the project
#     (dpkg-buildpackage -us -uc -b) and runs lintian; the result is kept in
#     RAVNEST_DEB_DIR and reused while the files it is made of are the same.
# (b) A minbase rootfs with systemd and D-Bus only: none of ravnestd's
#     libraries, no procps. When it is made, apt's package lists and the
#     archives of everything the .deb pulls in (Depends and Recommends,
#     resolved by apt against the mirror) are fetched into it; it is
#     cached under a name that changes with those fields. So apt resolves
#     the package's dependencies in the container as on any Debian 12
#     machine, but without a network: the container has only its loopback
#     (--private-network).
# (c) Boot it with systemd-nspawn, `apt-get install ./ravnest_*.deb`, then:
#     the service is enabled and active as user ravnest, ravnestctl and
#     busctl answer "unconfigured", the journal has its lines, it uses no
#     CPU; `ravnestctl identity` as root makes the daemon's key, a job and
#     a network in the conffile and a reload make it train (as the README
#     tells operators); a reinstall keeps a changed conffile and restarts the service;
#     `apt-get remove` stops it and leaves the conffile; `apt-get purge`
#     leaves nothing of the package, nor the secret the operator made in
#     /etc/ravnest (the user ravnest stays, by design).
#
# Each check prints one PASS or FAIL line; the exit status is 1 if any
# failed, 77 (skip) when this machine cannot run it. Needs root,
# systemd-nspawn, dpkg-dev and debhelper (and lintian, else that check is
# skipped); the first run (and one after the package's dependencies
# change) also needs debootstrap and the Debian mirror.
#
# Environment:
#   RAVNEST_SOURCE_ROOT       the project (default: this script's ../..)
#   RAVNEST_DEB_DIR           where the built package is kept
#                             (default /var/tmp/ravnest-deb-<hash>)
#   RAVNEST_DEBIAN_MIRROR, RAVNEST_ROOTFS_CACHE_DIR, RAVNEST_KEEP: see lib.sh
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@" # also when run as "sh test-deb.sh"
set -u

# The rootfs before the package's dependencies come in. Changing this list
# (or ROOTFS_RECIPE) builds a new cache.
PACKAGES="systemd,dbus"
ROOTFS_RECIPE="deb-2"

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/system/lib.sh
. "$here/lib.sh"
root=${RAVNEST_SOURCE_ROOT:-$(cd "$here/../.." && pwd)}
# shellcheck source=packaging/export-tree.sh
. "$root/packaging/export-tree.sh"
pkg_dir=${RAVNEST_DEB_DIR:-/var/tmp/ravnest-deb-$(printf '%s' "$root" | sha256sum | cut -c1-12)}

# ---- preconditions -----------------------------------------------------------
require_root systemd-nspawn unshare nsenter
for tool in dpkg-buildpackage dh; do
        command -v "$tool" >/dev/null || skip "$tool is missing (apt-get install dpkg-dev debhelper)"
done

# ---- (a) the package ---------------------------------------------------------
t=$(date +%s)
hash=$(tree_hash "$root")
if [ -f "$pkg_dir/tree-hash" ] && [ "$(cat "$pkg_dir/tree-hash")" = "$hash" ] && ls "$pkg_dir"/ravnest_*.deb >/dev/null 2>&1; then
        pass "build: reusing $pkg_dir, built from the same files (tree $hash)"
        lintian_status=0
        grep -q '^E:' "$pkg_dir/lintian.txt" 2>/dev/null && lintian_status=2
else
        rm -rf --one-file-system "$pkg_dir"
        mkdir -p "$pkg_dir"
        "$root/packaging/build-deb.sh" "$pkg_dir" >"$pkg_dir/build-deb.out" 2>&1
        lintian_status=$?
        if [ "$lintian_status" = 1 ] || ! ls "$pkg_dir"/ravnest_*.deb >/dev/null 2>&1; then
                tail -n 30 "$pkg_dir/build-deb.out"
                fail "build: packaging/build-deb.sh ($(($(date +%s) - t))s)"
                summary
                exit 1
        fi
        echo "$hash" >"$pkg_dir/tree-hash"
        pass "build: packaging/build-deb.sh ($(($(date +%s) - t))s, tree $hash)"
fi
deb=$(ls "$pkg_dir"/ravnest_*.deb)
log "$(basename "$deb"): $(stat -c %s "$deb") bytes"
if [ ! -f "$pkg_dir/lintian.txt" ]; then
        log "lintian is not installed: not checked (apt-get install lintian)"
elif [ "$lintian_status" = 0 ]; then
        pass "lintian: no errors ($(grep -c '^W:' "$pkg_dir/lintian.txt") warnings, $(grep -c '^I:' "$pkg_dir/lintian.txt") infos)"
        grep -E '^[WI]:' "$pkg_dir/lintian.txt" | sed 's/^/      /'
else
        fail "lintian: errors" "$(grep -E '^[EW]:' "$pkg_dir/lintian.txt")"
fi
fields=$(dpkg-deb -f "$deb" Pre-Depends Depends Recommends)
printf '%s\n' "$fields" | sed 's/^/      /'
for d in procps libopenblas0 liburing2 libconfig9 libsodium23 libssl3 libsystemd0 zlib1g libmicrohttpd12 \
         'systemd | systemd-standalone-sysusers' dataset-fashion-mnist; do
        printf '%s\n' "$fields" | grep -q -F -- "$d" || fail "control: $d is missing from Depends/Recommends"
done
if [ "$(dpkg-deb -f "$deb" Package)" = ravnest ] && dpkg-deb -I "$deb" conffiles 2>/dev/null | grep -qx /etc/ravnest/ravnestd.conf; then
        pass "control: package ravnest, /etc/ravnest/ravnestd.conf is a conffile"
else
        fail "control: package ravnest with the conffile /etc/ravnest/ravnestd.conf"
fi

# ---- (b) the rootfs ----------------------------------------------------------
# deb_rootfs_hook DIR: apt's lists and the archives the .deb needs, fetched
# once with the network, in a chroot of the new rootfs.
deb_rootfs_hook() {
        local dir=$1 security=${MIRROR%/debian}/debian-security
        {
                echo "deb $MIRROR $SUITE main"
                echo "deb $MIRROR $SUITE-updates main"
                # Where the mirror has it, as on an installed system.
                [ "$security" != "$MIRROR" ] && timeout 20 wget -q -O /dev/null "$security/dists/$SUITE-security/Release" &&
                        echo "deb $security $SUITE-security main"
        } >"$dir/etc/apt/sources.list"
        # debootstrap's own archives are installed already.
        rm -f "$dir"/var/cache/apt/archives/*.deb
        cp "$deb" "$dir/var/tmp/"
        log "fetching apt's lists and the archives $(basename "$deb") needs"
        unshare --mount --propagation private sh -c '
                mount -t proc proc "$1/proc" &&
                chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive sh -c "
                        apt-get update -q && apt-get install -q -y --download-only /var/tmp/$2"' \
                sh "$dir" "$(basename "$deb")" >"$dir.fetch.log" 2>&1
        local status=$?
        rm -f "$dir/var/tmp/$(basename "$deb")"
        [ "$status" = 0 ] || tail -n 20 "$dir.fetch.log"
        rm -f "$dir.fetch.log"
        return "$status"
}
cache=$(rootfs_cache_path "$ROOTFS_RECIPE" "$PACKAGES" "$fields")
rootfs_ensure "$cache" "$PACKAGES" deb_rootfs_hook
scratch_new ravnest-deb-test
rootfs=$scratch/rootfs
rootfs_copy "$cache" "$rootfs"
cp "$deb" "$rootfs/var/tmp/"
debname=$(basename "$deb")

# ---- (c) boot and install ----------------------------------------------------
container_boot "$rootfs" --private-network

prop() { ct systemctl show -P "$1" ravnestd.service; }
apt_in() { ct env DEBIAN_FRONTEND=noninteractive apt-get -q -y "$@"; }
is_running() { ct sh -c 'grep -qx ravnestd /proc/[0-9]*/comm 2>/dev/null'; }

# The package's paths, and those of them the system had before: after the
# purge, exactly those may be left.
dpkg-deb --fsys-tarfile "$deb" | tar -t | sed 's|^\./|/|; s|/$||; /^$/d' >"$scratch/files"
ct sh -c 'while IFS= read -r p; do if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi; done' \
        <"$scratch/files" >"$scratch/files-before"

t=$(date +%s)
if out=$(apt_in install "/var/tmp/$debname" 2>&1); then
        pass "apt-get install ./$debname ($(($(date +%s) - t))s, offline)"
        printf '%s\n' "$out" | sed -n '/NEW packages will be installed:/,/^[^ ]/p' | sed '$d;s/^/      /'
else
        fail "apt-get install ./$debname" "$(printf '%s' "$out" | tail -n 15)"
        summary
        exit 1
fi
status=$(ct dpkg-query -W -f '${db:Status-Abbrev} ${Version}' ravnest 2>&1)
if [ "${status%% *}" = ii ]; then pass "dpkg: ravnest is installed ($status)"
else fail "dpkg: ravnest is installed" "dpkg-query: $status"; fi
check "apt installed the Recommends dataset-fashion-mnist" ct dpkg-query -W dataset-fashion-mnist
if home=$(ct getent passwd ravnest) && [ "$(echo "$home" | cut -d: -f6)" = /var/lib/ravnest ]; then
        pass "user ravnest (sysusers, from the postinst): $home"
else
        fail "user ravnest with home /var/lib/ravnest" "$home"
fi

# ---- the service -------------------------------------------------------------
enabled=$(ct systemctl is-enabled ravnestd.service 2>&1)
if [ "$enabled" = enabled ]; then pass "systemctl is-enabled ravnestd: enabled"
else fail "systemctl is-enabled ravnestd: $enabled"; fi
if wait_for 30 sh -c "[ \"\$(nsenter -t $leader -a systemctl show -P ActiveState ravnestd.service)\" = active ]"; then
        pid=$(prop MainPID)
        pass "systemctl is-active ravnestd: active (PID $pid, user $(ct ps -o user= -p "$pid" 2>&1))"
else
        fail "ravnestd active after install: $(prop ActiveState)/$(prop SubState)" \
                "$(ct journalctl -q -u ravnestd.service -n 8 --no-hostname -o cat 2>&1)"
fi
if out=$(ct timeout 10 ravnestctl status 2>&1) && printf '%s' "$out" | grep -q 'State: unconfigured'; then
        pass "ravnestctl status: State unconfigured"; printf '%s\n' "$out" | sed 's/^/      /'
else
        fail "ravnestctl status (State: unconfigured)" "$out"
fi
out=$(ct busctl get-property org.ravnest.Node1 /org/ravnest/Node1 org.ravnest.Node1 State 2>&1)
if [ "$out" = 's "unconfigured"' ]; then pass "busctl get-property org.ravnest.Node1 ... State: $out"
else fail "busctl get-property org.ravnest.Node1 /org/ravnest/Node1 org.ravnest.Node1 State" "got: $out"; fi
journal=$(ct journalctl -q --no-pager -o cat -u ravnestd.service 2>&1)
if printf '%s' "$journal" | grep -q 'unconfigured' && printf '%s' "$journal" | grep -q 'org.ravnest.Node1'; then
        pass "journalctl -u ravnestd: $(printf '%s\n' "$journal" | grep -c .) lines, the unconfigured notice and the bus name"
        printf '%s\n' "$journal" | sed 's/^/      /'
else
        fail "journalctl -u ravnestd has the unconfigured notice and the bus name" "$journal"
fi
mid=$(ct sed -n 's/^-- \([0-9a-f]\{32\}\)$/\1/p' /usr/lib/systemd/catalog/ravnest.catalog | head -n 1)
if [ -n "$mid" ] && ct journalctl --list-catalog 2>/dev/null | grep -q "^$mid "; then
        pass "journal catalog updated by systemd's trigger (has $mid)"
else
        fail "journal catalog: no entry $mid after the install (systemd's dpkg trigger)"
fi
c1=$(prop CPUUsageNSec); sleep 3; c2=$(prop CPUUsageNSec)
if [[ $c1 =~ ^[0-9]+$ && $c2 =~ ^[0-9]+$ ]] && [ $((c2 - c1)) -lt 30000000 ]; then
        pass "unconfigured: $(((c2 - c1) / 1000)) µs of CPU in 3 s"
else
        fail "unconfigured uses no CPU: CPUUsageNSec $c1 -> $c2 in 3 s (limit 30 ms)"
fi

# ---- joining a network, as the README tells an operator ------------------------
# The key first (root, before the daemon has one: it must be the daemon's),
# then a secret only ravnest can read, a job and a listening address in
# the conffile (in place of the sample), and a reload: the node leaves "unconfigured" and trains.
if key=$(ct ravnestctl identity 2>/dev/null) && [[ $key =~ ^[0-9a-f]{64}$ ]] &&
   [ "$(ct stat -c '%U %a' /var/lib/ravnest/identity 2>&1)" = "ravnest 600" ]; then
        pass "ravnestctl identity (as root): $key, /var/lib/ravnest/identity is ravnest's, 0600"
else
        fail "ravnestctl identity as root: a key owned by ravnest, 0600" \
                "key '$key', $(ct stat -c '%U %a' /var/lib/ravnest/identity 2>&1)"
fi
ct cp /etc/ravnest/ravnestd.conf /var/tmp/ravnestd.conf.orig
ct sh -c 'umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d " \n" >/etc/ravnest/secret && chown ravnest: /etc/ravnest/secret'
ct sh -c 'cat >/etc/ravnest/ravnestd.conf' <<'EOF'
job = "/usr/share/ravnest/jobs/fashion-mnist-mlp.job";
threads = 1;
idle = { enabled = false; };
network = { listen = "127.0.0.1:7000"; secret_file = "/etc/ravnest/secret"; };
EOF
if out=$(ct ravnestd --check-config 2>&1) && ct systemctl reload ravnestd.service &&
   wait_for 60 sh -c "nsenter -t $leader -a ravnestctl status 2>/dev/null | grep -q 'State: training'"; then
        pass "configured and reloaded: State training"
else
        fail "configured and reloaded: State training" "$out" "$(ct ravnestctl status 2>&1 | head -n 3)" \
                "$(ct journalctl -q -u ravnestd.service -n 8 --no-hostname -o cat 2>&1)"
fi
ct cp /var/tmp/ravnestd.conf.orig /etc/ravnest/ravnestd.conf
# the secret the operator made stays until the purge, which must remove it
# A reload applies only idle and checkpoint settings to a running node
# (ravnestd(8)): leaving the network takes a restart.
ct systemctl restart ravnestd.service
if wait_for 30 sh -c "nsenter -t $leader -a ravnestctl status 2>/dev/null | grep -q 'State: unconfigured'"; then
        pass "the sample configuration back and restarted: State unconfigured"
else
        fail "the sample configuration back and restarted: State unconfigured" "$(ct ravnestctl status 2>&1 | head -n 3)"
fi

# ---- reinstall: the conffile stays as the operator left it ---------------------
ct sh -c 'echo "# changed by test-deb.sh" >>/etc/ravnest/ravnestd.conf'
pid=$(prop MainPID)
t=$(date +%s)
if out=$(apt_in install --reinstall "/var/tmp/$debname" 2>&1); then
        pass "apt-get install --reinstall ($(($(date +%s) - t))s)"
else
        fail "apt-get install --reinstall" "$(printf '%s' "$out" | tail -n 10)"
fi
if ct grep -q 'changed by test-deb.sh' /etc/ravnest/ravnestd.conf; then pass "reinstall keeps the changed conffile"
else fail "reinstall replaced the changed /etc/ravnest/ravnestd.conf"; fi
if wait_for 30 sh -c "[ \"\$(nsenter -t $leader -a systemctl show -P ActiveState ravnestd.service)\" = active ]" &&
   [ "$(prop MainPID)" != "$pid" ] && [ "$(ct systemctl is-enabled ravnestd.service 2>&1)" = enabled ]; then
        pass "reinstall restarted the service (PID $pid -> $(prop MainPID)), still enabled"
else
        fail "reinstall: $(prop ActiveState), PID $pid -> $(prop MainPID), $(ct systemctl is-enabled ravnestd.service 2>&1)"
fi

# ---- remove, then purge -------------------------------------------------------
t=$(date +%s)
if out=$(apt_in remove ravnest 2>&1); then pass "apt-get remove ravnest ($(($(date +%s) - t))s)"
else fail "apt-get remove ravnest" "$(printf '%s' "$out" | tail -n 10)"; fi
state=$(prop ActiveState) load=$(prop LoadState)
if [ "$state" = inactive ] && [ "$load" = not-found ] && ! is_running; then
        pass "after remove: ravnestd stopped, no ravnestd process, unit gone (LoadState $load)"
else
        fail "after remove: ActiveState=$state LoadState=$load, process: $(is_running && echo running || echo none)"
fi
if ct test -f /etc/ravnest/ravnestd.conf && ! ct test -e /usr/sbin/ravnestd &&
   [ "$(ct dpkg-query -W -f '${db:Status-Abbrev}' ravnest 2>&1)" = 'rc ' ]; then
        pass "after remove: binaries gone, conffile kept (dpkg: rc)"
else
        fail "after remove: binaries gone, conffile kept, dpkg state rc" \
                "dpkg: '$(ct dpkg-query -W -f '${db:Status-Abbrev}' ravnest 2>&1)'"
fi

t=$(date +%s)
if out=$(apt_in purge ravnest 2>&1); then pass "apt-get purge ravnest ($(($(date +%s) - t))s)"
else fail "apt-get purge ravnest" "$(printf '%s' "$out" | tail -n 10)"; fi
if out=$(ct dpkg-query -W ravnest 2>&1); then fail "after purge: dpkg still knows ravnest" "$out"
else pass "after purge: dpkg -l knows no ravnest (${out})"; fi
# None of the package's paths is claimed by it or left behind, but those
# the system had before.
left=$(ct sh -c '
        while IFS= read -r p; do
                if dpkg-query -S "$p" 2>/dev/null | grep -q "^ravnest[:,]"; then echo "dpkg -S: $p is still ravnest'"'"'s"; fi
                if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi
        done' <"$scratch/files" 2>&1 | grep -v -x -F -f "$scratch/files-before")
if [ -z "$left" ] && [ -s "$scratch/files" ]; then
        pass "after purge: none of the package's $(grep -c . "$scratch/files") paths is claimed (dpkg -S) or left, but the $(grep -c . "$scratch/files-before") the system had before"
else
        fail "after purge: the package left something" "$left"
fi
gone=
for p in /etc/ravnest /var/lib/ravnest /lib/systemd/system/ravnestd.service /usr/sbin/ravnestd /usr/bin/ravnestctl \
         /etc/systemd/system/multi-user.target.wants/ravnestd.service \
         /var/lib/systemd/deb-systemd-helper-enabled/ravnestd.service.dsh-also; do
        ct test -e "$p" -o -L "$p" && gone="$gone $p"
done
if [ -z "$gone" ]; then pass "after purge: /etc/ravnest, /var/lib/ravnest, the unit, its enablement and the binaries are gone"
else fail "after purge: still there:$gone"; fi
state=$(prop ActiveState) load=$(prop LoadState)
if [ "$state" = inactive ] && [ "$load" = not-found ] && ! is_running; then
        pass "after purge: not running, systemd knows no ravnestd.service"
else
        fail "after purge: ActiveState=$state LoadState=$load, process: $(is_running && echo running || echo none)"
fi
failed_units=$(ct systemctl --failed --no-legend --plain 2>&1)
if [ -z "$failed_units" ]; then pass "after purge: no failed units"
else fail "after purge: failed units" "$failed_units"; fi
if user=$(ct getent passwd ravnest); then pass "after purge: the user ravnest stays, as Debian keeps system users ($user)"
else fail "after purge: the user ravnest is gone (the package does not remove it)"; fi

# ---- the end -------------------------------------------------------------------
container_poweroff
summary
