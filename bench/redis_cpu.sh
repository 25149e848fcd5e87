#!/usr/bin/env bash
# bench/redis_cpu.sh: Redis's CPU time per decision (INFO cpu, user + sys), for the proxy's script
# in calls of 1, 8 and 32 decisions, beside what bounds it from below on this machine: a script that
# only reads its keys with one MGET and writes each with SET … PX (bench/redis_floor.lua), and the
# same commands sent without a script (SET … PX and GET, pipelined 8 deep).
#
# Issue 14's third target is Redis CPU per decision; bench/compare.sh measures it under the proxy.
# This isolates Redis: redis-benchmark drives it (8 connections, 10,000 keys, FORMAT buckets), so
# the figures say what any client would cost it. CPU time is less disturbed by a busy machine than
# throughput, but a shared VM still moves it by a tenth or so: compare within one run.
#
#   bench/redis_cpu.sh
#   SCRIPTS="old.lua lua/token_bucket.lua" BATCHES="8 32" bench/redis_cpu.sh   # two scripts side by side
#
# FORMAT is the state_format the script writes (default packed_ttl); BATCHES the call sizes.
#
# Needs redis-server and redis-benchmark.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
work=$(mktemp -d)
pid=
cleanup() {
    [[ -n $pid ]] && kill "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
die() { echo "redis_cpu.sh: $*" >&2; exit 1; }
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
for tool in redis-server redis-cli redis-benchmark bc; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install redis-server redis-tools bc)"
done

free_port; port=$REPLY
redis-server --port "$port" --save "" --appendonly no --logfile "$work/redis.log" &
pid=$!
wait_until 10 "redis" redis-cli -p "$port" ping

cpu() { redis-cli -p "$port" INFO cpu | tr -d '\r' | awk -F: '$1 == "used_cpu_user" || $1 == "used_cpu_sys" { t += $2 } END { printf "%.6f", t }'; }

# measure LABEL OPS PER_OP ARGS...: CPU µs per decision over OPS calls of redis-benchmark ARGS,
# each call holding PER_OP decisions; after a warm-up that writes every key once.
measure() {
    local label=$1 ops=$2 per=$3 before after
    shift 3
    redis-benchmark -p "$port" -n 20000 -c 8 -r 10000 "$@" >/dev/null
    before=$(cpu)
    redis-benchmark -p "$port" -n "$ops" -c 8 -r 10000 "$@" >/dev/null
    after=$(cpu)
    printf '  %-52s %6.2f\n' "$label" "$(echo "($after - $before) * 1000000 / ($ops * $per)" | bc -l)"
}

echo "Redis CPU µs per decision, $(redis-server --version | awk '{print $3}'), $(nproc) CPUs:"
for script in ${SCRIPTS:-lua/token_bucket.lua bench/redis_floor.lua}; do
    sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$script")")
    for batch in ${BATCHES:-1 8 32}; do
        keys=() args=("${FORMAT:-packed_ttl}" 1 1000000000 1000000 1 1)
        for ((i = 0; i < batch; i++)); do
            keys+=("rl:{bench}:__rand_int__")
            args+=(1 1)
        done
        measure "$(basename "$script"), calls of $batch" $((400000 / batch)) "$batch" \
            EVALSHA "$sha" "$batch" "${keys[@]}" "" "${args[@]}"
    done
done
measure "SET … PX alone, pipelined 8 deep (no script)" 400000 1 \
    -P 8 SET "rl:{bench}:__rand_int__" xxxxxxxxxxxxxxxxxxxxxxxx PX 100000
measure "GET alone, pipelined 8 deep (no script)" 400000 1 -P 8 GET "rl:{bench}:__rand_int__"
