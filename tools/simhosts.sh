#!/usr/bin/env bash
# Simulated hosts: N network namespaces, each with its own address on a
# bridge that lives in a namespace of its own, each host's link shaped with
# tbf. Only the namespaces it creates (NAME-br, NAME-h0, NAME-h1, ...) are
# touched; nothing outside them changes. Needs root (CAP_NET_ADMIN).
#
#   tools/simhosts.sh up NAME N [RATE] [FLOW]  # hosts 0..N-1 at 10.77.0.1..N/24; RATE e.g.
#                                          # 10gbit; FLOW: each TCP flow capped at FLOW too
#   tools/simhosts.sh addr NAME I          # prints host I's address
#   tools/simhosts.sh run NAME I CMD...    # runs CMD on host I (in its namespace)
#   tools/simhosts.sh shape NAME I RATE [FLOW]  # sets host I's link rate (both directions)
#   tools/simhosts.sh link NAME I up|down  # cuts or restores host I's link
#   tools/simhosts.sh delay NAME I DELAY   # what host I sends waits DELAY (e.g. 100us)
#                                          # more: netem under its tbf (not with FLOW)
#   tools/simhosts.sh pair NAME I J RATE BASE  # traffic between hosts I and J at
#                                          # RATE, the rest of theirs at BASE
#   tools/simhosts.sh down NAME            # deletes every namespace of NAME
#   tools/simhosts.sh check                # exit 0 if namespaces can be made here
#
# FLOW stands for a network that caps each flow (a cloud's per-flow limit):
# htb, the link at RATE and under it 64 classes of at most FLOW each; a TCP
# segment goes to the class of the low 3 bits of its source and of its
# destination port, so flows mostly get a class each (4 flows: 9 in 10
# times), and flows that share one share its cap.
#
# Callers tear down with `trap 'tools/simhosts.sh down NAME' EXIT`, so the
# namespaces go even after a failure. Each host's veth end in the bridge
# namespace is shaped too, so the rate holds for traffic to the host as well
# as from it.
set -euo pipefail

IP=$(command -v ip || echo /usr/sbin/ip)
TC=$(command -v tc || echo /usr/sbin/tc)
SUBNET=10.77.0

die() {
  echo "simhosts: $*" >&2
  exit 1
}

ns_host() { echo "$1-h$2"; }
ns_bridge() { echo "$1-br"; }
addr() { echo "$SUBNET.$(($2 + 1))"; }

# tbf on a device: the rate, a burst of at least one 64 KiB send, a queue
# of 50 ms at the rate.
shape_dev() {
  local ns=$1 dev=$2 rate=$3
  "$IP" netns exec "$ns" "$TC" qdisc replace dev "$dev" root handle 1: tbf rate "$rate" \
    burst 256kb latency 50ms
}

# As shape_dev, each TCP flow also capped at `flow` (see above).
shape_flows_dev() {
  local ns=$1 dev=$2 rate=$3 flow=$4
  {
    echo "qdisc replace dev $dev root handle 1: htb default 2"
    echo "class replace dev $dev parent 1: classid 1:1 htb rate $rate quantum 65536"
    echo "class replace dev $dev parent 1:1 classid 1:2 htb rate 10mbit ceil $rate quantum 65536"
    for ((c = 0; c < 64; c++)); do
      echo "class replace dev $dev parent 1:1 classid 1:$((c + 16)) htb rate 10mbit ceil $flow" \
        "quantum 65536"
      # Word 20 of an IP packet without options: source and destination port.
      echo "filter add dev $dev parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff" \
        "match u32 $(printf '0x%08x' $((((c >> 3) << 16) | (c & 7)))) 0x00070007 at 20" \
        "flowid 1:$((c + 16))"
    done
  } | "$IP" netns exec "$ns" "$TC" -batch -
}

shape_host() {
  local name=$1 i=$2 rate=$3 flow=${4:-}
  if [ -n "$flow" ]; then
    shape_flows_dev "$(ns_host "$name" "$i")" eth0 "$rate" "$flow"
    shape_flows_dev "$(ns_bridge "$name")" "p$i" "$rate" "$flow"
  else
    shape_dev "$(ns_host "$name" "$i")" eth0 "$rate"
    shape_dev "$(ns_bridge "$name")" "p$i" "$rate"
  fi
}

# On host i's own end: traffic to `dst` at `rate`, the rest at `base`
# (htb, one class each; replaces the tbf of `shape`).
shape_pair_dev() {
  local ns=$1 dst=$2 rate=$3 base=$4
  "$IP" netns exec "$ns" "$TC" qdisc replace dev eth0 root handle 1: htb default 10
  "$IP" netns exec "$ns" "$TC" class replace dev eth0 parent 1: classid 1:10 htb rate "$base" \
    quantum 65536
  "$IP" netns exec "$ns" "$TC" class replace dev eth0 parent 1: classid 1:20 htb rate "$rate" \
    quantum 65536
  "$IP" netns exec "$ns" "$TC" filter replace dev eth0 parent 1: protocol ip prio 1 u32 \
    match ip dst "$dst/32" flowid 1:20
}

up() {
  local name=$1 n=$2 rate=${3:-} flow=${4:-}
  [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "N must be 1..200"
  local br
  br=$(ns_bridge "$name")
  "$IP" netns add "$br"
  "$IP" -n "$br" link add name br0 type bridge
  "$IP" -n "$br" link set br0 up
  for ((i = 0; i < n; i++)); do
    local h
    h=$(ns_host "$name" "$i")
    "$IP" netns add "$h"
    "$IP" -n "$h" link set lo up
    # eth0 in the host, p$i in the bridge namespace.
    "$IP" -n "$h" link add name eth0 type veth peer name "p$i" netns "$br"
    "$IP" -n "$h" addr add "$(addr "$name" "$i")/24" dev eth0
    "$IP" -n "$h" link set eth0 up
    "$IP" -n "$br" link set "p$i" master br0
    "$IP" -n "$br" link set "p$i" up
    if [ -n "$rate" ]; then shape_host "$name" "$i" "$rate" "$flow"; fi
  done
}

down() {
  local name=$1
  for ns in $("$IP" netns list | awk '{print $1}' | grep -E "^$name-(br|h[0-9]+)$" || true); do
    # Processes left in a host's namespace go with it.
    for pid in $("$IP" netns pids "$ns" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; done
    "$IP" netns del "$ns" 2>/dev/null || true
  done
}

cmd=${1:-}
shift || true
case "$cmd" in
  up) up "$@" ;;
  addr) addr "$@" ;;
  run)
    name=$1 i=$2
    shift 2
    # nsenter changes the network namespace alone; `ip netns exec` would
    # also remount /sys, hiding the cgroup file system from daemons.
    exec nsenter --net="/run/netns/$(ns_host "$name" "$i")" "$@"
    ;;
  shape) shape_host "$@" ;;
  pair)
    name=$1 i=$2 j=$3
    shape_pair_dev "$(ns_host "$name" "$i")" "$(addr "$name" "$j")" "$4" "$5"
    shape_pair_dev "$(ns_host "$name" "$j")" "$(addr "$name" "$i")" "$4" "$5"
    ;;
  link)
    [ "$3" = up ] || [ "$3" = down ] || die "link takes up or down"
    "$IP" -n "$(ns_bridge "$1")" link set "p$2" "$3"
    ;;
  delay)
    # Under the tbf of `shape` (handle 1:), or at the root of an unshaped
    # link.
    ns=$(ns_host "$1" "$2")
    if "$TC" -n "$ns" qdisc show dev eth0 | grep -q "^qdisc tbf 1:"; then
      "$TC" -n "$ns" qdisc replace dev eth0 parent 1:1 handle 10: netem delay "$3" limit 100000
    else
      "$TC" -n "$ns" qdisc replace dev eth0 root netem delay "$3" limit 100000
    fi
    ;;
  down) down "$@" ;;
  check)
    probe="gs-simhosts-probe-$$"
    if "$IP" netns add "$probe" 2>/dev/null; then
      "$IP" netns del "$probe"
      exit 0
    fi
    echo "simhosts: cannot create network namespaces here (needs root / CAP_NET_ADMIN)" >&2
    exit 1
    ;;
  *) die "usage: simhosts.sh up|addr|run|shape|pair|link|delay|down|check ..." ;;
esac
