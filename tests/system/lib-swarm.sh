# shellcheck shell=bash
# lib-swarm.sh — a swarm of ravnestd processes in network namespaces, for
# the tests that need real networks between its nodes (test-nat.sh,
# test-faults.sh). Sourced after lib.sh:
#
#   swarm_layout 2 2                  # names=(c1s1 c1s2 c2s1 c2s2), ports
#   ns_of[c1s1]=NS; addr_of[c1s1]=10.0.0.1  # "" for a node behind NAT
#   listen_of[c1s1]=10.0.0.1          # the host it listens on
#   swarm_write DIR 'relay = "...";' 'round_timeout = 30000;' 'checkpoint = { ... };'
#   swarm_start DIR EPOCHS            # every node; pids in pid_of
#   swarm_finish DIR                  # exits, last rounds, accuracy, one model
#
# The job is the MLP on Fashion-MNIST ($JOB), cut in the middle with two
# stages; BAR is the accuracy each cluster must reach.

declare -a names
declare -A port_of ns_of addr_of listen_of key_of pid_of
nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# stop_all SIGNAL PID...: signal each process, then wait for each.
stop_all() {
        local sig=$1 p
        shift
        for p in "$@"; do kill -"$sig" "$p" 2>/dev/null; done
        for p in "$@"; do wait "$p" 2>/dev/null; done
}

# remove_scratch DIR NAMESPACE...: the namespaces deleted, DIR removed (or
# kept with RAVNEST_KEEP=1).
remove_scratch() {
        local d=$1 ns
        shift
        for ns in "$@"; do ip netns del "$ns" 2>/dev/null; done
        if [ "${RAVNEST_KEEP:-0}" = 1 ]; then log "kept $d"; else rm -rf "$d"; fi
}

# swarm_layout CLUSTERS STAGES: the nodes' names and ports (pipeline
# 7101.., averaging 7201..).
swarm_layout() {
        local c s i=1
        names=()
        n_clusters=$1 n_stages=$2
        for ((c = 1; c <= $1; c++)); do
                for ((s = 1; s <= $2; s++)); do
                        names+=("c${c}s$s")
                        port_of[c${c}s$s]=$((7100 + i))
                        i=$((i + 1))
                done
        done
}

# entry NAME OFFSET: the node as a plan names it: "<key>@ADDR:PORT", or
# "<key>" alone behind NAT.
_entry() {
        if [ -n "${addr_of[$1]}" ]; then
                printf '"%s@%s:%u"' "${key_of[$1]}" "${addr_of[$1]}" $((${port_of[$1]} + $2))
        else
                printf '"%s"' "${key_of[$1]}"
        fi
}

_plan() {
        local c s sep
        for ((c = 1; c <= n_clusters; c++)); do
                printf '    { nodes = ['
                sep=" "
                for ((s = 1; s <= n_stages; s++)); do printf '%s%s' "$sep" "$(_entry "c${c}s$s" 0)"; sep=", "; done
                if [ "$n_stages" = 2 ]; then printf ' ]; stages = [ 0, 3, 6 ]; }'; else printf ' ]; stages = [ 0, 6 ]; }'; fi
                [ "$c" -lt "$n_clusters" ] && printf ','
                printf '\n'
        done
}

_members() {
        local n sep=""
        for n in "${names[@]}"; do printf '%s%s' "$sep" "$(_entry "$n" 100)"; sep=", "; done
}

# swarm_keys DIR: a network secret in DIR/secret, and every node's state
# directory DIR/NAME with its identity (its public key in key_of).
swarm_keys() {
        local d=$1 n
        mkdir -p "$d"
        head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$d/secret"
        echo >>"$d/secret"
        chmod 600 "$d/secret"
        for n in "${names[@]}"; do
                mkdir -p "$d/$n"
                key_of[$n]=$("$RAVNESTCTL" identity "$d/$n" 2>/dev/null) || return 1
        done
}

# _node_head DIR NAME: the settings every test node has: its state, one
# thread, its control socket, no idle gating.
_node_head() {
        printf 'state_directory = "%s/%s";\nthreads = 1;\ncontrol_socket = "%s/%s.sock";\nidle = { enabled = false; };\n' \
                "$1" "$2" "$1" "$2"
}

# swarm_write DIR NETWORK AVERAGING EXTRA: swarm_keys, and each node's
# configuration: NETWORK goes into its network group, AVERAGING into its
# averaging group, EXTRA at the end.
swarm_write() {
        local d=$1 network=$2 averaging=$3 extra=$4 n
        swarm_keys "$d" || return 1
        for n in "${names[@]}"; do
                cat >"$d/$n.conf" <<EOF
$(_node_head "$d" "$n")
network = { secret_file = "$d/secret"; $network };
pipeline = {
  micro_batch = 32; staleness = 4; update_frequency = 4;
  listen = "${listen_of[$n]}:${port_of[$n]}";
  clusters = (
$(_plan)
  );
};
averaging = {
  interval = 0.25;
  listen = "${listen_of[$n]}:$((${port_of[$n]} + 100))";
  members = [ $(_members) ];
  $averaging
};
$extra
EOF
        done
}

# swarm_write_members DIR COORDINATOR MEMORY: swarm_keys, and each node's
# configuration under membership: co coordinates only, at COORDINATOR
# (host:port), the others join it and train, each listening at
# listen_of:port_of (averaging 100 above) and offering MEMORY (less than a
# replica makes 2 clusters x 2 stages of four members).
swarm_write_members() {
        local d=$1 n
        swarm_keys "$d" || return 1
        for n in "${names[@]}"; do
                cat >"$d/$n.conf" <<EOF
$(_node_head "$d" "$n")
network = { secret_file = "$d/secret"; };
pipeline = { micro_batch = 32; staleness = 4; update_frequency = 4; listen = "${listen_of[$n]}:${port_of[$n]}"; };
averaging = { interval = 0.25; listen = "${listen_of[$n]}:$((${port_of[$n]} + 100))"; round_timeout = 10000; };
membership = {
  coordinator = "${key_of[co]}@$2";
  coordinate = $([ "$n" = co ] && echo true || echo false);
  train = $([ "$n" = co ] && echo false || echo true);
  probe = 0.1; min_nodes = 4; settle = 1.0; heartbeat = 0.5; deadline = 4.0;
  memory = "$3";
};
EOF
        done
}

# swarm_stop_members PREFIX NAME...: stop each node (SIGTERM: members of
# a swarm with membership stay until stopped); each exits 0, each that
# scores reaches BAR, all with the same accuracy (one averaged model).
# PREFIX starts every check's name.
swarm_stop_members() {
        local prefix=$1 n status a first="" same=1
        shift
        for n in "$@"; do
                kill -TERM "${pid_of[$n]}"
                wait "${pid_of[$n]}"
                status=$?
                if [ "$status" -eq 0 ]; then pass "$prefix$n exits 0"
                else fail "$prefix$n exits 0" "exit $status" "$(tail -n 5 "$d/$n.log")"; fi
                a=$(swarm_accuracy "$d/$n.log")
                [ -n "$a" ] || continue # a stage before the last scores nothing
                log "$prefix$n test accuracy $a% (bar $BAR%)"
                check "$prefix$n reaches $BAR%" awk -v a="$a" -v bar="$BAR" 'BEGIN { exit !(a >= bar) }'
                [ -z "$first" ] && first=$a
                [ "$a" = "$first" ] || same=0
        done
        check "${prefix}one averaged model" test "$same" = 1
        pids=()
}

# swarm_start_node DIR NAME EPOCHS: one node in its namespace, in place (its
# pid is its own); pid in pid_of[NAME]; its log appended to DIR/NAME.log.
swarm_start_node() {
        ip netns exec "${ns_of[$2]}" "$RAVNESTD" --config "$1/$2.conf" --job "$JOB" --epochs "$3" --progress 0 \
                >>"$1/$2.log" 2>&1 &
        pid_of[$2]=$!
        pids+=($!)
}

# swarm_start DIR EPOCHS: every node, last stages first.
swarm_start() {
        local i
        for ((i = ${#names[@]} - 1; i >= 0; i--)); do swarm_start_node "$1" "${names[i]}" "$2"; done
}

# swarm_sample DIR FIELD SECONDS FILE APPEND: while the nodes run, every
# SECONDS each node's FIELD of /proc/PID/status (kB) into DIR/NAME.FILE,
# in place of the last (APPEND 0) or after it (1). In the background;
# stops when they have all exited.
swarm_sample() {
        local d=$1 field=$2 every=$3 file=$4 append=$5 n kb alive
        while :; do
                alive=0
                for n in "${names[@]}"; do
                        kb=$(sed -n "s/^$field:\\s*\\([0-9]*\\).*/\\1/p" "/proc/${pid_of[$n]}/status" 2>/dev/null)
                        [ -n "$kb" ] || continue
                        alive=1
                        if [ "$append" = 1 ]; then echo "$kb" >>"$d/$n.$file"; else echo "$kb" >"$d/$n.$file"; fi
                done
                [ "$alive" = 1 ] || return 0
                sleep "$every"
        done
}

# swarm_peak_rss DIR: every node's peak RSS (kB) in DIR/NAME.rss, looked
# at every half second.
swarm_peak_rss() {
        swarm_sample "$1" VmHWM 0.5 rss 0
}

swarm_accuracy() {
        sed -n 's/.*Finished [^:]*: test accuracy \([0-9.]*\)%.*/\1/p' "$1" | tail -n 1
}

# swarm_finish DIR: every node exits 0 and its last averaging round had
# every member; every cluster reaches BAR, all with the same accuracy (one
# averaged model).
swarm_finish() {
        local d=$1 n status c first="" same=1 a
        for n in "${names[@]}"; do
                wait "${pid_of[$n]}"
                status=$?
                if [ "$status" -eq 0 ]; then pass "$n exits 0"; else fail "$n exits 0" "exit $status" "$(tail -n 5 "$d/$n.log")"; fi
        done
        pids=()
        for n in "${names[@]}"; do
                if grep -q "The last averaging round included all" "$d/$n.log"; then
                        pass "$n: the last averaging round had every member"
                else fail "$n: the last averaging round had every member" "$(grep -i "last averaging round\|Gave up\|error" "$d/$n.log" | tail -n 3)"; fi
        done
        for ((c = 1; c <= n_clusters; c++)); do
                a=$(swarm_accuracy "$d/c${c}s$n_stages.log")
                log "cluster $c: test accuracy ${a:-none}% (bar $BAR%)"
                check "cluster $c reaches $BAR%" awk -v a="${a:-0}" -v bar="$BAR" 'BEGIN { exit !(a >= bar) }'
                [ -z "$first" ] && first=${a:-x}
                [ "${a:-y}" = "$first" ] || same=0
        done
        check "one averaged model: every cluster the same" test "$same" = 1
}
