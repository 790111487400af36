#!/bin/bash
# test-rpm.sh — the .rpm: built with rpmbuild from a tarball of the
# project, read back with rpm -qp, then installed by rpm into a Debian 12
# rootfs and run under its systemd.
#
# (a) packaging/build-rpm.sh builds it (rpmbuild -bb; --nodeps here, where
#     rpm's database is empty); the result is kept in RAVNEST_RPM_DIR and
#     reused while the files it is made of are the same.
# (b) rpm -qp: the file list, the scriptlets (their systemd and sysusers
#     steps, and sh -n), the automatic library requirements, the provides,
#     the configuration file marked %config(noreplace); the unit's
#     ExecStart= names the daemon the package ships; no RPATH.
# (c) `rpm --root` installs it into a copy of the rootfs test-systemd.sh
#     uses (runtime libraries, no ravnest): %pre creates the user as on an
#     image build; then that rootfs boots, its systemd runs the %post
#     scriptlet (preset) and the service as an operator enables it; the
#     %preun scriptlet stops and disables it, `rpm -e` removes the files.
#     This part is skipped, loudly, when that rootfs is not cached and
#     cannot be built.
#
# Each check prints one PASS or FAIL line; the exit status is 1 if any
# failed, 77 (skip) when rpmbuild is missing or this is not root.
#
# Environment:
#   RAVNEST_SOURCE_ROOT   the project (default: this script's ../..)
#   RAVNEST_RPM_DIR       where the built package is kept
#                         (default /var/tmp/ravnest-rpm-<hash>)
#   RAVNEST_DEBIAN_MIRROR, RAVNEST_ROOTFS_CACHE_DIR, RAVNEST_KEEP: see lib.sh
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@" # also when run as "sh test-rpm.sh"
set -u

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/system/lib.sh
. "$here/lib.sh"
root=${RAVNEST_SOURCE_ROOT:-$(cd "$here/../.." && pwd)}
# shellcheck source=packaging/export-tree.sh
. "$root/packaging/export-tree.sh"
pkg_dir=${RAVNEST_RPM_DIR:-/var/tmp/ravnest-rpm-$(printf '%s' "$root" | sha256sum | cut -c1-12)}

# ---- preconditions -----------------------------------------------------------
[ "$(id -u)" -eq 0 ] || skip "needs root (rpm --root, systemd-nspawn)"
for tool in rpmbuild rpm rpm2archive; do
        command -v "$tool" >/dev/null || skip "$tool is missing (apt-get install rpm)"
done

# ---- (a) the package ---------------------------------------------------------
t=$(date +%s)
hash=$(tree_hash "$root")
if [ -f "$pkg_dir/tree-hash" ] && [ "$(cat "$pkg_dir/tree-hash")" = "$hash" ] &&
   ls "$pkg_dir"/ravnest-[0-9]*.rpm >/dev/null 2>&1; then
        pass "build: reusing $pkg_dir, built from the same files (tree $hash)"
else
        rm -rf --one-file-system "$pkg_dir"
        mkdir -p "$pkg_dir"
        if ! "$root/packaging/build-rpm.sh" "$pkg_dir" >"$pkg_dir/build-rpm.out" 2>&1 ||
           ! ls "$pkg_dir"/ravnest-[0-9]*.rpm >/dev/null 2>&1; then
                tail -n 30 "$pkg_dir/build-rpm.out"
                fail "build: packaging/build-rpm.sh ($(($(date +%s) - t))s)"
                summary
                exit 1
        fi
        echo "$hash" >"$pkg_dir/tree-hash"
        pass "build: packaging/build-rpm.sh ($(($(date +%s) - t))s, tree $hash)"
fi
rpmfile=$(ls "$pkg_dir"/ravnest-[0-9]*.rpm | head -n 1)
log "$(basename "$rpmfile"): $(stat -c %s "$rpmfile") bytes"
q() { rpm -qp "$@" "$rpmfile" 2>/dev/null; }

# ---- (b) rpm -qp ---------------------------------------------------------------
sbindir=$(rpm --eval '%{_sbindir}')
list=$(q --list)
missing=
for f in "$sbindir/ravnestd" /usr/bin/ravnestctl /usr/lib/systemd/system/ravnestd.service \
         /usr/lib/sysusers.d/ravnest.conf /usr/lib/systemd/catalog/ravnest.catalog \
         /etc/ravnest /etc/ravnest/ravnestd.conf \
         /usr/share/dbus-1/system.d/org.ravnest.Node1.conf /usr/share/dbus-1/interfaces/org.ravnest.Node1.xml \
         /usr/share/ravnest/jobs/fashion-mnist-mlp.job /usr/share/ravnest/jobs/fashion-mnist-mlp-deep.job \
         /usr/share/ravnest/jobs/fashion-mnist-cnn.job /usr/share/ravnest/jobs/fortunes-gpt.job \
         /usr/share/man/man8/ravnestd.8 /usr/share/man/man5/ravnestd.conf.5 /usr/share/man/man1/ravnestctl.1 \
         /usr/share/man/man5/ravnest-job.5 /usr/share/man/man7/ravnest-protocol.7; do
        printf '%s\n' "$list" | grep -q -x -e "$f" -e "$f.gz" -e "$f.xz" -e "$f.bz2" || missing="$missing $f"
done
if [ -z "$missing" ]; then pass "rpm -qp --list: daemon, CLI, unit, sysusers, catalog, D-Bus policy and interface, config, jobs, 5 man pages ($(printf '%s\n' "$list" | grep -c .) paths)"
else fail "rpm -qp --list: missing$missing" "$list"; fi
stray=$(printf '%s\n' "$list" | grep -v -E '^/(etc/ravnest|usr/(s?bin|lib/(systemd|sysusers\.d|\.build-id)|share/(dbus-1|ravnest|man|doc|licenses)))(/|$)')
if [ -z "$stray" ]; then pass "rpm -qp --list: nothing outside the expected directories"
else fail "rpm -qp --list: unexpected paths" "$stray"; fi

scripts=$(q --scripts)
printf '%s\n' "$scripts" | sed 's/^/      /'
# body TAG: one scriptlet (PREIN, POSTIN, PREUN, POSTUN).
body() { q --qf "%{$1}"; }
ok=1 why=
for tag in PREIN POSTIN PREUN POSTUN; do
        b=$(body $tag)
        if [ -z "$b" ] || [ "$b" = "(none)" ]; then ok=0 why="$why $tag:missing"
        elif ! printf '%s\n' "$b" | sh -n 2>/dev/null; then ok=0 why="$why $tag:syntax"; fi
done
# What systemd-rpm-macros' versions and the spec's fallbacks have in
# common: the unit named in %post, %preun and %postun.
body PREIN | grep -q -e 'systemd-sysusers' -e 'useradd' || { ok=0; why="$why PREIN:no-user"; }
body PREIN | grep -q 'ravnest' || { ok=0; why="$why PREIN:no-ravnest"; }
for tag in POSTIN PREUN POSTUN; do body $tag | grep -q 'ravnestd\.service' || { ok=0; why="$why $tag:no-unit"; }; done
body PREUN | grep -q -e 'disable --now' -e 'remove-system-units' || { ok=0; why="$why PREUN:no-disable"; }
body POSTUN | grep -q -e 'try-restart' -e 'mark-restart-system-units' || { ok=0; why="$why POSTUN:no-restart"; }
if [ "$ok" = 1 ]; then pass "rpm -qp --scripts: %pre makes the user, %post/%preun/%postun_with_restart name ravnestd.service; sh -n clean"
else fail "rpm -qp --scripts:$why"; fi

requires=$(q --requires)
missing=
for r in 'libopenblas.so.0()(64bit)' 'liburing.so.2()(64bit)' 'libconfig.so.9()(64bit)' 'libsodium.so.23()(64bit)' \
         'libcrypto.so.3()(64bit)' 'libsystemd.so.0()(64bit)' 'libz.so.1()(64bit)' 'libmicrohttpd.so.12()(64bit)' \
         /usr/bin/kill dbus-common; do
        printf '%s\n' "$requires" | grep -q -x -F -- "$r" || missing="$missing $r"
done
if [ -z "$missing" ]; then
        pass "rpm -qp --requires: the automatic library requirements (openblas, uring, config, sodium, crypto, systemd, z, microhttpd), kill, dbus-common"
        printf '%s\n' "$requires" | grep -v -e '^rpmlib(' -e 'GLIBC_' -e '^/bin/sh$' | sed 's/^/      /'
else
        fail "rpm -qp --requires: missing$missing" "$requires"
fi
recommends=$(q --recommends)
if printf '%s\n' "$recommends" | grep -q -x dbus; then pass "rpm -qp --recommends: dbus"
else fail "rpm -qp --recommends: dbus" "$recommends"; fi

version=$(q --qf '%{VERSION}-%{RELEASE}')
provides=$(q --provides)
if printf '%s\n' "$provides" | grep -q -x -F "ravnest = $version" &&
   printf '%s\n' "$provides" | grep -q -x -E "ravnest\([a-z0-9_-]+\) = $version"; then
        pass "rpm -qp --provides: $(printf '%s\n' "$provides" | tr '\n' ' ')"
else
        fail "rpm -qp --provides: ravnest = $version and ravnest(<arch>)" "$provides"
fi

configfiles=$(q --configfiles)
flags=$(q --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' | awk '$2 == "/etc/ravnest/ravnestd.conf" { print $1 }')
if [ "$configfiles" = /etc/ravnest/ravnestd.conf ] && [[ $flags == *c* && $flags == *n* ]]; then
        pass "rpm -qp --configfiles: /etc/ravnest/ravnestd.conf, %config(noreplace) (flags $flags)"
else
        fail "rpm -qp --configfiles: only /etc/ravnest/ravnestd.conf, with %config(noreplace)" \
                "configfiles: $configfiles" "flags: $flags"
fi

scratch_new ravnest-rpm-test
mkdir -p "$scratch/payload"
rpm2archive -n - <"$rpmfile" 2>"$scratch/payload.log" | tar -C "$scratch/payload" -xf - 2>>"$scratch/payload.log"
exec_start=$(sed -n 's/^ExecStart=//p' "$scratch/payload/usr/lib/systemd/system/ravnestd.service" 2>/dev/null)
if [ "$exec_start" = "$sbindir/ravnestd" ] && [ -x "$scratch/payload$exec_start" ]; then
        pass "the unit's ExecStart=$exec_start is the daemon the package ships"
else
        fail "the unit's ExecStart= ($exec_start) is $sbindir/ravnestd, shipped" "$(cat "$scratch/payload.log")"
fi
rpath=$(readelf -d "$scratch/payload$sbindir/ravnestd" "$scratch/payload/usr/bin/ravnestctl" 2>&1 | grep -E 'RPATH|RUNPATH')
if [ -z "$rpath" ]; then pass "no RPATH or RUNPATH in ravnestd and ravnestctl"
else fail "RPATH/RUNPATH in the binaries" "$rpath"; fi

# ---- (c) installed by rpm into a Debian 12 rootfs, run by its systemd --------
cache=$(rootfs_cache_path "$RUNTIME_RECIPE" "$RUNTIME_PACKAGES")
if why=$(rootfs_unavailable "$cache"); then
        printf '\nSKIPPED (c), the install under systemd: %s\n' "$why"
        summary
        exit
fi
for tool in systemd-nspawn unshare nsenter; do
        command -v "$tool" >/dev/null || { printf '\nSKIPPED (c): %s is missing (apt-get install systemd-container util-linux)\n' "$tool"; summary; exit; }
done
rootfs_ensure "$cache" "$RUNTIME_PACKAGES"
rootfs=$scratch/rootfs
rootfs_copy "$cache" "$rootfs"
# rpm --root: its database in the rootfs, scriptlets in a chroot of it.
# Without /run/systemd/system there, %post and %preun leave systemd alone,
# as in an image build. --nodeps: the rootfs's libraries are Debian's
# packages, which this rpm database does not know.
rpm_root() { rpm --root "$rootfs" --dbpath /var/lib/rpm "$@"; }
t=$(date +%s)
if rpm_root --initdb && out=$(rpm_root -i --nodeps "$rpmfile" 2>&1); then
        pass "rpm --root ROOTFS -i ($(($(date +%s) - t))s)"
        # (Debian's rpm adds a word for alien.)
        printf '%s\n' "$out" | grep -v -e 'use Alien' -e 'know what you are doing' | sed '/^$/d;s/^/      /'
else
        fail "rpm --root ROOTFS -i" "$out"
        summary
        exit 1
fi
if out=$(rpm_root -V --nodeps ravnest 2>&1) && [ -z "$out" ]; then pass "rpm -V --nodeps ravnest: every file as packaged"
else fail "rpm -V ravnest" "$out"; fi
if home=$(chroot "$rootfs" getent passwd ravnest) && [ "$(echo "$home" | cut -d: -f6)" = /var/lib/ravnest ]; then
        pass "%pre made the user ravnest: $home"
else
        fail "%pre made the user ravnest with home /var/lib/ravnest" "$home"
fi

container_boot "$rootfs" --private-network
prop() { ct systemctl show -P "$1" ravnestd.service; }
# scriptlet TAG ARG: run the package's scriptlet in the booted container,
# as rpm would there ($1 = 1 on install, 0 on the last removal).
scriptlet() { body "$1" | ct sh -s -- "$2"; }

check "%post (\$1=1) under systemd" scriptlet POSTIN 1
preset=$(ct systemctl is-enabled ravnestd.service 2>&1)
log "after %post: is-enabled $preset (systemctl preset: Debian's policy enables, Fedora's disables)"
check "systemctl enable --now ravnestd" ct systemctl enable --now ravnestd.service
if wait_for 30 sh -c "[ \"\$(nsenter -t $leader -a systemctl show -P ActiveState ravnestd.service)\" = active ]"; then
        pass "ravnestd active (PID $(prop MainPID))"
else
        fail "ravnestd active: $(prop ActiveState)/$(prop Result)" \
                "$(ct journalctl -q -u ravnestd.service -n 8 --no-hostname -o cat 2>&1)"
fi
out=$(ct busctl get-property org.ravnest.Node1 /org/ravnest/Node1 org.ravnest.Node1 State 2>&1)
if [ "$out" = 's "unconfigured"' ]; then pass "busctl ... State: $out (the user existed when the bus read the policy)"
else fail "busctl get-property org.ravnest.Node1 /org/ravnest/Node1 org.ravnest.Node1 State" "got: $out"; fi
if out=$(ct timeout 10 ravnestctl status 2>&1) && printf '%s' "$out" | grep -q 'State: unconfigured'; then
        pass "ravnestctl status: State unconfigured"
else
        fail "ravnestctl status (State: unconfigured)" "$out"
fi

check "%preun (\$1=0) under systemd" scriptlet PREUN 0
state=$(prop ActiveState) enabled=$(ct systemctl is-enabled ravnestd.service 2>&1)
if [ "$state" = inactive ] && [ "$enabled" = disabled ]; then pass "%preun stopped and disabled ravnestd"
else fail "%preun: ActiveState=$state, is-enabled $enabled (want inactive, disabled)"; fi
t=$(date +%s)
if out=$(rpm_root -e --noscripts ravnest 2>&1); then pass "rpm --root ROOTFS -e ($(($(date +%s) - t))s; its scriptlets run in the container)"
else fail "rpm --root ROOTFS -e" "$out"; fi
check "%postun (\$1=0) under systemd" scriptlet POSTUN 0
left=
for f in "$sbindir/ravnestd" /usr/bin/ravnestctl /usr/lib/systemd/system/ravnestd.service /etc/ravnest/ravnestd.conf /usr/share/ravnest; do
        ct test -e "$f" && left="$left $f"
done
load=$(prop LoadState)
if [ -z "$left" ] && [ "$load" = not-found ]; then pass "after rpm -e: files gone, systemd knows no ravnestd.service"
else fail "after rpm -e: left:${left:- nothing}, LoadState=$load"; fi

container_poweroff
summary
