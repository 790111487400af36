#!/bin/bash
# tests/container/test-container.sh — the OCI image, run the way users run it.
#
#   tests/container/test-container.sh [--reuse-image] [--keep]
#
# Builds the image with containers/build-image.sh (nothing to do when the
# image is up to date with the sources; --reuse-image takes whatever image
# exists), then starts containers from it with podman and prints one PASS or
# FAIL line per check, with the time of each part:
#
#   a. unconfigured  the sample configuration: "ravnestctl status" in the
#                    container (podman exec) says State "unconfigured", the
#                    HEALTHCHECK passes, SIGTERM stops it cleanly
#   b. seccomp       under podman's default profile the daemon falls back to
#                    epoll and says so; with containers/seccomp-io_uring.json
#                    it runs io_uring (its log, and IoBackend in
#                    "ravnestctl status --json")
#   c. swarm         two containers, each in a network namespace of its own
#                    joined by a veth pair, average a model while each trains
#                    its half of the data for one epoch: both reach
#                    "training", averaging rounds complete, both finish
#   d. stop          "podman stop" (SIGTERM) of a training container: the
#                    log says "Checkpoint written" and "stopped cleanly", it
#                    exits 0, the checkpoint is in the state volume, and a
#                    restart resumes from it
#   e. archive       the OCI archive exists and "skopeo inspect" shows the
#                    labels; the docker-archive carries the HEALTHCHECK
#
# Exit status: 0 when every check passed, 1 when one failed, 77 (skipped)
# when not root or a tool is missing. All container state lives under
# $RAVNEST_OCI_DIR (default /var/tmp/ravnest-oci, see containers/oci-env.sh);
# the containers, volumes and network namespaces of a run are removed at the
# end (--keep leaves the containers and volumes for a look).
#
# Time on 2 cores: about 30 s with the image up to date; 1.5 to 3 minutes
# more when the sources changed (recompiling in the build stage); about 10
# minutes the first time (debootstrap, then apt-get in both stages).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
reuse=0
keep=0
for a in "$@"; do
        case $a in
        --reuse-image) reuse=1 ;;
        --keep) keep=1 ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "test-container.sh: unknown argument $a" >&2; exit 64 ;;
        esac
done

skip() {
        echo "test-container.sh: SKIP (exit 77): $*" >&2
        exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root: podman with the vfs store, runc, network namespaces"
for t in podman runc skopeo ip; do
        command -v "$t" >/dev/null || skip "$t is missing (apt-get install podman runc skopeo iproute2)"
done

. "$root/containers/oci-env.sh"

version=$(sed -n "s/^ *version: *'\([^']*\)'.*/\1/p" "$root/meson.build" | head -n1)
image=localhost/ravnest:$version
archive=$RAVNEST_OCI_DIR/ravnest-$version.oci.tar
docker_archive=$RAVNEST_OCI_DIR/ravnest-$version.docker.tar
profile=$root/containers/seccomp-io_uring.json
p=rvt$$                       # prefix of everything this run creates
work=$(mktemp -d "$RAVNEST_OCI_DIR/test.XXXXXX")
containers=()
volumes=()
netns=()
passed=0
failed=0
t_start=$SECONDS

cleanup() {
        if [ "$keep" = 1 ]; then
                echo "test-container.sh: --keep: containers ${containers[*]:-} and volumes ${volumes[*]:-} kept" \
                     "(. containers/oci-env.sh; podman ps -a)"
        else
                for c in "${containers[@]}"; do podman rm -f -v -t 5 "$c" >/dev/null 2>&1; done
                for v in "${volumes[@]}"; do podman volume rm -f "$v" >/dev/null 2>&1; done
        fi
        for n in "${netns[@]}"; do ip netns del "$n" 2>/dev/null; done
        rm -rf "$work"
        ravnest_oci_tidy
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() {
        echo "PASS: $*"
        passed=$((passed + 1))
}
fail() {
        echo "FAIL: $*"
        failed=$((failed + 1))
}
# check DESCRIPTION COMMAND...: PASS when the command succeeds.
check() {
        local what=$1
        shift
        if "$@"; then pass "$what"; else fail "$what"; fi
}
# show_log CONTAINER: its last lines, after a failure
show_log() {
        echo "---- last lines of the log of $1"
        podman logs "$1" 2>&1 | tail -n 25 | sed 's/^/    /'
        echo "----"
}
# (grep reads to the end: with -q it would stop early, podman logs would get
# SIGPIPE, and pipefail would turn a match into a failure)
log_has() {
        podman logs "$1" 2>&1 | grep -- "$2" >/dev/null
}
# wait_for SECONDS COMMAND...: until the command succeeds
wait_for() {
        local end=$((SECONDS + $1))
        shift
        until "$@" >/dev/null 2>&1; do
                [ $SECONDS -lt $end ] || return 1
                sleep 1
        done
}
# json_field JSON NAME: a string or number value of "ravnestctl status --json"
json_field() {
        sed -n "s/.*\"$2\": \"\{0,1\}\([^\",}]*\)\"\{0,1\}[,}].*/\1/p" <<<"$1"
}
status_json() {
        podman exec "$1" ravnestctl status --json 2>/dev/null
}
state_is() {
        [ "$(json_field "$(status_json "$1")" State)" = "$2" ]
}
section() {
        failed0=$failed
        echo
        echo "== $* (at $((SECONDS - t_start)) s)"
}
# run NAME [podman run options] -- [ravnestd arguments]
run() {
        local name=$1 opts=()
        shift
        while [ $# -gt 0 ] && [ "$1" != -- ]; do
                opts+=("$1")
                shift
        done
        [ $# -gt 0 ] && shift
        containers+=("$name")
        podman run -d --name "$name" "${opts[@]}" "$image" "$@" >/dev/null
}
new_volume() {
        volumes+=("$1")
        podman volume create "$1" >/dev/null
}
# write_secret DIR: a network secret only the container's user can read
write_secret() {
        od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$1/secret"
        echo >> "$1/secret"
        chown "$uid:$uid" "$1/secret"
        chmod 600 "$1/secret"
}

# ---- the image -----------------------------------------------------------------
section "image"
t=$SECONDS
if [ "$reuse" = 1 ] && podman image exists "$image" && [ -s "$archive" ]; then
        echo "reusing $image (--reuse-image)"
else
        "$root/containers/build-image.sh"
        r=$?
        [ $r = 77 ] && skip "containers/build-image.sh skipped"
        [ $r = 0 ] || { echo "FAIL: containers/build-image.sh exited $r"; exit 1; }
fi
echo "image: $((SECONDS - t)) s; $image is $(( $(podman image inspect --format '{{.Size}}' "$image") / 1000000 )) MB"
uid=$(podman run --rm --network none --entrypoint /usr/bin/id "$image" -u)
[ -n "$uid" ] && [ "$uid" != 0 ] && pass "the image runs as a user of its own (uid $uid)" ||
        fail "the image runs as a user of its own (uid ${uid:-?})"

# ---- a. unconfigured -----------------------------------------------------------
section "a. the sample configuration: unconfigured and healthy"
t=$SECONDS
run "$p-a" --network none
if wait_for 30 podman exec "$p-a" ravnestctl status; then
        out=$(podman exec "$p-a" ravnestctl status)
        echo "$out" | sed 's/^/    /'
        check "podman exec ravnestctl status: State unconfigured (exit 0)" grep -q "State: unconfigured" <<<"$out"
else
        fail "podman exec ravnestctl status: no answer within 30 s"
        show_log "$p-a"
fi
check "the log says why: no network configured" log_has "$p-a" 'State "unconfigured"'
check "podman healthcheck run (the image's HEALTHCHECK): healthy" podman healthcheck run "$p-a"
health=$(podman inspect --format '{{.State.Health.Status}}' "$p-a" 2>/dev/null)
check "podman inspect: health status \"$health\"" [ "$health" = healthy ]
podman stop -t 20 "$p-a" >/dev/null
check "SIGTERM: exit status 0 and \"stopped cleanly\"" \
        eval '[ "$(podman inspect --format "{{.State.ExitCode}}" "$p-a")" = 0 ] && log_has "$p-a" "stopped cleanly"'
echo "a: $((SECONDS - t)) s"

# ---- b. seccomp: epoll under the default profile, io_uring with ours -------------
section "b. seccomp: the default profile (epoll fallback) and containers/seccomp-io_uring.json"
t=$SECONDS
for n in b1 b2; do
        mkdir -p "$work/$n"
        write_secret "$work/$n"
        cat > "$work/$n/ravnestd.conf" <<EOF
# test-container.sh ($n): trains alone, listening on the container's loopback
threads = 1;
idle = { enabled = false; };
network = { listen = "127.0.0.1:7000"; secret_file = "/etc/ravnest/secret"; };
metrics = { listen = "0.0.0.0:9464"; };   # the image's EXPOSEd port
EOF
        new_volume "$p-$n"
done
run "$p-b1" --network none -v "$work/b1:/etc/ravnest:ro" -v "$p-b1:/var/lib/ravnest" -- --progress 5000
run "$p-b2" --network none -v "$work/b2:/etc/ravnest:ro" -v "$p-b2:/var/lib/ravnest" \
        --security-opt "seccomp=$profile" -- --progress 5000
wait_for 60 log_has "$p-b1" "Transport: " && wait_for 60 log_has "$p-b2" "Transport: "
podman logs "$p-b1" 2>&1 | grep -m2 -e "io_uring is not available" -e "Transport:" | sed 's/^/    b1: /'
podman logs "$p-b2" 2>&1 | grep -m2 -e "io_uring" -e "Transport:" | sed 's/^/    b2: /'
check "default profile: the log says io_uring is not available and names containers/" \
        log_has "$p-b1" "io_uring is not available.*using the epoll backend.*containers/"
check "default profile: \"Transport: epoll backend\"" log_has "$p-b1" "Transport: epoll backend"
check "seccomp-io_uring.json: \"Transport: io_uring backend\", no fallback" \
        eval 'log_has "$p-b2" "Transport: io_uring backend" && ! log_has "$p-b2" "io_uring is not available"'
# IoBackend is reported once training polls the transport
backend() { [ "$(json_field "$(status_json "$1")" IoBackend)" = "$2" ]; }
check "default profile: ravnestctl status --json: IoBackend \"epoll\"" wait_for 60 backend "$p-b1" epoll
check "seccomp-io_uring.json: ravnestctl status --json: IoBackend \"io_uring\"" wait_for 60 backend "$p-b2" io_uring
status_json "$p-b2" | sed 's/^/    b2: /'
# the metrics endpoint, from inside the container (bash's /dev/tcp: no curl in the image)
http_get() {
        podman exec "$1" bash -c 'exec 3<>/dev/tcp/127.0.0.1/9464 && printf "GET %s HTTP/1.0\r\n\r\n" "$1" >&3 &&
                cat <&3' _ "$2" 2>/dev/null
}
scraped() { http_get "$1" /metrics | grep -q '^ravnest_steps_total [1-9]'; }
check "the image EXPOSEs the metrics port 9464" eval 'podman image inspect --format "{{.Config.ExposedPorts}}" "$image" | grep -q 9464'
check "metrics: /metrics serves Prometheus' text format with the steps trained" wait_for 60 scraped "$p-b2"
check "metrics: / serves the status page with its plot" eval 'http_get "$p-b2" / | grep -q "<svg"'
[ $failed = $failed0 ] || { show_log "$p-b1"; show_log "$p-b2"; }
podman stop -t 30 "$p-b1" >/dev/null
echo "b: $((SECONDS - t)) s"

# ---- d. SIGTERM of a training container: a checkpoint, then a resume -------------
section "d. podman stop of a training container ($p-b2)"
t=$SECONDS
training() { state_is "$1" training && [ "$(json_field "$(status_json "$1")" Step)" -gt 0 ]; }
check "the container trains (State training, Step > 0)" wait_for 120 training "$p-b2"
t_stop=$SECONDS
podman stop -t 60 "$p-b2" >/dev/null
echo "podman stop took $((SECONDS - t_stop)) s"
podman logs "$p-b2" 2>&1 | grep -e "Checkpoint written" -e "stopped cleanly" | sed 's/^/    /'
check "the log says \"Checkpoint written\"" log_has "$p-b2" "Checkpoint written: /var/lib/ravnest/"
check "the log says \"Received Terminated, stopped cleanly\"" log_has "$p-b2" "Received Terminated, stopped cleanly"
check "exit status 0" [ "$(podman inspect --format '{{.State.ExitCode}}' "$p-b2")" = 0 ]
vol=$(podman volume inspect --format '{{.Mountpoint}}' "$p-b2")
ls -l "$vol" | sed 's/^/    volume: /'
check "the checkpoint is in the state volume" eval 'compgen -G "$vol/*.ckpt" >/dev/null'
podman start "$p-b2" >/dev/null
check "a restart resumes from it" wait_for 60 log_has "$p-b2" "Resuming from /var/lib/ravnest/.*\.ckpt"
podman stop -t 60 "$p-b2" >/dev/null
[ $failed = $failed0 ] || show_log "$p-b2"
echo "d: $((SECONDS - t)) s"

# ---- c. two containers in network namespaces train together ----------------------
section "c. a swarm of two containers in network namespaces, averaging"
t=$SECONDS
net_ok=1
for i in 1 2; do
        ip netns add "$p-$i" 2>/dev/null && netns+=("$p-$i") || net_ok=0
done
if [ $net_ok = 1 ] &&
   ip link add "${p}a" type veth peer name "${p}b" &&
   ip link set "${p}a" netns "$p-1" && ip link set "${p}b" netns "$p-2" &&
   ip -n "$p-1" addr add 10.213.7.1/24 dev "${p}a" && ip -n "$p-2" addr add 10.213.7.2/24 dev "${p}b" &&
   ip -n "$p-1" link set "${p}a" up && ip -n "$p-2" link set "${p}b" up &&
   ip -n "$p-1" link set lo up && ip -n "$p-2" link set lo up; then
        :
else
        net_ok=0
fi
if [ $net_ok = 0 ]; then
        echo "SKIP: c. the swarm: cannot make network namespaces and a veth pair here (ip netns, ip link)"
else
        echo "network namespaces $p-1 (10.213.7.1) and $p-2 (10.213.7.2), joined by a veth pair"
        keys=()
        for i in 1 2; do
                new_volume "$p-c$i"
                keys[$i]=$(podman run --rm --network none -v "$p-c$i:/var/lib/ravnest" \
                        --entrypoint /usr/bin/ravnestctl "$image" identity /var/lib/ravnest 2>/dev/null)
                echo "node $i: key ${keys[$i]}"
        done
        mkdir -p "$work/c1" "$work/c2"
        write_secret "$work/c1"
        cp -p "$work/c1/secret" "$work/c2/secret"
        for i in 1 2; do
                cat > "$work/c$i/ravnestd.conf" <<EOF
# test-container.sh: member $i of an averaging group of two
threads = 1;
idle = { enabled = false; };       # the containers share a busy machine
checkpoint = { interval = 0; };    # only on stop
network = { secret_file = "/etc/ravnest/secret"; };
averaging = {
  interval = 1.0;
  listen = "10.213.7.$i:7001";
  members = [ "${keys[1]}@10.213.7.1:7001", "${keys[2]}@10.213.7.2:7001" ];
};
EOF
        done
        # one member under the default profile (epoll), the other with io_uring
        run "$p-c1" --network "ns:/run/netns/$p-1" -v "$work/c1:/etc/ravnest:ro" -v "$p-c1:/var/lib/ravnest" \
                -- --epochs 1 --progress 5000
        run "$p-c2" --network "ns:/run/netns/$p-2" -v "$work/c2:/etc/ravnest:ro" -v "$p-c2:/var/lib/ravnest" \
                --security-opt "seccomp=$profile" -- --epochs 1 --progress 5000
        seen1=0 seen2=0
        end=$((SECONDS + 300))
        while [ $SECONDS -lt $end ]; do
                state_is "$p-c1" training && seen1=1
                state_is "$p-c2" training && seen2=1
                log_has "$p-c1" "Finished" && log_has "$p-c2" "Finished" && break
                podman container exists "$p-c1" && [ "$(podman inspect --format '{{.State.Running}}' "$p-c1")" = true ] &&
                        [ "$(podman inspect --format '{{.State.Running}}' "$p-c2")" = true ] || break
                sleep 1
        done
        for i in 1 2; do
                podman logs "$p-c$i" 2>&1 | grep -e "Averaging with" -e "Averaging round" -e "Finished" -e "Transport:" |
                        sed -n '1,3p;$p' | sed "s/^/    c$i: /"
        done
        check "both containers reached State \"training\"" [ $seen1$seen2 = 11 ]
        check "node 1 (epoll): averaging rounds done with both members" log_has "$p-c1" "Averaging round [0-9]* done: 2 of 2 members"
        check "node 2 (io_uring): averaging rounds done with both members" log_has "$p-c2" "Averaging round [0-9]* done: 2 of 2 members"
        check "both finished the epoch (\"Finished ... test accuracy\")" \
                eval 'log_has "$p-c1" "Finished .*test accuracy" && log_has "$p-c2" "Finished .*test accuracy"'
        check "after training: State \"finished\", still healthy" \
                eval 'wait_for 30 state_is "$p-c1" finished && podman healthcheck run "$p-c2" >/dev/null'
        [ $failed = $failed0 ] || { show_log "$p-c1"; show_log "$p-c2"; }
        podman stop -t 30 "$p-c1" "$p-c2" >/dev/null
        check "both stopped cleanly" eval 'log_has "$p-c1" "stopped cleanly" && log_has "$p-c2" "stopped cleanly"'
fi
echo "c: $((SECONDS - t)) s"

# ---- e. the archives ----------------------------------------------------------
section "e. the OCI archive"
t=$SECONDS
check "$archive exists" [ -s "$archive" ]
if [ -s "$archive" ]; then
        info=$(skopeo inspect "oci-archive:$archive")
        grep -e '"org.opencontainers' <<<"$info" | sed 's/^ */    /'
        for l in title description version licenses; do
                check "skopeo inspect: label org.opencontainers.image.$l" \
                        grep -q "\"org.opencontainers.image.$l\": \"." <<<"$info"
        done
        check "skopeo inspect: version label $version" grep -q "\"org.opencontainers.image.version\": \"$version\"" <<<"$info"
        config=$(skopeo inspect --config "oci-archive:$archive")
        check "the OCI config: user ravnest, STOPSIGNAL SIGTERM, VOLUME /var/lib/ravnest, ENTRYPOINT ravnestd" \
                eval 'grep -q "\"User\": \"ravnest\"" <<<"$config" && grep -q "\"StopSignal\": \"SIGTERM\"" <<<"$config" &&
                      grep -q "\"/var/lib/ravnest\"" <<<"$config" && grep -q "/usr/sbin/ravnestd" <<<"$config"'
fi
check "the docker-archive carries the HEALTHCHECK (ravnestctl status)" \
        eval 'skopeo inspect --raw --config "docker-archive:$docker_archive" | tr -d "\n " | grep "\"Healthcheck\":{\"Test\":\[\"CMD\",\"/usr/bin/ravnestctl\",\"status\"\]" >/dev/null'
echo "e: $((SECONDS - t)) s"

echo
echo "test-container.sh: $passed passed, $failed failed in $((SECONDS - t_start)) s"
[ $failed = 0 ]
