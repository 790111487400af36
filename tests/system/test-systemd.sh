#!/bin/bash
# test-systemd.sh — ravnestd under a real systemd, in a booted container.
#
# Builds ravnest with prefix /usr, installs it into a copy of a Debian
# minbase rootfs, boots that with systemd-nspawn and checks the service as
# an operator meets it: start (Type=notify), D-Bus, ravnestctl, idle CPU,
# pause/resume/checkpoint with their journal MESSAGE_IDs, reload with a
# broken configuration, exit 78 without a restart loop, the watchdog, and
# the sandbox's exposure score. Each check prints one PASS or FAIL line;
# the exit status is 1 if any failed, 77 (skip) when this machine cannot
# run it.
#
# Needs root, systemd-nspawn, and for the first run debootstrap and the
# Debian mirror: the rootfs is built once and cached in
# /var/tmp/ravnest-rootfs-<hash of its recipe>; each run boots a copy.
# The rootfs, the container and the PASS/FAIL lines come from lib.sh.
#
# Environment:
#   RAVNEST_SOURCE_ROOT       the project (default: this script's ../..)
#   RAVNEST_SYSTEM_BUILD_DIR  meson build directory of the installed copy
#                             (default /var/tmp/ravnest-system-build-<hash>)
#   RAVNEST_DEBIAN_MIRROR     (default http://deb.debian.org/debian)
#   RAVNEST_ROOTFS_CACHE_DIR  where cached rootfs live (default /var/tmp)
#   RAVNEST_KEEP=1            keep the scratch copy (its path is printed)
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@" # also when run as "sh test-systemd.sh"
set -u

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/system/lib.sh
. "$here/lib.sh"
root=${RAVNEST_SOURCE_ROOT:-$(cd "$here/../.." && pwd)}
# The rootfs: lib.sh's RUNTIME_PACKAGES (systemd, D-Bus, procps and
# ravnestd's libraries).
cache=$(rootfs_cache_path "$RUNTIME_RECIPE" "$RUNTIME_PACKAGES")
build_dir=${RAVNEST_SYSTEM_BUILD_DIR:-/var/tmp/ravnest-system-build-$(printf '%s' "$root" | sha256sum | cut -c1-12)}

# The MESSAGE_IDs of units/ravnest.catalog that the checks look for.
MID_PAUSED=558d8868fd8d40158bc66e62d0dc3bb8
MID_RESUMED=49ec8719fe634489b24ae51fae7ced69
MID_CHECKPOINT=dab0480494d14e2f85ea77a43409cbde
MID_RELOAD=b80ee951f6f846a8bc577d85567f853b
ALL_MIDS="4cdad09663cd42368ebe52c8a27a4f9d 7991b5d1b7a544c4a2aa6ec1c12a7d7d caa7e18a0a8d40e0af00cf4d111607e6
d306c49439dc43a5af5ca1ec5d141dda $MID_CHECKPOINT $MID_PAUSED $MID_RESUMED $MID_RELOAD"

# ---- preconditions -----------------------------------------------------------
require_root systemd-nspawn unshare nsenter meson ninja

# ---- (a) the rootfs, built once ---------------------------------------------
rootfs_ensure "$cache" "$RUNTIME_PACKAGES"
scratch_new ravnest-systemd-test
rootfs=$scratch/rootfs
rootfs_copy "$cache" "$rootfs"

# ---- (b) build and install ---------------------------------------------------
t=$(date +%s)
if [ ! -f "$build_dir/build.ninja" ]; then
        wipe=; [ -d "$build_dir/meson-private" ] && wipe=--wipe # a setup that failed
        meson setup $wipe "$build_dir" "$root" --prefix=/usr --sysconfdir=/etc --buildtype=release \
                -Dtests=disabled -Dbenchmarks=false -Dfuzz=false >"$scratch/meson-setup.log" 2>&1 ||
                { tail -n 20 "$scratch/meson-setup.log"; fail "meson setup (prefix /usr)"; exit 1; }
fi
if meson compile -C "$build_dir" >"$scratch/build.log" 2>&1 &&
   DESTDIR="$rootfs" meson install -C "$build_dir" --no-rebuild --quiet >>"$scratch/build.log" 2>&1; then
        pass "build and DESTDIR install ($(($(date +%s) - t))s)"
else
        tail -n 30 "$scratch/build.log"
        fail "build and DESTDIR install"
        exit 1
fi
for f in usr/sbin/ravnestd usr/bin/ravnestctl usr/lib/systemd/system/ravnestd.service \
         usr/lib/sysusers.d/ravnest.conf usr/lib/systemd/catalog/ravnest.catalog; do
        [ -e "$rootfs/$f" ] || fail "installed /$f"
done

# ---- (c, d) boot ------------------------------------------------------------
nspawn_args=(# its own network namespace: only its loopback, no port clashes
             --private-network)
if [ -d /usr/share/datasets ]; then
        nspawn_args+=(--bind-ro=/usr/share/datasets)
else
        log "no /usr/share/datasets: training checks will fail (apt-get install dataset-fashion-mnist)"
fi
container_boot "$rootfs" "${nspawn_args[@]}"

# ---- helpers for the service ------------------------------------------------
prop() { ct systemctl show -P "$1" ravnestd.service; }
is_active() { [ "$(prop ActiveState)" = active ]; }
# start_service NAME: start without blocking on Type=notify (a daemon that
# never sends READY would hold systemctl for TimeoutStartSec), then wait for
# active or a failed start.
start_service() {
        ct systemctl reset-failed ravnestd.service 2>/dev/null
        ct systemctl start --no-block ravnestd.service
        local begin=$(date +%s) deadline=$(($(date +%s) + 45)) s
        while :; do
                s=$(prop ActiveState)
                case $s in
                active) pass "$1: active (READY=1 received)"; return 0 ;;
                failed) break ;;
                # not yet picked up, or already ended
                inactive) [ $(($(date +%s) - begin)) -ge 3 ] && break ;;
                esac
                [ "$(date +%s)" -ge "$deadline" ] && break
                sleep 0.5
        done
        fail "$1: ActiveState=$s SubState=$(prop SubState) Result=$(prop Result) after $(( $(date +%s) - deadline + 45 ))s" \
                "$(ct journalctl -q -u ravnestd.service -n 8 --no-hostname -o short-monotonic 2>&1)"
        ct systemctl stop --no-block ravnestd.service
        wait_for 20 sh -c "[ \"\$(nsenter -t $leader -a systemctl show -P ActiveState ravnestd.service)\" != deactivating ]"
        return 1
}
# journal_count MESSAGE_ID: how many entries of ravnestd carry it.
journal_count() {
        ct journalctl -q --no-pager -o cat _SYSTEMD_UNIT=ravnestd.service MESSAGE_ID="$1" 2>/dev/null | grep -c .
}
# journal_grep PATTERN MATCH...: how many entries that match carry a
# message with PATTERN (no --after-cursor: with matches, the journalctl of
# systemd 252 skips the first entry after a cursor that does not match).
journal_grep() {
        local pattern=$1
        shift
        ct journalctl -q --no-pager -o cat "$@" 2>/dev/null | grep -ci -- "$pattern"
}
# expect_message NAME MESSAGE_ID BEFORE: a new entry with it within 20 s.
expect_message() {
        if wait_for 20 sh -c "[ \"\$(nsenter -t $leader -a journalctl -q -o cat _SYSTEMD_UNIT=ravnestd.service MESSAGE_ID=$2 | grep -c .)\" -gt $3 ]"; then
                pass "$1: journal has MESSAGE_ID=$2 ($(ct journalctl -q -o cat _SYSTEMD_UNIT=ravnestd.service MESSAGE_ID="$2" -n 1))"
        else
                fail "$1: no journal entry with MESSAGE_ID=$2 within 20 s"
        fi
}
write_config() { ct_write /etc/ravnest/ravnestd.conf 0644; }

# ---- setup: user, units, catalog --------------------------------------------
check "systemd-sysusers creates ravnest" ct systemd-sysusers
if home=$(ct getent passwd ravnest) && [ "$(echo "$home" | cut -d: -f6)" = /var/lib/ravnest ]; then
        pass "user ravnest: $home"
else
        fail "user ravnest with home /var/lib/ravnest" "$home"
fi
check "systemctl daemon-reload" ct systemctl daemon-reload
# --man=no: the rootfs has no man(1) to look up Documentation= with.
if out=$(ct systemd-analyze verify --man=no ravnestd.service 2>&1) && [ -z "$out" ]; then
        pass "systemd-analyze verify ravnestd.service: clean"
else
        fail "systemd-analyze verify ravnestd.service" "$out"
fi
if out=$(ct journalctl --update-catalog 2>&1) && [ -z "$out" ]; then
        missing=
        listed=$(ct journalctl --list-catalog 2>&1)
        for id in $ALL_MIDS; do echo "$listed" | grep -q "^$id " || missing="$missing $id"; done
        if [ -z "$missing" ]; then pass "catalog: journalctl --update-catalog parses all 8 entries"
        else fail "catalog: missing after --update-catalog:$missing"; fi
else
        fail "catalog: journalctl --update-catalog" "$out"
fi

# ---- (e) unconfigured -------------------------------------------------------
write_config <<'EOF'
# No network, no job: the node waits to be configured.
state_directory = "/var/lib/ravnest";
EOF
check "systemctl enable ravnestd" ct systemctl enable ravnestd.service
if start_service "start, unconfigured"; then
        pid=$(prop MainPID)
        check "StateDirectory /var/lib/ravnest is ravnest's, 0700" \
                sh -c "[ \"\$(nsenter -t $leader -a stat -c '%U %a' /var/lib/ravnest)\" = 'ravnest 700' ]"
        # ps shows no nice value for SCHED_IDLE: fields 19 (nice) and 41
        # (policy, 5 is SCHED_IDLE) of /proc/PID/stat, after the comm.
        user=$(ct ps -o user= -p "$pid" 2>&1)
        read -r -a stat <<<"$(ct cat "/proc/$pid/stat" 2>&1 | sed 's/.*) //')"
        io=$(ct ionice -p "$pid" 2>&1)
        if [ "$user" = ravnest ] && [ "${stat[16]:-}" = 19 ] && [ "${stat[38]:-}" = 5 ] && [ "$io" = idle ]; then
                pass "runs as ravnest, nice 19, SCHED_IDLE, I/O class idle"
        else
                fail "runs as ravnest, nice 19, SCHED_IDLE, I/O class idle" \
                        "user $user, nice ${stat[16]:-?}, policy ${stat[38]:-?}, ionice: $io"
        fi
        if out=$(ct busctl get-property org.ravnest.Node1 /org/ravnest/Node1 org.ravnest.Node1 State 2>&1); then
                pass "busctl get-property ... State: $out"
                if [ "$out" = 's "unconfigured"' ]; then pass "State is \"unconfigured\""
                else fail "State is \"unconfigured\"" "got: $out"; fi
        else
                fail "busctl get-property org.ravnest.Node1 /org/ravnest/Node1 org.ravnest.Node1 State" "$out" \
                        "$(ct journalctl -q -o cat -u ravnestd.service --grep=org.ravnest.Node1 -n 1 2>&1)"
                fail "State is \"unconfigured\"" "no answer"
        fi
        if out=$(ct timeout 10 ravnestctl status 2>&1); then
                pass "ravnestctl status"; printf '%s\n' "$out" | sed 's/^/      /'
        else
                fail "ravnestctl status" "$out"
        fi
        if out=$(ct timeout 10 ravnestctl status --json 2>&1) &&
           printf '%s' "$out" | /usr/bin/python3 -c 'import json, sys; json.load(sys.stdin)' 2>/dev/null; then
                pass "ravnestctl status --json (valid JSON): $out"
        else
                fail "ravnestctl status --json" "$out"
        fi
        # CPUUsageNSec; where the cgroup has no CPU accounting, the main
        # process's utime + stime (fields 14 and 15 of /proc/PID/stat, ticks).
        cpu_ns() {
                local v s
                v=$(prop CPUUsageNSec)
                if [[ $v =~ ^[0-9]+$ ]]; then echo "$v"; return; fi
                read -r -a s <<<"$(ct cat "/proc/$pid/stat" | sed 's/.*) //')"
                echo $(((s[11] + s[12]) * 1000000000 / $(getconf CLK_TCK)))
        }
        how=CPUUsageNSec; [[ $(prop CPUUsageNSec) =~ ^[0-9]+$ ]] || how="/proc/$pid/stat (no CPUUsageNSec)"
        c1=$(cpu_ns); sleep 5; c2=$(cpu_ns)
        if [[ $c1 =~ ^[0-9]+$ && $c2 =~ ^[0-9]+$ ]] && [ $((c2 - c1)) -lt 50000000 ]; then
                pass "idle while unconfigured: $(((c2 - c1) / 1000)) µs of CPU in 5 s ($how)"
        else
                fail "idle while unconfigured: $how $c1 -> $c2 ns in 5 s (limit 50 ms)"
        fi
        ct systemctl stop ravnestd.service
else
        for n in "busctl State" "ravnestctl status" "ravnestctl status --json" "idle while unconfigured"; do
                fail "$n: the service is not active"
        done
fi

# ---- (e) training -----------------------------------------------------------
# A small MLP: an epoch in a few seconds, many of them so it still trains
# when pause, resume and checkpoint come. /etc, not /var/tmp: the service
# has PrivateTmp=.
ct_write /etc/ravnest/systemd-test.job 0644 <<'EOF'
name = "systemd-test-mlp";
dataset = { name = "fashion-mnist"; classes = 10; mean = 0.2860; std = 0.3530; };
model = {
  input = [1, 28, 28];
  layers = ( { type = "flatten"; }, { type = "linear"; out = 64; }, { type = "relu"; },
             { type = "linear"; out = 10; } );
};
optimizer = { type = "sgd"; lr = 0.05; momentum = 0.9; };
training = { batch_size = 64; epochs = 1000; seed = 1; };
EOF
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' | ct_write /etc/ravnest/secret 0400
ct chown ravnest:ravnest /etc/ravnest/secret
TRAIN_CONFIG='# Written by tests/system/test-systemd.sh: trains a small job, listens on
# the container'"'"'s loopback.
state_directory = "/var/lib/ravnest";
job = "/etc/ravnest/systemd-test.job";
threads = 0;
network = {
  listen = "127.0.0.1:7000";
  admission = "secret";
  secret_file = "/etc/ravnest/secret";
};
# Train whatever else the machine does: the checks must not wait for it
# to be idle.
idle = { enabled = false; };
metrics = { listen = "127.0.0.1:9464"; };'
printf '%s\n' "$TRAIN_CONFIG" | write_config
check "ravnestd --check-config accepts the training configuration" \
        ct runuser -u ravnest -- ravnestd --check-config
if start_service "start, training"; then
        sleep 2
        log "State: $(ct busctl get-property org.ravnest.Node1 /org/ravnest/Node1 org.ravnest.Node1 State 2>&1)"
        for verb in pause resume checkpoint; do
                case $verb in
                pause) mid=$MID_PAUSED ;; resume) mid=$MID_RESUMED ;; checkpoint) mid=$MID_CHECKPOINT ;;
                esac
                before=$(journal_count "$mid")
                if out=$(ct timeout 20 ravnestctl "$verb" 2>&1); then
                        pass "ravnestctl $verb (as root)"
                        expect_message "ravnestctl $verb" "$mid" "$before"
                else
                        fail "ravnestctl $verb (as root)" "$out"
                        fail "ravnestctl $verb: journal MESSAGE_ID=$mid" "the command failed"
                fi
        done
        # The same without a bus, on the daemon's own socket: under
        # PrivateUsers= the caller must still be seen as root.
        for verb in pause resume; do
                case $verb in pause) mid=$MID_PAUSED ;; resume) mid=$MID_RESUMED ;; esac
                before=$(journal_count "$mid")
                if out=$(ct env RAVNEST_SOCKET=/run/ravnest/control timeout 20 ravnestctl $verb 2>&1); then
                        pass "ravnestctl $verb on /run/ravnest/control (no bus, as root)"
                        expect_message "ravnestctl $verb on /run/ravnest/control" "$mid" "$before"
                else
                        fail "ravnestctl $verb on /run/ravnest/control (no bus, as root)" "$out"
                fi
        done
        path=$(ct journalctl -q -o verbose _SYSTEMD_UNIT=ravnestd.service MESSAGE_ID=$MID_CHECKPOINT -n 1 2>/dev/null |
               sed -n 's/^ *PATH=//p' | head -n 1)
        if [ -n "$path" ] && ct test -s "$path"; then pass "the checkpoint $path exists"
        else fail "the checkpoint named by PATH= exists" "PATH='$path'"; fi
        if is_active; then pass "still active after pause/resume/checkpoint"
        else fail "still active after pause/resume/checkpoint: $(prop ActiveState)/$(prop Result)"; fi
        # the metrics endpoint under the unit's sandbox (bash's /dev/tcp: no curl in the root)
        http_get() {
                ct bash -c 'exec 3<>/dev/tcp/127.0.0.1/9464 && printf "GET %s HTTP/1.0\r\n\r\n" "$1" >&3 &&
                        cat <&3' _ "$1" 2>/dev/null
        }
        scraped() { http_get /metrics | grep -q '^ravnest_steps_total [1-9]'; }
        check "metrics: /metrics serves Prometheus' text format with the steps trained" wait_for 30 scraped
        check "metrics: / serves the status page with its plot" eval 'http_get / | grep -q "<svg"'

        # Reload: a good configuration, then a broken one, which must be
        # reported and leave the daemon running with the old one.
        pid=$(prop MainPID)
        unit=_SYSTEMD_UNIT=ravnestd.service
        ok_before=$(journal_grep . $unit MESSAGE_ID=$MID_RELOAD RESULT=ok)
        check "systemctl reload (same configuration)" ct timeout 30 systemctl reload ravnestd.service
        if wait_for 20 sh -c "[ \"\$(nsenter -t $leader -a journalctl -q -o cat $unit MESSAGE_ID=$MID_RELOAD RESULT=ok | grep -c .)\" -gt $ok_before ]"; then
                pass "reload: journal has MESSAGE_ID=$MID_RELOAD with RESULT=ok"
        else
                fail "reload: no MESSAGE_ID=$MID_RELOAD with RESULT=ok within 20 s"
        fi
        failed_before=$(journal_grep . $unit MESSAGE_ID=$MID_RELOAD RESULT=failed)
        keep_before=$(journal_grep keep $unit)
        printf '%s\n' "${TRAIN_CONFIG/threads = 0;/threads = \"many\";}" | write_config
        ct timeout 30 systemctl reload ravnestd.service
        # SCHED_IDLE on a busy machine: give it time to get to the signal.
        if wait_for 20 sh -c "[ \"\$(nsenter -t $leader -a journalctl -q -o cat $unit MESSAGE_ID=$MID_RELOAD RESULT=failed | grep -c .)\" -gt $failed_before ]"; then
                pass "reload with a broken configuration: MESSAGE_ID=$MID_RELOAD RESULT=failed"
        else
                fail "reload with a broken configuration: no MESSAGE_ID=$MID_RELOAD with RESULT=failed within 20 s"
        fi
        sleep 1
        if is_active && [ "$(prop MainPID)" = "$pid" ]; then
                pass "reload with a broken configuration: still active, same PID $pid"
        else
                fail "reload with a broken configuration: $(prop ActiveState), MainPID $pid -> $(prop MainPID)"
        fi
        if [ "$(journal_grep keep $unit)" -gt "$keep_before" ]; then
                pass "reload with a broken configuration: logged \"$(ct journalctl -q -o cat $unit | grep -i keep | tail -n 1)\""
        else
                fail "reload with a broken configuration: no message that it keeps the running configuration" \
                        "$(ct journalctl -q -o cat $unit -n 4 2>&1)"
        fi
        printf '%s\n' "$TRAIN_CONFIG" | write_config
        ct systemctl stop ravnestd.service
fi

# ---- (e) a configuration error at start: 78, no restart loop ----------------
printf '%s\nno_such_setting = 1;\n' "$TRAIN_CONFIG" | write_config
ct systemctl reset-failed ravnestd.service 2>/dev/null
ct systemctl start --no-block ravnestd.service
wait_for 20 sh -c "[ \"\$(nsenter -t $leader -a systemctl show -P ActiveState ravnestd.service)\" = failed ]"
sleep 7 # past RestartSec=5s: a restart would have come
status=$(prop ExecMainStatus) restarts=$(prop NRestarts) state=$(prop ActiveState)
if [ "$status" = 78 ] && [ "$restarts" = 0 ] && [ "$state" = failed ]; then
        pass "unknown setting: ExecMainStatus=78, NRestarts=0, failed without restarting"
else
        fail "unknown setting: ExecMainStatus=$status NRestarts=$restarts ActiveState=$state (want 78, 0, failed)" \
                "$(ct journalctl -q -u ravnestd.service -n 4 --no-hostname -o cat 2>&1)"
fi
ct systemctl stop ravnestd.service
ct systemctl reset-failed ravnestd.service 2>/dev/null
printf '%s\n' "$TRAIN_CONFIG" | write_config

# ---- (e) the watchdog -------------------------------------------------------
ct mkdir -p /etc/systemd/system/ravnestd.service.d
ct_write /etc/systemd/system/ravnestd.service.d/50-watchdog-test.conf 0644 <<'EOF'
# tests/system/test-systemd.sh: SIGUSR2 hangs the control loop.
[Service]
Environment=RAVNESTD_DEBUG_HANG=1
WatchdogSec=3s
EOF
ct systemctl daemon-reload
if start_service "start with WatchdogSec=3s"; then
        pid=$(prop MainPID) restarts=$(prop NRestarts)
        killed_before=$(journal_grep "result 'watchdog'" -u ravnestd.service)
        sleep 5 # pets the watchdog while it is well
        if is_active && [ "$(prop MainPID)" = "$pid" ]; then pass "watchdog: alive past 3 s, so it pets the watchdog"
        else fail "watchdog: did not survive 5 s with WatchdogSec=3s ($(prop Result))"; fi
        ct systemctl kill --kill-who=main -s SIGUSR2 ravnestd.service
        if wait_for 25 sh -c "[ \"\$(nsenter -t $leader -a journalctl -q -o cat -u ravnestd.service | grep -c \"result 'watchdog'\")\" -gt $killed_before ]"; then
                pass "watchdog: systemd killed the hung daemon (result 'watchdog')"
        else
                fail "watchdog: no \"Failed with result 'watchdog'\" within 25 s of SIGUSR2" \
                        "$(ct journalctl -q -o cat -u ravnestd.service -n 5 2>&1)"
        fi
        if wait_for 20 sh -c "[ \"\$(nsenter -t $leader -a systemctl show -P NRestarts ravnestd.service)\" -gt $restarts ] &&
                              [ \"\$(nsenter -t $leader -a systemctl show -P ActiveState ravnestd.service)\" = active ]"; then
                pass "watchdog: restarted to active (NRestarts $restarts -> $(prop NRestarts), PID $pid -> $(prop MainPID))"
        else
                fail "watchdog: not restarted to active (NRestarts $restarts -> $(prop NRestarts), $(prop ActiveState))"
        fi
fi
ct systemctl stop ravnestd.service
ct rm -f /etc/systemd/system/ravnestd.service.d/50-watchdog-test.conf
ct systemctl daemon-reload

# ---- the sandbox ------------------------------------------------------------
if out=$(ct systemd-analyze security --no-pager ravnestd.service 2>&1); then
        score=$(echo "$out" | grep -i 'overall exposure')
        pass "systemd-analyze security: ${score#→ }"
        echo "$out" | grep '✗' | sed 's/^/      /'
else
        fail "systemd-analyze security ravnestd.service" "$(echo "$out" | tail -n 3)"
fi

# ---- the end ----------------------------------------------------------------
container_poweroff
summary
