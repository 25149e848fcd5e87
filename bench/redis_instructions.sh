#!/usr/bin/env bash
# bench/redis_instructions.sh: instructions Redis spends per decision running lua/token_bucket.lua
# (callgrind on redis-server), for batches of BATCHES requests (default "1 8 32"), each request one
# limit on one of 1,000 keys, writing buckets in each of FORMATS (default "hash packed
# packed_ttl"), the call sent as the proxy sends it (nothing per request: one limit each). The
# count does not move with the machine's load, so a change to the script can be measured on a
# noisy box; bench/compare.sh gives Redis CPU per request under load.
#
#   bench/redis_instructions.sh                      # the script in the checkout
#   SCRIPT=old.lua ARGS=explicit bench/redis_instructions.sh  # each request's limit numbers sent (before a7942ea)
#   SCRIPT=old.lua ARGS=batched bench/redis_instructions.sh   # batches, before state_format
#   SCRIPT=old.lua ARGS=old bench/redis_instructions.sh   # a script of before 2026-12-03 (no batches)
#
# Needs valgrind, redis-server, redis-cli, redis-benchmark.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
SCRIPT=${SCRIPT:-$repo/lua/token_bucket.lua}
BATCHES=${BATCHES:-1 8 32}
FORMATS=${FORMATS:-hash packed packed_ttl}
[[ ${ARGS:-explicit} == explicit ]] || FORMATS=hash
CALLS=${CALLS:-2000}
work=$(mktemp -d)
pid=
cleanup() {
    [[ -n $pid ]] && kill "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

echo "Redis instructions per decision (callgrind), $(redis-server --version | awk '{print $3}'), $(basename "$SCRIPT"):"
for format in $FORMATS; do
    for batch in $BATCHES; do
        free_port; port=$REPLY
        valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" --dump-instr=no \
            redis-server --port "$port" --save "" --appendonly no >"$work/redis.log" 2>&1 &
        pid=$!
        wait_until 120 "redis under valgrind" redis-cli -p "$port" ping
        sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$SCRIPT")")
        keys=() args=()
        if [[ ${ARGS:-} == old ]]; then
            ((batch == 1)) || { echo "  the old script decides one request per call" >&2; kill "$pid"; pid=; continue; }
            args=(1000000000 1000000 1 1)
        else
            args=(1 1000000000 1000000 1 1)
            [[ ${ARGS:-} == batched ]] || args=("$format" "${args[@]}")
        fi
        for ((i = 0; i < batch; i++)); do
            keys+=("rl:{bench}:__rand_int__")
            [[ ${ARGS:-} == old || ${ARGS:-} == "" ]] || args+=(1 1)
        done
        run() { redis-benchmark -p "$port" -n "$CALLS" -c 2 -r 1000 EVALSHA "$sha" "$batch" "${keys[@]}" "" "${args[@]}" >/dev/null; }
        run # warm: every key written once
        callgrind_control -z "$pid" >/dev/null
        run
        callgrind_control -d "$pid" >/dev/null
        ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$(ls -t "$work"/cg.out* | head -1)")
        printf '  %-6s batch %-3d %8d\n' "$format" "$batch" $((ir / (CALLS * batch)))
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        pid=
        rm -f "$work"/cg.out*
    done
done
