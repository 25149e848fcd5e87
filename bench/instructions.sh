#!/usr/bin/env bash
# bench/instructions.sh: user-space instructions the proxy spends per request (callgrind), for a
# route without limits, a route decided in Redis, and a hot key answered from the deny cache; and,
# for the floors under "none" and "hot", a bare Pingora proxy (examples/bare_pingora.rs) forwarding
# the same way, and answering every request 429 itself.
#
# Instruction counts do not depend on what else the machine is doing, so two commits can be
# compared on a shared, noisy box where throughput cannot (see bench/compare.sh for throughput).
# Each run builds REV (default HEAD; a commit is built from a `git archive` snapshot, "worktree"
# builds the checkout), starts its own Redis and demo upstream on free ports, runs the proxy under
# valgrind, and for each route zeroes the counters, sends N requests (default 3000) over one
# keep-alive connection and reads the total back.
#
#   bench/instructions.sh                        # HEAD
#   REV=3db8604 bench/instructions.sh            # an earlier commit, to compare
#
# Prints one line per route: instructions per request. Needs valgrind, redis-server, python3.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
REV=${REV:-HEAD}
N=${N:-3000}
target_dir=$repo/target/instructions
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [[ -n ${KEEP_TMP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
die() { echo "instructions.sh: $*" >&2; exit 1; }
log() { echo "instructions.sh: $*" >&2; }
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

for tool in valgrind callgrind_control redis-server python3; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install valgrind redis-server python3)"
done

examples=(--example demo_upstream)
# Commits before 536922d have no bare Pingora example.
bare=0
if [[ $REV == worktree ]] || git cat-file -e "$REV:examples/bare_pingora.rs" 2>/dev/null; then
    examples+=(--example bare_pingora)
    bare=1
fi
build_rev instructions --bin ratelimit-proxy "${examples[@]}"
bin=$build_dir/release

free_port; redis_port=$REPLY
redis-server --port "$redis_port" --save "" --appendonly no --logfile "$work/redis.log" &
pids+=($!)
free_port; upstream_port=$REPLY
"$bin/examples/demo_upstream" "127.0.0.1:$upstream_port" 2>/dev/null &
pids+=($!)
free_port; listen_port=$REPLY
free_port; admin_port=$REPLY
cat >"$work/routes.yaml" <<EOF
listen: "127.0.0.1:$listen_port"
admin: "127.0.0.1:$admin_port"
redis: { url: "redis://127.0.0.1:$redis_port", timeout_ms: 2000 }
routes:
  - name: none
    match: { path_prefix: "/none" }
    upstream: "127.0.0.1:$upstream_port"
  - name: redis
    match: { path_prefix: "/redis" }
    upstream: "127.0.0.1:$upstream_port"
    limits: [{ name: l, capacity: 1000000000, refill: "1000000/s" }]
  - name: hot
    match: { path_prefix: "/hot" }
    upstream: "127.0.0.1:$upstream_port"
    limits: [{ name: l, capacity: 1, refill: "1/h" }]
EOF
wait_until 10 "redis" redis-cli -p "$redis_port" ping

out=$work/callgrind.out
valgrind --tool=callgrind --callgrind-out-file="$out" --dump-instr=no \
    "$bin/ratelimit-proxy" --config "$work/routes.yaml" 2>"$work/proxy.log" &
pid=$!
pids+=($pid)
wait_until 300 "the proxy under valgrind" curl -fs "http://127.0.0.1:$admin_port/healthz"

# N requests to PATH over one keep-alive connection; fails unless every status is STATUS.
send() {
    python3 - "${port:-$listen_port}" "$1" "$2" "$3" <<'PY'
import http.client, sys
port, path, n, status = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
conn = http.client.HTTPConnection("127.0.0.1", port)
for i in range(n):
    conn.request("GET", path)
    r = conn.getresponse()
    r.read()
    if r.status != status:
        sys.exit(f"{path}: request {i} got {r.status}, not {status}")
PY
}

# Instructions of everything since the counters were last zeroed.
total() {
    callgrind_control -d "$pid" >/dev/null
    local dump
    dump=$(ls -t "$out"* | head -1)
    awk '/^(summary|totals):/ { print $2; exit }' "$dump"
}

echo "instructions per request (user space, callgrind), $measured, $N requests per route:"
for route in "none 200" "redis 200" "hot 429"; do
    read -r name status <<<"$route"
    # Warm: connections made, the script loaded, the hot key's denial remembered.
    [[ $name == hot ]] && send "/$name" 1 200
    send "/$name" 200 "$status"
    callgrind_control -z "$pid" >/dev/null
    send "/$name" "$N" "$status"
    ir=$(total)
    printf '  %-6s %8d\n' "$name" $((ir / N))
done

if ((bare)); then
    modes=("forward 200 bare")
    # Earlier commits' example has no `refuse` mode.
    if [[ $REV == worktree ]]; then
        example=$(cat examples/bare_pingora.rs)
    else
        example=$(git show "$REV:examples/bare_pingora.rs")
    fi
    [[ $example == *'"refuse"'* ]] && modes+=("refuse 429 bare-429")
    for mode in "${modes[@]}"; do
        read -r how status label <<<"$mode"
        free_port; port=$REPLY
        out=$work/callgrind.out.$label
        valgrind --tool=callgrind --callgrind-out-file="$out" --dump-instr=no \
            "$bin/examples/bare_pingora" "127.0.0.1:$port" "127.0.0.1:$upstream_port" "$how" 2>"$work/$label.log" &
        pid=$!
        pids+=($pid)
        wait_until 300 "bare Pingora under valgrind" curl -s -o /dev/null "http://127.0.0.1:$port/"
        send /none 200 "$status"
        callgrind_control -z "$pid" >/dev/null
        send /none "$N" "$status"
        ir=$(total)
        case $label in
            bare) printf '  %-6s %8d   (bare Pingora: the floor under "none")\n' bare $((ir / N)) ;;
            *) printf '  %-6s %8d   (bare Pingora answering 429 itself: the floor under "hot")\n' 429 $((ir / N)) ;;
        esac
    done
fi
