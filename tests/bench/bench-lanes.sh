#!/bin/bash
# bench-lanes.sh — a link over a long fat path: throughput of one link of
# ravnest with 1, 2, 4 and 8 TCP connections (network.connections) against
# iperf3 with as many streams, measured in the same run.
#
# Two network namespaces joined by a veth pair; each side sends at most
# RATE (tbf) and holds what comes in for half the round trip (nfq-delay,
# tests/tools: there is no netem here), so a round trip takes RTT_MS. The
# link is encrypted (AES-256-GCM) as in a swarm; iperf3 sends plaintext.
# Runs are interleaved; medians of RUNS. As root.
#
#   tests/bench/bench-lanes.sh [RUNS] [SECONDS]   (RATE=1gbit RTT_MS=100 TUNED=0 LOSS=)
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../../build}
LINK=$build/tests/bench/bench-link
NFQ_DELAY=$build/tests/nfq-delay
RUNS=${1:-3}
SECONDS_=${2:-15}
RATE=${RATE:-1gbit}
RTT_MS=${RTT_MS:-100}
LANES=${LANES:-1 2 4 8}

die() { echo "bench-lanes: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
for t in ip tc iptables iperf3 "$LINK" "$NFQ_DELAY"; do command -v "$t" >/dev/null || die "$t is missing"; done

tag=$$ a=rvl-a-$$ b=rvl-b-$$
helpers=()
cleanup() {
        for p in "${helpers[@]}"; do kill "$p" 2>/dev/null; done
        wait 2>/dev/null
        ip netns del "$a" 2>/dev/null
        ip netns del "$b" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM
nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

ip netns add "$a" && ip netns add "$b" || die "namespaces"
ip link add "va$tag" netns "$a" type veth peer name "vb$tag" netns "$b" || die "veth"
nsx "$a" ip addr add 10.79.0.1/24 dev "va$tag"
nsx "$b" ip addr add 10.79.0.2/24 dev "vb$tag"
for ns in "$a" "$b"; do nsx "$ns" ip link set lo up; done
nsx "$a" ip link set "va$tag" up
nsx "$b" ip link set "vb$tag" up
half=$((RTT_MS / 2))
for side in "$a:va$tag" "$b:vb$tag"; do
        ns=${side%%:*} dev=${side#*:}
        # the queue holds a round trip at the rate, so tbf itself drops nothing
        nsx "$ns" tc qdisc add dev "$dev" root tbf rate "$RATE" burst 1mb latency "$((RTT_MS * 2))ms" || die "tbf"
        nsx "$ns" iptables -t mangle -A PREROUTING -p tcp -j NFQUEUE --queue-num 0 --queue-bypass || die "iptables"
        ip netns exec "$ns" "$NFQ_DELAY" 0 "$half" >/dev/null 2>&1 &
        helpers+=($!)
done
# The kernel's default windows (tcp_rmem up to 6 MiB: less than the
# bandwidth-delay product of 1 Gbit/s over 100 ms, 12.5 MB), as on a
# desktop nobody tuned; TUNED=1 raises them to 32 MiB, as a tuned server
# would. LOSS=P drops that fraction of what arrives, as a far path does.
if [ "${TUNED:-0}" = 1 ]; then
        for ns in "$a" "$b"; do
                nsx "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 131072 33554432" net.ipv4.tcp_wmem="4096 16384 33554432"
        done
fi
if [ -n "${LOSS:-}" ]; then
        for ns in "$a" "$b"; do
                nsx "$ns" iptables -I INPUT -p tcp -m statistic --mode random --probability "$LOSS" -j DROP || die "loss"
        done
fi
sleep 0.5
secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
ip netns exec "$b" "$LINK" serve 10.79.0.2 7500 "$secret" &
helpers+=($!)
ip netns exec "$b" iperf3 -s -p 7501 -B 10.79.0.2 >/dev/null 2>&1 &
helpers+=($!)
sleep 1
echo "path: $RATE, round trip $RTT_MS ms, loss ${LOSS:-0}, windows $([ "${TUNED:-0}" = 1 ] && echo "up to 32 MiB" || echo "the kernel's defaults"); $RUNS runs of $SECONDS_ s, interleaved"

declare -A ours theirs
for ((run = 1; run <= RUNS; run++)); do
        for k in $LANES; do
                r=$(ip netns exec "$a" "$LINK" send 10.79.0.2 7500 "$secret" "$k" "$SECONDS_")
                i=$(ip netns exec "$a" iperf3 -c 10.79.0.2 -p 7501 -P "$k" -t "$SECONDS_" -O 3 -J 2>/dev/null |
                        python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e6))' 2>/dev/null)
                echo "run $run, $k connection(s): ravnest ${r:-failed} MB/s, iperf3 ${i:-failed} MB/s" >&2
                ours[$k]+="${r:-} " theirs[$k]+="${i:-} "
        done
done
median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print "-" }'; }
printf '\n%-12s %16s %16s %8s\n' connections "ravnest (MB/s)" "iperf3 -P (MB/s)" ratio
for k in $LANES; do
        o=$(echo "${ours[$k]}" | median) t=$(echo "${theirs[$k]}" | median)
        printf '%-12s %16s %16s %8s\n' "$k" "$o" "$t" "$(awk -v o="$o" -v t="$t" 'BEGIN { if (t > 0 && o != "-") printf "%.2fx", o / t; else print "-" }')"
done
