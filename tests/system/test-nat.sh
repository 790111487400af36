#!/bin/bash
# test-nat.sh — swarms whose nodes sit behind real NATs.
#
# Network namespaces: "pub" (the internet side: 10.77.1.1), two home
# networks "home" (10.77.2.1) and "home2" (10.77.3.1), and each home's
# router ("rt", "rt2") between it and pub, which masquerades the home's
# connections (iptables MASQUERADE) and lets nothing in that the home did
# not open (FORWARD: only ESTABLISHED,RELATED inbound). The NATs are shown
# to be real first: a listener at home cannot be reached from pub nor from
# the other home, one in pub can be. Then two swarms of 2 clusters x 2
# stages, nodes behind NAT named in the plan by their key alone:
#   1. c1s2 and c2s1 at home: they dial every link, and pub's nodes see
#      their links come from the router's address;
#   2. c1s1 and c2s1 at home, c1s2 at home2, c2s2 in pub, and a relay in
#      pub (a ravnestd with a relay group and the swarm's network secret,
#      training nothing): the link between the two stages of cluster 1 and
#      the ring of the first stages have both ends behind NAT and go through
#      the relay, which sees both routers and checks that each link's
#      handshake proves the secret.
#   3. membership: a coordinator and three members in pub, and a fourth
#      member at home that gives its address and ports as if it took
#      connections: the coordinator dials every member back, cannot reach
#      that one, and plans it as a node behind NAT.
# Each ends with every node exiting cleanly and both clusters above the
# accuracy bar as one averaged model (the last round had every member);
# the relay's peak RSS is printed.
# Needs root, ip and iptables; skips (77) without them or without the data.
#
#   RAVNESTD=... RAVNESTCTL=... tests/system/test-nat.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
# shellcheck source=lib-swarm.sh
. "$here/lib-swarm.sh"

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
pub=rvn-pub-$tag home=rvn-home-$tag rt=rvn-rt-$tag home2=rvn-home2-$tag rt2=rvn-rt2-$tag
dir=$(mktemp -d /var/tmp/ravnest-nat-test.XXXXXX)
pids=()

cleanup() {
        stop_all TERM "${pids[@]}"
        remove_scratch "$dir" "$pub" "$home" "$rt" "$home2" "$rt2"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# established NS PEER...: NS holds established TCP connections from every PEER.
established() {
        local ns=$1 peer out
        shift
        out=$(nsx "$ns" ss -tnH state established)
        for peer in "$@"; do grep -q " ${peer//./\\.}:" <<<"$out" || return 1; done
}

# ---- the networks ---------------------------------------------------------------

# home_network HOME ROUTER N OUTSIDE: HOME (10.77.N.1) behind ROUTER, whose
# address on pub's side is OUTSIDE; it masquerades and lets in only replies.
home_network() {
        local h=$1 r=$2 n=$3 out=$4 i=$3$tag ns
        ip netns add "$h" && ip netns add "$r" || return 1
        ip link add "po$i" netns "$pub" type veth peer name "ro$i" netns "$r" || return 1
        ip link add "h$i" netns "$h" type veth peer name "ri$i" netns "$r" || return 1
        nsx "$r" ip addr add "$out/32" dev "ro$i"
        nsx "$r" ip addr add "10.77.$n.254/24" dev "ri$i"
        nsx "$h" ip addr add "10.77.$n.1/24" dev "h$i"
        for ns in "$h" "$r"; do nsx "$ns" ip link set lo up; done
        nsx "$pub" ip link set "po$i" up
        nsx "$h" ip link set "h$i" up
        nsx "$r" ip link set "ro$i" up
        nsx "$r" ip link set "ri$i" up
        nsx "$r" ip route add 10.77.1.1/32 dev "ro$i"
        nsx "$r" ip route add default via 10.77.1.1
        nsx "$h" ip route add default via "10.77.$n.254"
        nsx "$pub" ip route add "$out/32" dev "po$i"
        nsx "$pub" ip route add "10.77.$n.0/24" via "$out"
        nsx "$r" sysctl -qw net.ipv4.ip_forward=1
        nsx "$r" iptables -t nat -A POSTROUTING -o "ro$i" -j MASQUERADE &&
                nsx "$r" iptables -P FORWARD DROP &&
                nsx "$r" iptables -A FORWARD -i "ri$i" -o "ro$i" -j ACCEPT &&
                nsx "$r" iptables -A FORWARD -i "ro$i" -o "ri$i" -m state --state ESTABLISHED,RELATED -j ACCEPT
}

# pub is one host (10.77.1.1) with a link to each router; it knows the way
# to both home networks: only the routers' rules keep it out.
setup_networks() {
        ip netns add "$pub" || return 1
        nsx "$pub" ip link set lo up
        nsx "$pub" ip addr add 10.77.1.1/32 dev lo
        home_network "$home" "$rt" 2 10.77.1.254 && home_network "$home2" "$rt2" 3 10.77.1.253
}

# connect NS HOST PORT: a TCP connection from NS opens within 3 s.
connect() {
        nsx "$1" timeout 3 python3 -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)' \
                "$2" "$3" 2>/dev/null
}

# listen NS HOST PORT: a listener in NS, in the background; its pid in $!
# (ip netns exec runs it in place: the pid is the listener's own).
listen() {
        ip netns exec "$1" python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); time.sleep(30)' "$2" "$3" &
}

# unreachable NAME NS HOST FROM...: a listener at HOST in NS that none of FROM reaches.
unreachable() {
        local name=$1 ns=$2 host=$3 lp from ok=1
        shift 3
        listen "$ns" "$host" 9999
        lp=$!
        sleep 0.5
        for from in "$@"; do connect "$from" "$host" 9999 && ok=0; done
        kill "$lp" 2>/dev/null
        wait "$lp" 2>/dev/null
        if [ "$ok" = 1 ]; then pass "$name"; else fail "$name"; fi
}

both_homes_reach_pub() {
        connect "$home" 10.77.1.1 9998 && connect "$home2" 10.77.1.1 9998
}

check_nat_is_real() {
        local lp
        unreachable "nobody outside reaches a listener at home" "$home" 10.77.2.1 "$pub" "$home2"
        unreachable "nobody outside reaches a listener at home2" "$home2" 10.77.3.1 "$pub" "$home"
        listen "$pub" 10.77.1.1 9998
        lp=$!
        sleep 0.5
        check "both homes reach a listener in pub" both_homes_reach_pub
        kill "$lp" 2>/dev/null
        wait "$lp" 2>/dev/null
}

log "namespaces $pub, $home, $rt, $home2, $rt2; files in $dir"
setup_networks || { fail "network namespaces and NATs set up"; summary; exit 1; }
check_nat_is_real

swarm_layout 2 2
declare -A host_of=(["$pub"]=10.77.1.1 ["$home"]=10.77.2.1 ["$home2"]=10.77.3.1)

# place c1s1 NS c1s2 NS ...: the nodes' namespaces; those in pub have an
# address in the plan, the others are behind NAT.
place() {
        while [ $# -gt 0 ]; do
                ns_of[$1]=$2
                listen_of[$1]=${host_of[$2]}
                addr_of[$1]=""
                [ "$2" = "$pub" ] && addr_of[$1]=10.77.1.1
                shift 2
        done
}

# dials_out NAME...: each says it accepts no connections and dials its links.
dials_out() {
        local n
        for n in "$@"; do check "$n (behind NAT) dials its links" grep -q "accepts no connections" "$d/$n.log"; done
}

log "1. c1s2 and c2s1 behind the home's NAT"
d=$dir/direct
place c1s1 "$pub" c1s2 "$home" c2s1 "$home" c2s2 "$pub"
swarm_write "$d" "" "" "" || { fail "keys and configurations written"; summary; exit 1; }
swarm_start "$d" 1
if wait_for 120 established "$pub" 10.77.1.254; then pass "pub's nodes hold links from the router's address"
else fail "pub's nodes hold links from the router's address" "$(nsx "$pub" ss -tn)"; fi
swarm_finish "$d"
dials_out c1s2 c2s1

log "2. c1s1 and c2s1 at home, c1s2 at home2: through a relay in pub"
d=$dir/relay
place c1s1 "$home" c1s2 "$home2" c2s1 "$home" c2s2 "$pub"
mkdir -p "$d/relay"
swarm_write "$d" 'relay = "10.77.1.1:7400";' "" "" || { fail "keys and configurations written"; summary; exit 1; }
# the relay holds the swarm's network secret (and trains nothing): it
# relays only links whose handshake proves the secret
printf 'state_directory = "%s/relay";\ncontrol_socket = "%s/relay.sock";\nnetwork = { secret_file = "%s/secret"; };\nrelay = { listen = "10.77.1.1:7400"; max_links = 16; };\n' \
        "$d" "$d" "$d" >"$d/relay.conf"
ip netns exec "$pub" "$RAVNESTD" --config "$d/relay.conf" >"$d/relay.log" 2>&1 &
relay_pid=$!
pids+=($relay_pid)
wait_for 10 grep -q "Relaying links" "$d/relay.log" || fail "the relay starts" "$(cat "$d/relay.log")"
check "the relay checks links against the network secret" grep -q "checked against the network secret" "$d/relay.log"
swarm_start "$d" 1
if wait_for 120 established "$pub" 10.77.1.254 10.77.1.253; then pass "the relay holds links from both routers"
else fail "the relay holds links from both routers" "$(nsx "$pub" ss -tn)"; fi
swarm_finish "$d"
dials_out c1s1 c1s2 c2s1
log "the relay's peak RSS: $(sed -n 's/^VmHWM:\s*//p' "/proc/$relay_pid/status" 2>/dev/null)"
kill -TERM "$relay_pid"
wait "$relay_pid"
status=$?
check "the relay stops cleanly (status $status)" test "$status" -eq 0
pids=()

log "3. membership: m4 at home says it takes connections; the coordinator finds it does not"
d=$dir/membership
names=(co m1 m2 m3 m4)
place co "$pub" m1 "$pub" m2 "$pub" m3 "$pub" m4 "$home"
i=0
for n in "${names[@]}"; do port_of[$n]=$((7101 + i)); i=$((i + 1)); done
# less than a replica of the MLP (52 MiB) each: two stages per cluster
swarm_write_members "$d" 10.77.1.1:7300 30M || { fail "keys and configurations written"; summary; exit 1; }
for n in "${names[@]}"; do swarm_start_node "$d" "$n" 1; done
# it dials back where m4's link comes from (its router), not the home address m4 gives
if wait_for 60 grep -q "does not accept connections at 10.77.1.254:${port_of[m4]}" "$d/co.log"; then
        pass "the coordinator cannot dial m4 back through the NAT"
else fail "the coordinator cannot dial m4 back through the NAT" "$(tail -n 5 "$d/co.log")"; fi
check "m4 joined from its router, giving its home address" grep -q "joined from 10.77.1.254:[0-9]*, giving host 10.77.2.1" "$d/co.log"
check "m4 hears that it dials every link" grep -q "could not dial this node back" "$d/m4.log"
for n in m1 m2 m3; do
        check "the coordinator dials $n back" wait_for 30 grep -q "The coordinator dialed this node back" "$d/$n.log"
done
# says NAME REACHABILITY: the node's status, while it trains, says so
says() {
        "$RAVNESTCTL" status --json --socket "$d/$1.sock" 2>/dev/null | grep -q "\"Reachability\": *\"$2\""
}
check "m4's status says it is not reachable" wait_for 60 says m4 "not reachable"
check "m1's status says it is reachable" wait_for 60 says m1 reachable
for n in m1 m2 m3 m4; do
        wait_for 180 grep -q "Training is over" "$d/$n.log" || fail "$n trains to the end" "$(tail -n 5 "$d/$n.log")"
done
swarm_stop_members "" m1 m2 m3 m4 co
summary
