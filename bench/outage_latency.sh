#!/usr/bin/env bash
# Request latency through ratelimit-proxy while Redis is healthy, paused, and failing over.
#
# Usage (from the repo root, as any user):
#
#     bench/outage_latency.sh
#
# What is measured: by default the committed HEAD, built from a `git archive` snapshot, so that
# uncommitted edits in the checkout (others work in it) neither break the build nor slip into the
# numbers; REV=<commit> picks another commit, REV=worktree builds the checkout as it is.
#
# Optional environment: RUNS (default 2), DURATION seconds per load window (10), CONNECTIONS
# (16), THINK_MS pause of each connection between requests (0: wrk's usual full-speed closed
# loop, which saturates a small machine), KILL_AFTER seconds into the cluster window (2),
# KEEP_TMP=1 to keep the temp dir (logs, configs, raw wrk output), OUT (default bench/results/outage_latency.md) where the Markdown report goes;
# it is printed too.
#
# Needs git, cargo, redis-server and redis-cli (7.x: --cluster-port, --json), wrk, curl, ss. Nothing
# else: no root, no Docker, no system Redis (6379 is never touched). Everything runs on loopback
# on free ports in 20000-31999 (below the ephemeral range, so outgoing connections cannot take
# them), in its own temp dir, and every process it starts is killed on exit.
#
# Phases, each run RUNS times, interleaved (1, 2a, 2b, 3, then again) so that the other load on
# a shared machine spreads over all phases instead of landing on one:
#   1   standalone Redis healthy; limits far above the load, so every request is allowed;
#   2a  the same Redis paused with SIGSTOP just before the window starts: calls time out
#       (timeout_ms 25) instead of failing fast; the route fails open. Includes the breaker opening.
#   2b  still paused, a second window started once ratelimit_redis_up reads 0: the breaker is
#       open and only its half-open probes (at most one every 5 s by then) wait for the timeout.
#   3   Redis Cluster, 3 primaries + 3 replicas (cluster-node-timeout 1000,
#       cluster-replica-validity-factor 0); the route's only key lives in a slot of one primary,
#       which is SIGKILLed KILL_AFTER seconds into the window; the window spans the failover.
# Every run gets fresh Redis processes and a fresh proxy (warmed up for 2 s with the same load),
# so no breaker state or cool-down carries over from one run to the next.

set -euo pipefail

# Remembered for the report's command line: only what the caller set.
overrides=""
for v in REV RUNS DURATION CONNECTIONS THINK_MS KILL_AFTER OUT; do [[ -n ${!v:-} ]] && overrides+="$v=${!v} "; done

RUNS=${RUNS:-2}
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-16}
export THINK_MS=${THINK_MS:-0} # read by bench/latency.lua
KILL_AFTER=${KILL_AFTER:-2}
TIMEOUT_MS=25
ROUTE_LIMIT=per_second

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
out=${OUT:-bench/results/outage_latency.md}
lua=bench/latency.lua
REV=${REV:-HEAD}
target_dir=${CARGO_TARGET_DIR:-$repo/target}

die() { echo "outage_latency: $*" >&2; exit 1; }
log() { echo "[$(date +%T)] $*" >&2; }

for tool in git tar cargo redis-server redis-cli wrk curl ss; do
    command -v "$tool" >/dev/null || die "needs $tool on PATH (Debian: apt-get install -y ${tool/redis-*/redis-server})"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/outage_latency.XXXXXX")
pids=()

# Stopped processes ignore everything but SIGKILL and SIGCONT, and a paused Redis must not outlive
# the script: CONT first, then KILL (nothing here keeps state worth a clean shutdown).
stop() {
    kill -CONT "$1" 2>/dev/null || true
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    forget "$1"
}

# Drops a PID that has exited, so cleanup never signals a PID the system has reused since.
forget() {
    local p keep=()
    for p in "${pids[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    pids=("${keep[@]}")
}

cleanup() {
    local status=$?
    for p in "${pids[@]}"; do stop "$p"; done
    if [[ $status -ne 0 || ${KEEP_TMP:-} == 1 ]]; then
        echo "outage_latency: logs and configs kept in $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

# start NAME CMD...: runs CMD in the background, output to $work/NAME.log; its PID in $REPLY.
start() {
    local name=$1; shift
    "$@" >"$work/$name.log" 2>&1 </dev/null &
    REPLY=$!
    pids+=("$REPLY")
}

now_ms() { date +%s%3N; }

# --- processes ---------------------------------------------------------------------------------

redis_node() { # redis_node NAME [extra redis-server args...]: port in $REPLY
    local name=$1; shift
    free_port; local port=$REPLY
    start "$name-$port" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$work" --logfile "$work/$name-$port.redis.log" "$@"
    local pid=$REPLY
    wait_until 10 "redis $name on $port" redis-cli -p "$port" PING
    kill -0 "$pid" 2>/dev/null || die "redis $name on $port exited: $(tail -5 "$work/$name-$port.redis.log")"
    REPLY=$port
    NODE_PID[$port]=$pid
}
declare -A NODE_PID

stop_node() { stop "${NODE_PID[$1]}"; unset "NODE_PID[$1]"; }

# start_proxy NAME REDIS_YAML: writes the config, starts the proxy, waits until it proxies a
# request. Sets PROXY_PID, PROXY (host:port), ADMIN (host:port).
start_proxy() {
    local name=$1 redis_yaml=$2
    free_port; PROXY=127.0.0.1:$REPLY
    free_port; ADMIN=127.0.0.1:$REPLY
    local conf=$work/$name.yaml
    cat >"$conf" <<EOF
listen: "$PROXY"
admin: "$ADMIN"
shutdown_grace_seconds: 0
redis:
$redis_yaml
  timeout_ms: $TIMEOUT_MS
on_redis_error: open
routes:
  - name: $ROUTE
    upstream: "$UPSTREAM_ADDR"
    limits:
      # Far above anything wrk can send: every request is allowed while Redis answers, so the
      # latency measured is the decision's, not a 429's.
      - name: $ROUTE_LIMIT
        capacity: 1000000000
        refill: "1000000/s"
        key: route
EOF
    "$bin_dir/ratelimit-proxy" --config "$conf" --check >/dev/null || die "invalid config $conf"
    # The upgrade socket defaults to a fixed /tmp path that another instance may be using.
    RUST_LOG=info start "$name-proxy" "$bin_dir/ratelimit-proxy" --config "$conf" \
        --upgrade-sock "$work/$name-upgrade.sock"
    PROXY_PID=$REPLY
    wait_until 20 "the proxy ($name) to serve" curl -fsS -o /dev/null "http://$PROXY/"
}

metrics() { curl -fsS --max-time 2 "http://$ADMIN/metrics"; }
redis_up() { metrics | awk '$1 == "ratelimit_redis_up" { print $2 }'; }
breaker_is_open() { [[ $(redis_up) == 0 ]]; }

# The counters a window is judged by, as "name value" lines: decisions of our route by outcome,
# breaker transitions by state entered, store errors by kind.
counters() {
    metrics | awk '
        index($1, "ratelimit_decisions_total{") == 1 && /route="'"$ROUTE"'"/ {
            match($1, /decision="[a-z_]+"/); print "decision_" substr($1, RSTART + 10, RLENGTH - 11), $2 }
        index($1, "ratelimit_redis_breaker_transitions_total{") == 1 {
            match($1, /state="[a-z_]+"/); print "breaker_" substr($1, RSTART + 7, RLENGTH - 8), $2 }
        index($1, "ratelimit_redis_errors_total{") == 1 {
            match($1, /kind="[a-z_]+"/); print "error_" substr($1, RSTART + 6, RLENGTH - 7), $2 }'
}

# window PHASE RUN: one wrk run against the proxy; appends a row to $work/results.tsv.
window() {
    local phase=$1 run=$2 before after
    before=$(counters)
    log "phase $phase run $run: wrk -t1 -c$CONNECTIONS -d${DURATION}s"
    wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --timeout 2s -s "$lua" "http://$PROXY/" \
        >"$work/wrk-$phase-$run.txt"
    after=$(counters)
    local result delta
    result=$(grep '^RESULT ' "$work/wrk-$phase-$run.txt") || die "no RESULT from wrk: $(cat "$work/wrk-$phase-$run.txt")"
    # What the proxy did in this window: non-zero counter increments only.
    delta=$(awk 'NR == FNR { b[$1] = $2; next } $2 - b[$1] > 0 { printf "%s%s=%d", sep, $1, $2 - b[$1]; sep = " " }' \
        <(echo "$before") <(echo "$after"))
    printf '%s\t%s\t%s\t%s\n' "$phase" "$run" "${result#RESULT }" "${delta:--}" >>"$work/results.tsv"
}

warm_up() { wrk -t1 -c"$CONNECTIONS" -d2s "http://$PROXY/" >/dev/null; }

# --- standalone: phases 1, 2a, 2b ------------------------------------------------------------

standalone_run() {
    local run=$1
    ROUTE=bench
    redis_node standalone
    local port=$REPLY pid=${NODE_PID[$REPLY]}
    start_proxy "standalone-$run" "  url: \"redis://127.0.0.1:$port/0\""
    warm_up
    window 1 "$run"
    kill -STOP "$pid"
    window 2a "$run"
    # Normally open long before 2a ends; the wait only makes 2b's premise explicit.
    wait_until 10 "ratelimit_redis_up to read 0" breaker_is_open
    window 2b "$run"
    stop "$PROXY_PID"
    stop_node "$port"
}

# --- cluster: phase 3 --------------------------------------------------------------------------

# role_of PORT: "master", or "slave:<primary port>".
role_of() { redis-cli -p "$1" ROLE 2>/dev/null | awk 'NR == 1 { r = $1 } NR == 3 && r == "slave" { r = r ":" $1 } END { print r }'; }

cluster_ok() {
    local p
    for p in "$@"; do redis-cli -p "$p" CLUSTER INFO | grep -q '^cluster_state:ok' || return 1; done
}

# Every replica synced and every node listing all six: a failover then has a replica to promote
# and every node (the proxy's seeds included) agrees on the topology.
cluster_settled() {
    local p
    for p in "$@"; do
        [[ $(redis-cli -p "$p" CLUSTER NODES | grep -c connected) == 6 ]] || return 1
        if [[ $(role_of "$p") == slave:* ]]; then
            redis-cli -p "$p" INFO replication | grep -q '^master_link_status:up' || return 1
        fi
    done
}

# slot_ranges PORT PRIMARY: "lo hi" lines of the slots PRIMARY serves, from CLUSTER SLOTS as
# node PORT sees it (--json: one line, each range as [lo,hi,[ip,primary port,...],replicas...]).
slot_ranges() {
    redis-cli -p "$1" --json CLUSTER SLOTS |
        grep -o '\[[0-9]*,[0-9]*,\["[^"]*",[0-9]*' |
        tr -d '["' | awk -F, -v p="$2" '$4 == p { print $1, $2 }'
}

cluster_run() {
    local run=$1 ports=() p i
    for i in 0 1 2 3 4 5; do
        # The bus port is chosen too: port + 10000 may be taken, or beyond 65535.
        free_port; local bus=$REPLY
        redis_node "cluster$run-$i" --cluster-enabled yes --cluster-port "$bus" \
            --cluster-node-timeout 1000 --cluster-replica-validity-factor 0 \
            --cluster-config-file "nodes-$run-$i.conf"
        ports+=("$REPLY")
    done
    redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-replicas 1 \
        --cluster-yes >"$work/cluster$run-create.log" || die "cluster create: $(cat "$work/cluster$run-create.log")"
    wait_until 30 "cluster_state:ok on every node" cluster_ok "${ports[@]}"
    wait_until 30 "replicas synced, every node known" cluster_settled "${ports[@]}"

    # The victim: the primary of slot 0; its replica is the one to be promoted.
    local victim="" replica=""
    for p in "${ports[@]}"; do
        [[ $(role_of "$p") == master ]] && slot_ranges "${ports[0]}" "$p" | grep -q '^0 ' && victim=$p
    done
    for p in "${ports[@]}"; do [[ $(role_of "$p") == "slave:$victim" ]] && replica=$p; done
    [[ -n $victim && -n $replica ]] || die "no primary of slot 0 with a replica: $(redis-cli -p "${ports[0]}" CLUSTER NODES)"

    # A route whose key (key: route → rl:{<route>}:<limit>, the route name is the hash tag) hashes
    # into one of the victim's slots, so every decision of the window goes to the node killed.
    local ranges slot n=0
    ranges=$(slot_ranges "${ports[0]}" "$victim")
    while :; do
        ROUTE=bench$n
        slot=$(redis-cli -p "${ports[0]}" CLUSTER KEYSLOT "rl:{$ROUTE}:$ROUTE_LIMIT")
        awk -v s="$slot" '$1 <= s && s <= $2 { found = 1 } END { exit !found }' <<<"$ranges" && break
        n=$((n + 1))
    done
    log "cluster run $run: route $ROUTE, key rl:{$ROUTE}:$ROUTE_LIMIT, slot $slot on primary :$victim (replica :$replica)"

    local seeds
    seeds=$(printf '    - "redis://127.0.0.1:%s"\n' "${ports[@]}")
    start_proxy "cluster-$run" "  cluster:
$seeds"
    warm_up

    # The timeline of the failover as seen from outside, every 100 ms: the breaker gauge and
    # the replica's role. Cheap next to the load (one curl and one redis-cli per sample).
    # It stops itself at a flag file rather than being killed, so no curl of it outlives it.
    local timeline=$work/timeline-$run.txt stop_flag=$work/stop-sampler-$run
    ( until [[ -e $stop_flag ]]; do
          echo "$(now_ms) $(redis_up) $(role_of "$replica")"
          sleep 0.1
      done ) >"$timeline" 2>/dev/null &
    local sampler=$!
    pids+=("$sampler")

    window 3 "$run" &
    local load=$!
    pids+=("$load")
    sleep "$KILL_AFTER"
    local killed_at
    killed_at=$(now_ms)
    stop_node "$victim"
    log "cluster run $run: killed primary :$victim"
    wait "$load" || die "phase 3 window failed"
    forget "$load"
    touch "$stop_flag"
    wait "$sampler" || true
    forget "$sampler"

    # Seconds after the kill at which: the replica answered ROLE as primary; the breaker gauge
    # first read 0; it read 1 again for good (sampled, so +-0.1 s).
    awk -v k="$killed_at" -v run="$run" -v victim="$victim" -v replica="$replica" -v route="$ROUTE" -v slot="$slot" '
        $1 >= k && promoted == "" && $3 == "master" { promoted = ($1 - k) / 1000 }
        $1 >= k && opened == "" && $2 == "0" { opened = ($1 - k) / 1000 }
        $1 >= k && $2 == "0" { closed = "" }
        $1 >= k && opened != "" && closed == "" && $2 == "1" { closed = ($1 - k) / 1000 }
        END {
            printf "run %s: route %s (slot %s) on primary :%s, killed %s s into the window; replica :%s primary after %s s; breaker open after %s s, closed for good after %s s\n",
                run, route, slot, victim, '"$KILL_AFTER"', replica,
                promoted == "" ? "never (in window)" : sprintf("%.1f", promoted),
                opened == "" ? "never (in window)" : sprintf("%.1f", opened),
                closed == "" ? "never (in window)" : sprintf("%.1f", closed)
        }' "$timeline" >>"$work/timelines.txt"

    stop "$PROXY_PID"
    for p in "${ports[@]}"; do [[ -z ${NODE_PID[$p]:-} ]] || stop_node "$p"; done
}

# --- main --------------------------------------------------------------------------------------

build_rev outage_latency --bin ratelimit-proxy --example demo_upstream
bin_dir=$build_dir/release
upstream_bin=$bin_dir/examples/demo_upstream
free_port; UPSTREAM_ADDR=127.0.0.1:$REPLY
start upstream "$upstream_bin" "$UPSTREAM_ADDR"
wait_until 10 "the upstream" curl -fsS -o /dev/null "http://$UPSTREAM_ADDR/"

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
: >"$work/results.tsv"
: >"$work/timelines.txt"
for run in $(seq 1 "$RUNS"); do
    standalone_run "$run"
    cluster_run "$run"
done

# --- report ------------------------------------------------------------------------------------

# One row per window: phase run rps p50 p99 p99.9 max (µs) non2xx socket_errors counters.
rows=$work/rows.tsv
while IFS=$'\t' read -r phase run result delta; do
    printf '%s\t%s' "$phase" "$run"
    for f in rps p50_us p99_us p999_us max_us non2xx socket_errors; do
        printf '\t%s' "$(grep -o "\b$f=[0-9]*" <<<"$result" | cut -d= -f2)"
    done
    printf '\t%s\n' "$delta"
done < <(sort -s -t$'\t' -k1,1 "$work/results.tsv") >"$rows"

per_run=$(awk -F'\t' '{ printf "| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %d | %d | %s |\n",
    $1, $2, $3, $4 / 1000, $5 / 1000, $6 / 1000, $7 / 1000, $8, $9, $10 }' "$rows")

# Medians per phase (the mean of the middle two for an even count); non-2xx and socket errors
# summed, since any of them at all is the finding.
medians=$(awk -F'\t' '
    function median(list,   v, n, i, j, t) {
        n = split(substr(list, 2), v, " ")
        for (i = 2; i <= n; i++)
            for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    !($1 in n) { order[++phases] = $1 }
    { n[$1]++; for (c = 3; c <= 7; c++) col[$1, c] = col[$1, c] " " $c; bad[$1] += $8; err[$1] += $9 }
    END {
        for (i = 1; i <= phases; i++) {
            p = order[i]
            printf "| %s | %d | %d | %.2f | %.2f | %.2f | %.2f | %d | %d |\n", p, n[p], median(col[p, 3]),
                median(col[p, 4]) / 1000, median(col[p, 5]) / 1000, median(col[p, 6]) / 1000,
                median(col[p, 7]) / 1000, bad[p], err[p]
            p99[p] = median(col[p, 5])
        }
        d = p99["2b"] - p99["1"]
        printf "\nTarget, p99 once the breaker is open within 1 ms of healthy (medians): 2b %.2f ms vs 1 %.2f ms, a difference of %+.2f ms: %s.\n",
            p99["2b"] / 1000, p99["1"] / 1000, d / 1000, d <= 1000 ? "met" : "missed"
    }' "$rows")

command="${overrides}bench/outage_latency.sh"
load="\`wrk -t1 -c$CONNECTIONS -d${DURATION}s\`"
if ((THINK_MS > 0)); then
    load+=", each connection pausing ${THINK_MS} ms between requests (wrk's delay())"
else
    load+=", closed loop at full speed"
fi
upstream_note='examples/demo_upstream (one write per response, TCP_NODELAY)'

mkdir -p "$(dirname "$out")"
cat >"$out" <<EOF
# Request latency through ratelimit-proxy during Redis outages

- date: $(date -u '+%Y-%m-%d %H:%M UTC')
- machine: $(nproc) CPUs, $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr); shared with other work (load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg))
- command: \`$command\` (from the repo root)
- measured: $measured
- $(redis-server --version | cut -d' ' -f1-3), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)
- upstream: $upstream_note
- load: $load; one route, \`key: route\`, a limit of 10^9 tokens refilled at 10^6/s (never
  binding), \`timeout_ms: $TIMEOUT_MS\`, \`on_redis_error: open\`; everything on loopback

Phases: **1** standalone Redis healthy; **2a** the same Redis SIGSTOPped just before the window
(the whole window, the breaker opening included); **2b** still paused, the next window, started
once \`ratelimit_redis_up\` read 0; **3** 3+3 Redis Cluster, the route's key in a slot of the
primary SIGKILLed ${KILL_AFTER} s into the window (cluster-node-timeout 1000,
cluster-replica-validity-factor 0). Latencies in ms. non-2xx is wrk's "Non-2xx or 3xx" (status
>= 400).

Medians over the runs:

| phase | runs | req/s | p50 | p99 | p99.9 | max | non-2xx (sum) | socket errors (sum) |
|---|---|---|---|---|---|---|---|---|
${medians}

Every window ("proxy counters": what the proxy's /metrics counted during the window, non-zero
increments only: the route's decisions by outcome, breaker transitions by the state entered,
store errors by kind):

| phase | run | req/s | p50 | p99 | p99.9 | max | non-2xx | socket errors | proxy counters |
|---|---|---|---|---|---|---|---|---|---|
${per_run}

Cluster failover timeline (sampled every 100 ms, so +-0.1 s; seconds after the kill):

$(sed 's/^/- /' "$work/timelines.txt")
EOF
cat "$out"
