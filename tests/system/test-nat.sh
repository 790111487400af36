#!/bin/bash
# test-nat.sh — a swarm where half the nodes sit behind a real NAT.
#
# Three network namespaces: "pub" (the internet side: 10.77.1.1), "home"
# (a home network: 10.77.2.1) and "rt", the home's router between them,
# which masquerades the home's connections (iptables MASQUERADE) and lets
# nothing in that the home did not open (FORWARD: only ESTABLISHED,RELATED
# inbound). Two clusters of two stages: c1s1 and c2s2 in pub, c1s2 and c2s1
# behind the router, named in the plan by their key alone. Checked:
#   - the NAT is real: a listener at home cannot be reached from pub, a
#     listener in pub can be from home;
#   - the home nodes say they accept no connections and dial every link;
#     pub's nodes see their links come from the router's address;
#   - every node ends cleanly, both clusters above the accuracy bar and as
#     one averaged model (the last averaging round had every member).
# Needs root, ip and iptables; skips (77) without them or without the data.
#
#   RAVNESTD=... RAVNESTCTL=... tests/system/test-nat.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

RAVNESTD=${RAVNESTD:-$here/../../build/daemon/ravnestd}
RAVNESTCTL=${RAVNESTCTL:-$here/../../build/daemon/ravnestctl}
JOB=${RAVNEST_NAT_JOB:-$here/../../config/jobs/fashion-mnist-mlp.job}
DATA=/usr/share/datasets/fashion-mnist
BAR=80 # percent, one epoch of the MLP (a single node reaches about 85)

[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, iptables)"
for tool in ip iptables python3; do
        command -v "$tool" >/dev/null || skip "$tool is missing (apt-get install iproute2 iptables python3)"
done
[ -r "$DATA/train-images-idx3-ubyte.gz" ] || skip "$DATA is missing (apt-get install dataset-fashion-mnist)"

tag=$$
pub=rvn-pub-$tag home=rvn-home-$tag rt=rvn-rt-$tag
dir=$(mktemp -d /var/tmp/ravnest-nat-test.XXXXXX)
pids=()

cleanup() {
        local p
        for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
        for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
        ip netns del "$pub" 2>/dev/null
        ip netns del "$home" 2>/dev/null
        ip netns del "$rt" 2>/dev/null
        if [ "${RAVNEST_KEEP:-0}" = 1 ]; then log "kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the networks ---------------------------------------------------------------
nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

setup_networks() {
        ip netns add "$pub" && ip netns add "$home" && ip netns add "$rt" || return 1
        ip link add "p$tag" netns "$pub" type veth peer name "ro$tag" netns "$rt" || return 1
        ip link add "h$tag" netns "$home" type veth peer name "ri$tag" netns "$rt" || return 1
        nsx "$pub" ip addr add 10.77.1.1/24 dev "p$tag"
        nsx "$rt" ip addr add 10.77.1.254/24 dev "ro$tag"
        nsx "$rt" ip addr add 10.77.2.254/24 dev "ri$tag"
        nsx "$home" ip addr add 10.77.2.1/24 dev "h$tag"
        local ns
        for ns in "$pub" "$home" "$rt"; do nsx "$ns" ip link set lo up; done
        nsx "$pub" ip link set "p$tag" up
        nsx "$home" ip link set "h$tag" up
        nsx "$rt" ip link set "ro$tag" up
        nsx "$rt" ip link set "ri$tag" up
        # pub knows the way to the home network: only the router's rules keep it out
        nsx "$pub" ip route add 10.77.2.0/24 via 10.77.1.254
        nsx "$home" ip route add default via 10.77.2.254
        nsx "$rt" sysctl -qw net.ipv4.ip_forward=1
        nsx "$rt" iptables -t nat -A POSTROUTING -o "ro$tag" -j MASQUERADE &&
                nsx "$rt" iptables -P FORWARD DROP &&
                nsx "$rt" iptables -A FORWARD -i "ri$tag" -o "ro$tag" -j ACCEPT &&
                nsx "$rt" iptables -A FORWARD -i "ro$tag" -o "ri$tag" -m state --state ESTABLISHED,RELATED -j ACCEPT
}

# connect NS HOST PORT: a TCP connection from NS opens within 3 s.
connect() {
        nsx "$1" timeout 3 python3 -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)' \
                "$2" "$3" 2>/dev/null
}

# listen NS HOST PORT: a listener in NS, in the background; its pid in $!.
listen() {
        nsx "$1" python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); time.sleep(30)' "$2" "$3" &
}

check_nat_is_real() {
        local lp
        listen "$home" 10.77.2.1 9999; lp=$!
        sleep 0.5
        if connect "$pub" 10.77.2.1 9999; then fail "pub cannot reach a listener at home"; else pass "pub cannot reach a listener at home"; fi
        kill "$lp" 2>/dev/null; wait "$lp" 2>/dev/null
        listen "$pub" 10.77.1.1 9998; lp=$!
        sleep 0.5
        check "home reaches a listener in pub" connect "$home" 10.77.1.1 9998
        kill "$lp" 2>/dev/null; wait "$lp" 2>/dev/null
}

# ---- the swarm ------------------------------------------------------------------
names=(c1s1 c1s2 c2s1 c2s2)
declare -A ns_of=([c1s1]=$pub [c1s2]=$home [c2s1]=$home [c2s2]=$pub)
declare -A port_of=([c1s1]=7101 [c1s2]=7102 [c2s1]=7103 [c2s2]=7104)
declare -A key_of

# entry NAME OFFSET: the node as a plan names it: "<key>@10.77.1.1:PORT" in
# pub, "<key>" alone behind the NAT.
entry() {
        if [ "${ns_of[$1]}" = "$pub" ]; then
                printf '"%s@10.77.1.1:%u"' "${key_of[$1]}" $((${port_of[$1]} + $2))
        else
                printf '"%s"' "${key_of[$1]}"
        fi
}

write_configs() {
        local n host
        head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
        echo >>"$dir/secret"
        chmod 600 "$dir/secret"
        for n in "${names[@]}"; do
                mkdir -p "$dir/$n"
                key_of[$n]=$("$RAVNESTCTL" identity "$dir/$n") || return 1
        done
        for n in "${names[@]}"; do
                host=10.77.1.1
                [ "${ns_of[$n]}" = "$home" ] && host=10.77.2.1
                cat >"$dir/$n.conf" <<EOF
state_directory = "$dir/$n";
threads = 1;
control_socket = "$dir/$n.sock";
idle = { enabled = false; };
network = { secret_file = "$dir/secret"; };
pipeline = {
  micro_batch = 32; staleness = 4; update_frequency = 4;
  listen = "$host:${port_of[$n]}";
  clusters = (
    { nodes = [ $(entry c1s1 0), $(entry c1s2 0) ]; stages = [ 0, 3, 6 ]; },
    { nodes = [ $(entry c2s1 0), $(entry c2s2 0) ]; stages = [ 0, 3, 6 ]; }
  );
};
averaging = {
  interval = 0.25;
  listen = "$host:$((${port_of[$n]} + 100))";
  members = [ $(entry c1s1 100), $(entry c1s2 100), $(entry c2s1 100), $(entry c2s2 100) ];
};
EOF
        done
}

start_nodes() {
        local n
        for n in c2s2 c1s2 c2s1 c1s1; do
                nsx "${ns_of[$n]}" "$RAVNESTD" --config "$dir/$n.conf" --job "$JOB" --epochs 1 --progress 0 \
                        >"$dir/$n.log" 2>&1 &
                pids+=($!)
                eval "pid_$n=$!"
        done
}

# links_from_router: pub's nodes hold established links whose far end is
# the router's address (the home nodes, masqueraded).
links_from_router() {
        nsx "$pub" ss -tnH state established | grep -q ' 10\.77\.1\.254:'
}

accuracy() {
        sed -n 's/.*Finished [^:]*: test accuracy \([0-9.]*\)%.*/\1/p' "$dir/$1.log" | head -n 1
}

log "namespaces $pub, $home, $rt; files in $dir"
setup_networks || { fail "network namespaces and NAT set up"; summary; exit 1; }
check_nat_is_real
write_configs || { fail "keys and configurations written"; summary; exit 1; }
start_nodes
if wait_for 120 links_from_router; then pass "pub's nodes hold links from the router's address"
else fail "pub's nodes hold links from the router's address" "$(nsx "$pub" ss -tn)"; fi

for n in "${names[@]}"; do
        eval "p=\$pid_$n"
        # shellcheck disable=SC2154
        wait "$p"
        status=$?
        if [ "$status" -eq 0 ]; then pass "$n exits 0"; else fail "$n exits 0" "exit $status" "$(tail -n 5 "$dir/$n.log")"; fi
done
pids=()
for n in c1s2 c2s1; do
        check "$n (behind NAT) dials its links" grep -q "accepts no connections" "$dir/$n.log"
done
for n in "${names[@]}"; do
        check "$n: the last averaging round had every member" grep -q "The last averaging round included all" "$dir/$n.log"
done
a1=$(accuracy c1s2) a2=$(accuracy c2s2)
log "test accuracy: cluster 1 ${a1:-none}%, cluster 2 ${a2:-none}% (bar $BAR%)"
check "both clusters reach $BAR%" awk -v a="${a1:-0}" -v b="${a2:-0}" -v bar="$BAR" 'BEGIN { exit !(a >= bar && b >= bar) }'
check "one averaged model: both clusters the same" test "${a1:-x}" = "${a2:-y}"
summary
