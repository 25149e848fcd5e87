#!/usr/bin/env bash
# Throughput and latency of ratelimit-proxy side by side with nginx, on one machine, on loopback.
#
# Usage (from the repo root; about 20 minutes with the defaults, plus one release build):
#
#     bench/compare.sh
#
# What it reports (bench/results/compare.md, and compare-latency.png beside it):
#   1. closed-loop throughput and latency of every contender below at each of CONNECTIONS, with
#      each contender's own CPU per request, Redis round trips, commands and CPU per request;
#   2. latency at a fixed rate, half the peak of "proxy, Redis" at c=PACED_C, for the proxy with
#      and without limits, bare Pingora, nginx proxy_pass and nginx+Lua (oha -q, latency-corrected),
#      each beside a probe timing Redis round trips (bench/redis_rtt.py), and the plot;
#   3. Redis memory per bucket, and the proxy's resident memory at RSS_KEYS distinct clients of the
#      embedded store;
#   4. the performance targets, each with this run's figure and met / missed.
#
# Optional environment: CONNECTIONS (wrk -c values, default "16 64 256"), ROUNDS (default 2: see
# "Order" below), DURATION seconds per window (5), PACED_C (64), RTT_RATE (the probe's PINGs a
# second, 1000), RSS_KEYS (1000000; 0 skips),
# REDIS_KEYS (clients for the Redis memory figure, 100000), REV
# (commit to build, default HEAD, from a `git archive` snapshot so that uncommitted edits in the
# shared checkout neither break the build nor slip into the numbers; REV=worktree builds the
# checkout as it is), BASELINE (another commit, built the same way: its proxy runs beside REV's on the
# same Redis and upstream, as the contenders "baseline: proxy, no limits", "baseline: proxy, Redis"
# and "baseline: proxy, Redis, hot key", so that two commits are compared within one run),
# STATE_FORMAT (how REV's proxies and the nginx+Lua contender store buckets: `packed_ttl`, the
# default, `packed` or `hash`; a REV or BASELINE that predates a format writes the newest one it
# knows (packed, else hash), and nginx+Lua then uses REV's, so that both run the same script on
# the same format),
# BASELINE_FORMAT (the baseline's, default STATE_FORMAT: `BASELINE=HEAD BASELINE_FORMAT=hash`
# compares the two formats with the same code in one run),
# KEEP_TMP=1 (keep the temp dir: configs, logs, raw output), ONLY (an extended
# regex: run only the contenders whose names match, e.g. ONLY='proxy_pass|proxy, no' while
# iterating), OUT (default bench/results/compare.md). The Markdown report is printed too.
#
# Needs git, cargo, redis-server, redis-cli, wrk, curl, ss, python3, gnuplot, and nginx with the Lua
# module; on Debian whatever is missing is installed with apt-get first (nginx-light
# libnginx-mod-http-lua wrk redis-server gnuplot-nox ...), and oha with `cargo install`. The system
# nginx and its config are never used: each nginx here runs in the foreground with a config and
# prefix in the temp dir. Everything listens on 127.0.0.1, on free ports in 20000-31999 (never 80
# or 6379), and every process the script starts is killed on exit.
#
# Contenders (all behind one upstream, an nginx answering `return 200` with one worker):
#   upstream            wrk straight at the upstream: the ceiling
#   nginx proxy_pass    nginx (as many workers as CPUs, like the proxy's threads), upstream keepalive
#   bare Pingora        examples/bare_pingora.rs: Pingora forwarding and nothing else, same profile
#   bare Pingora, per thread  the same as one single-threaded service per CPU, each on its own
#                       SO_REUSEPORT socket (PER_THREAD=1): how the proxy runs its cleartext listeners
#   bare Pingora, refusing  the same per thread, answering every request 429 from request_filter:
#                       Pingora's floor under the hot key's cached denials
#   nginx limit_req     the same plus limit_req keyed by X-Api-Key, a rate never reached
#   nginx limit_req hot the same, one hot key at 100 r/s: nearly every request rejected (429)
#   nginx+Lua EVALSHA   access_by_lua: EVALSHA of lua/token_bucket.lua per request, pooled
#                       connections (bench/compare/redis_bucket.lua; Debian has no lua-resty-redis)
#   nginx+Lua hot       the same, one hot key at capacity 100, 100/s: nearly every request rejected
#   proxy no limits     ratelimit-proxy, a route without limits
#   proxy Redis         a limit keyed by X-Api-Key, never binding, 10,000 keys: one decision each,
#                       batched with the others waiting for the same round trip
#   proxy Redis hot     one hot key at capacity 100, 100/s: nearly all rejected, mostly from the
#                       deny cache (always on with Redis)
#   proxy memory        the 10,000-key limit in the embedded in-memory store
#   ... Redis paused    the 10,000-key limit on a second Redis, SIGSTOPped after the warm-up, behind
#                       nginx+Lua and behind the proxy (fail-open, 25 ms timeout, its breaker)
#   ..., TLS            nginx proxy_pass and nginx+Lua, and the proxy without limits and with Redis,
#                       each terminating TLS with the same certificate (wrk over HTTPS, keep-alive)
# wrk sends every request with an X-Api-Key drawn from 10,000 keys (or the one hot key), to every
# contender alike, so the client's cost is the same in every row.
#
# Order: within a round the contenders run forward then backward (A B C ... C B A), so slow drift
# in the shared machine's load falls evenly on all of them; ROUNDS such rounds per concurrency.

set -euo pipefail

overrides=""
for v in REV BASELINE STATE_FORMAT BASELINE_FORMAT CONNECTIONS ROUNDS DURATION PACED_C RSS_KEYS REDIS_KEYS ONLY OUT; do [[ -n ${!v:-} ]] && overrides+="$v=$(printf %q "${!v}") "; done

CONNECTIONS=${CONNECTIONS:-16 64 256}
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-5}
REV=${REV:-HEAD}
HOT_KEYS=1
MANY_KEYS=10000

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
out=${OUT:-bench/results/compare.md}
wrk_lua=$repo/bench/compare/wrk.lua
target_dir=${CARGO_TARGET_DIR:-$repo/target}

die() { echo "compare: $*" >&2; exit 1; }
log() { echo "[$(date +%T)] $*" >&2; }

# On Debian, what is missing is installed first (and said so), as scripts/test does.
nginx_modules=/usr/share/nginx/modules
missing=()
for pair in cmake:cmake redis-server:redis-server redis-cli:redis-tools wrk:wrk nginx:nginx-light \
    gnuplot:gnuplot-nox curl:curl ss:iproute2 python3:python3 openssl:openssl; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
[[ -f $nginx_modules/ngx_http_lua_module.so ]] || missing+=(libnginx-mod-http-lua)
if ((${#missing[@]})) && command -v apt-get >/dev/null; then
    log "installing ${missing[*]} with apt-get"
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    # Debian starts the packaged nginx on port 80; this script never uses it.
    ! command -v systemctl >/dev/null || $sudo systemctl disable --now nginx >/dev/null 2>&1 || true
fi
for tool in git tar cargo redis-server redis-cli wrk curl ss nginx python3 gnuplot; do
    command -v "$tool" >/dev/null || die "needs $tool on PATH (Debian: apt-get install -y nginx-light libnginx-mod-http-lua wrk redis-server gnuplot-nox)"
done
# oha: the fixed-rate load (wrk is closed-loop only); from crates.io, once.
if ! command -v oha >/dev/null; then
    log "installing oha (fixed-rate load generator) with cargo install, once ..."
    cargo install --locked oha >"${TMPDIR:-/tmp}/oha-install.log" 2>&1 || die "cargo install oha failed: see ${TMPDIR:-/tmp}/oha-install.log"
    export PATH=$HOME/.cargo/bin:$PATH
fi
[[ -f $nginx_modules/ngx_http_lua_module.so ]] || die "needs the nginx Lua module (apt-get install -y libnginx-mod-http-lua)"

work=$(mktemp -d "${TMPDIR:-/tmp}/compare.XXXXXX")
pids=()

cleanup() {
    local status=$? p
    for p in "${pids[@]}"; do
        # An nginx master killed outright leaves its workers running, orphaned: them first.
        pkill -KILL -P "$p" 2>/dev/null || true
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    if [[ $status -ne 0 || ${KEEP_TMP:-} == 1 ]]; then
        echo "compare: logs and configs kept in $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

# start NAME CMD...: runs CMD in the background, output to $work/NAME.log.
start() {
    local name=$1; shift
    "$@" >"$work/$name.log" 2>&1 </dev/null &
    pids+=("$!")
    echo "$!" >"$work/$name.pid"
}

# --- build -------------------------------------------------------------------------------------

build_rev compare --bin ratelimit-proxy --example bare_pingora
# A private copy: another build in the same target dir may replace the binary mid-run.
cp "$build_dir/release/ratelimit-proxy" "$work/ratelimit-proxy"
cp "$build_dir/release/examples/bare_pingora" "$work/bare_pingora"
proxy_bin=$work/ratelimit-proxy
if [[ -n ${BASELINE:-} ]]; then
    rev_measured=$measured
    REV=$BASELINE build_rev baseline --bin ratelimit-proxy
    cp "$build_dir/release/ratelimit-proxy" "$work/ratelimit-proxy-baseline"
    measured="$rev_measured; baseline: $measured"
fi

# How buckets are stored: `redis.state_format` where the binary knows it (see STATE_FORMAT above).
STATE_FORMAT=${STATE_FORMAT:-packed_ttl}
# format_for BINARY FORMAT: sets REPLY to FORMAT if BINARY knows it, else to the newest format
# before it that BINARY knows (packed, then hash, which every version writes).
format_for() {
    local format candidates=$2
    case $2 in
        packed_ttl) candidates="packed_ttl packed hash" ;;
        packed) candidates="packed hash" ;;
    esac
    for format in $candidates; do
        printf 'listen: "127.0.0.1:1"\nredis:\n  url: "redis://127.0.0.1:1"\n  state_format: %s\nroutes:\n  - { name: probe, upstream: "127.0.0.1:1" }\n' \
            "$format" >"$work/format-probe.yaml"
        if [[ $format == hash ]] || "$1" --config "$work/format-probe.yaml" --check >/dev/null 2>&1; then
            REPLY=$format
            return
        fi
    done
}
# The config line choosing a format; none for hash, so that versions before the key still start.
format_line() { [[ $1 == hash ]] || printf '\n  state_format: %s' "$1"; }
format_for "$proxy_bin" "$STATE_FORMAT"
STATE_FORMAT=$REPLY
rev_format=$(format_line "$STATE_FORMAT")
base_format=
if [[ -n ${BASELINE:-} ]]; then
    format_for "$work/ratelimit-proxy-baseline" "${BASELINE_FORMAT:-$STATE_FORMAT}"
    BASELINE_FORMAT=$REPLY
    base_format=$(format_line "$BASELINE_FORMAT")
fi
said="buckets stored as: $STATE_FORMAT by REV and nginx+Lua"
[[ -z ${BASELINE:-} ]] || said+=", $BASELINE_FORMAT by the baseline"
log "$said"

# --- Redis ---------------------------------------------------------------------------------------

free_port; REDIS_PORT=$REPLY
start redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" --logfile "$work/redis.server.log"
wait_until 10 "redis on $REDIS_PORT" redis-cli -p "$REDIS_PORT" PING
# The same script the proxy loads; its SHA is what nginx+Lua calls.
SHA=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat lua/token_bucket.lua)")

# A second Redis, SIGSTOPped once everything is warm: the "Redis paused" scenario.
free_port; PAUSED_PORT=$REPLY
start redis-paused redis-server --port "$PAUSED_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" --logfile "$work/redis-paused.server.log"
wait_until 10 "redis on $PAUSED_PORT" redis-cli -p "$PAUSED_PORT" PING
redis-cli -p "$PAUSED_PORT" SCRIPT LOAD "$(cat lua/token_bucket.lua)" >/dev/null

# CPU seconds Redis has used (INFO cpu: user + sys, microsecond resolution).
redis_cpu() {
    redis-cli -p "$REDIS_PORT" INFO cpu | tr -d '\r' | awk -F: '$1 == "used_cpu_user" || $1 == "used_cpu_sys" { t += $2 } END { printf "%.6f\n", t }'
}

# CPU clock ticks used by every thread of the given processes (utime + stime).
proc_ticks() {
    local p t=0 f
    for p in "$@"; do
        for f in /proc/"$p"/task/*/stat; do
            [[ -r $f ]] || continue
            t=$((t + $(sed 's/.*) //' "$f" | awk '{ print $12 + $13 }')))
        done
    done
    echo "$t"
}
TICK=$(getconf CLK_TCK)

# Calls of every command but INFO itself, summed over INFO commandstats; and EVALSHA + EVAL.
redis_calls() {
    redis-cli -p "$REDIS_PORT" INFO commandstats | tr -d '\r' | awk -F'[:=,]' '
        /^cmdstat_/ && $1 != "cmdstat_info" { all += $3 }
        $1 == "cmdstat_evalsha" || $1 == "cmdstat_eval" { ev += $3 }
        END { print all + 0, ev + 0 }'
}

# Calls of the script and the microseconds Redis spent running them (EVALSHA + EVAL).
redis_script_time() {
    redis-cli -p "$REDIS_PORT" INFO commandstats | tr -d '\r' | awk -F'[:=,]' '
        $1 == "cmdstat_evalsha" || $1 == "cmdstat_eval" { calls += $3; usec += $5 }
        END { print calls + 0, usec + 0 }'
}

# --- one certificate for both TLS terminators ----------------------------------------------------

# Self-signed for 127.0.0.1, RSA 2048 (what most sites still serve); wrk does not verify it.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$work/tls.key" -out "$work/tls.crt" 2>/dev/null ||
    die "openssl could not make the benchmark's certificate"

# --- nginx: the upstream and the contender -------------------------------------------------------

# nginx_conf PREFIX WORKERS HTTP_BODY: a complete config whose paths all stay inside PREFIX. The
# temp paths are set because the compiled-in ones point into /var/lib/nginx.
nginx_conf() {
    local prefix=$1 workers=$2 body=$3
    mkdir -p "$prefix/logs"
    cat <<EOF
load_module $nginx_modules/ndk_http_module.so;
load_module $nginx_modules/ngx_http_lua_module.so;
worker_processes $workers;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $prefix/client_body;
    proxy_temp_path $prefix/proxy;
    fastcgi_temp_path $prefix/fastcgi;
    # Keep-alive without a request cap, like the proxy: nginx's default (1000) would make wrk
    # reconnect every 1000 requests and put connection setup into nginx's numbers only.
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
$body
}
EOF
}

start_nginx() { # start_nginx NAME CONF_BODY (writes $work/NAME/nginx.conf, checks it, starts it)
    local name=$1 prefix=$work/$1
    mkdir -p "$prefix"
    nginx_conf "$prefix" "$2" "$3" >"$prefix/nginx.conf"
    nginx -p "$prefix" -c "$prefix/nginx.conf" -t >"$work/$name.check.log" 2>&1 ||
        die "nginx config $prefix/nginx.conf: $(cat "$work/$name.check.log")"
    start "$name" nginx -p "$prefix" -c "$prefix/nginx.conf" -g 'daemon off;'
}

free_port; UPSTREAM=127.0.0.1:$REPLY
# One worker: the upstream must be cheap and fast, but not take a whole second core from the
# contenders on a 2-core machine.
start_nginx upstream 1 "    server {
        listen $UPSTREAM backlog=4096;
        location / { default_type text/plain; return 200 \"ok\n\"; }
    }"

# lua_location PATH KEY ARGS: a location that takes the request's token from the bucket KEY (a
# Lua expression) by EVALSHA, ARGS being capacity, scale, num, cost [, Redis port], and proxies it
# when allowed, as the proxy's limit does.
lua_location() {
    cat <<EOF
        location $1 {
            access_by_lua_block {
                if not require('redis_bucket').allowed($2, $3) then
                    return ngx.exit(429)
                end
            }
            proxy_pass http://up;
        }
EOF
}

free_port; NGINX=127.0.0.1:$REPLY
free_port; NGINX_TLS=127.0.0.1:$REPLY
workers=$(nproc) # the proxy runs one thread per CPU
start_nginx contender "$workers" "
    lua_package_path '$repo/bench/compare/?.lua;;';
    init_by_lua_block {
        require('redis_bucket').init('127.0.0.1', $REDIS_PORT, '$SHA', '$repo/lua/token_bucket.lua', '$STATE_FORMAT')
    }
    upstream up {
        server $UPSTREAM;
        keepalive 256;
        keepalive_requests 1000000000;
    }
    limit_req_zone \$http_x_api_key zone=keys:16m rate=100000r/s;
    limit_req_zone \$http_x_api_key zone=hot:1m rate=100r/s;
    limit_req_status 429;
    # Below error_log's level: nginx would otherwise write a log line per rejection, which the
    # proxy does not do.
    limit_req_log_level info;
    server {
        listen $NGINX backlog=4096;
        proxy_http_version 1.1;
        proxy_set_header Connection '';
        location /proxy/ { proxy_pass http://up; }
        location /lr/ { limit_req zone=keys burst=1000 nodelay; proxy_pass http://up; }
        location /lrhot/ { limit_req zone=hot burst=100 nodelay; proxy_pass http://up; }
        # The same buckets as the proxy's: key in the proxy's shape, Redis TIME (ARGV[1] empty),
        # capacity 10^9 at 10^6/s (scale 1, num 1) or capacity 100 at 100/s (scale 10^4, num 1).
$(lua_location /lua/ "'rl:{ngx:' .. (ngx.var.http_x_api_key or '') .. '}:per_key'" "1000000000, 1, 1, 1")
$(lua_location /luapaused/ "'rl:{ngx:' .. (ngx.var.http_x_api_key or '') .. '}:per_key'" "1000000000, 1, 1, 1, $PAUSED_PORT")
$(lua_location /luahot/ "'rl:{ngxhot:' .. (ngx.var.http_x_api_key or '') .. '}:hot'" "100, 10000, 1, 1")
    }
    # HTTPS: the same locations behind TLS (TLS 1.2 and 1.3, nginx's default ciphers), HTTP/1.1
    # with keep-alive as wrk speaks it.
    server {
        listen $NGINX_TLS ssl backlog=4096;
        ssl_certificate $work/tls.crt;
        ssl_certificate_key $work/tls.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        proxy_http_version 1.1;
        proxy_set_header Connection '';
        location /proxy/ { proxy_pass http://up; }
$(lua_location /lua/ "'rl:{ngx:' .. (ngx.var.http_x_api_key or '') .. '}:per_key'" "1000000000, 1, 1, 1")
    }"

# --- the proxies -------------------------------------------------------------------------------

# start_proxy NAME YAML_HEAD ROUTES [BINARY]: sets REPLY to its listen address (BINARY: REV's by
# default). With TLS_LISTEN set, the proxy also terminates TLS there, with the benchmark's certificate.
start_proxy() {
    local name=$1 head=$2 routes=$3
    free_port; local listen=127.0.0.1:$REPLY
    free_port; local admin=127.0.0.1:$REPLY
    local conf=$work/$name.yaml listens="\"$listen\""
    [[ -z ${TLS_LISTEN:-} ]] ||
        listens+=", { address: \"$TLS_LISTEN\", tls: { cert_file: \"$work/tls.crt\", key_file: \"$work/tls.key\" } }"
    printf 'listen: [%s]\nadmin: "%s"\nshutdown_grace_seconds: 0\n%s\nroutes:\n%s\n' \
        "$listens" "$admin" "$head" "$routes" >"$conf"
    local bin=${4:-$proxy_bin}
    "$bin" --config "$conf" --check >/dev/null || die "invalid config $conf"
    RUST_LOG=warn start "$name" "$bin" --config "$conf" --upgrade-sock "$work/$name-upgrade.sock"
    ADMIN=$admin
    REPLY=$listen
}

# Never binding: 10^9 tokens refilled at 10^6/s; the hot route: 100 tokens at 100/s.
keyed_limit='    limits:
      - name: per_key
        capacity: 1000000000
        refill: "1000000/s"
        key: "header:X-Api-Key"'
# /seq/: a bucket per ?k= client that stays (a full bucket is forgotten, in Redis and in memory, and 1
# token an hour keeps these from refilling), for the memory figures at REDIS_KEYS and RSS_KEYS clients.
seq_route="  - name: seq
    match: { path_prefix: /seq/ }
    upstream: \"$UPSTREAM\"
    limits:
      - name: per_client
        capacity: 100
        refill: \"1/h\"
        key: \"query:k\""
redis_routes="  - name: free
    match: { path_prefix: /free/ }
    upstream: \"$UPSTREAM\"
$seq_route
  - name: hot
    match: { path_prefix: /hot/ }
    upstream: \"$UPSTREAM\"
    limits:
      - name: hot
        capacity: 100
        refill: \"100/s\"
        key: \"header:X-Api-Key\"
  - name: keyed
    upstream: \"$UPSTREAM\"
$keyed_limit"
free_port; PROXY_TLS=127.0.0.1:$REPLY
TLS_LISTEN=$PROXY_TLS start_proxy proxy-redis "redis:
  url: \"redis://127.0.0.1:$REDIS_PORT/0\"
  timeout_ms: 25$rev_format
on_redis_error: open" "$redis_routes"
PROXY=$REPLY PROXY_ADMIN=$ADMIN
if [[ -n ${BASELINE:-} ]]; then
    # Its own key prefix: the two proxies' buckets stay apart on the shared Redis.
    start_proxy proxy-baseline "redis:
  url: \"redis://127.0.0.1:$REDIS_PORT/0\"
  timeout_ms: 25
  key_prefix: base$base_format
on_redis_error: open" "$redis_routes" "$work/ratelimit-proxy-baseline"
    PROXY_BASE=$REPLY
fi
start_proxy proxy-memory "" "$seq_route
  - name: keyed
    upstream: \"$UPSTREAM\"
$keyed_limit"
PROXY_MEM=$REPLY
start_proxy proxy-paused "redis:
  url: \"redis://127.0.0.1:$PAUSED_PORT/0\"
  timeout_ms: 25$rev_format
on_redis_error: open" "  - name: keyed
    upstream: \"$UPSTREAM\"
$keyed_limit"
PROXY_PAUSED=$REPLY PAUSED_ADMIN=$ADMIN
# Pingora and nothing else (examples/bare_pingora.rs): the floor the proxy's forwarding stands on.
free_port; BARE=127.0.0.1:$REPLY
start bare-pingora "$work/bare_pingora" "$BARE" "$UPSTREAM"
free_port; BARE_PER_THREAD=127.0.0.1:$REPLY
PER_THREAD=1 start bare-pingora-per-thread "$work/bare_pingora" "$BARE_PER_THREAD" "$UPSTREAM"
free_port; BARE_REFUSING=127.0.0.1:$REPLY
PER_THREAD=1 start bare-pingora-refusing "$work/bare_pingora" "$BARE_REFUSING" "$UPSTREAM" refuse

# The processes whose CPU a contender's row reports.
pids_of() { # pids_of NAME: the nginx's master and workers, or the proxy
    case $1 in
    upstream | contender) local m; m=$(cat "$work/$1/nginx.pid"); echo "$m $(pgrep -P "$m" | tr '\n' ' ')" ;;
    *) cat "$work/$1.pid" ;;
    esac
}

# name|url|keys|uses Redis (1: commands per decision are counted)|whose CPU
contenders=(
    "upstream|http://$UPSTREAM/|$MANY_KEYS|0|upstream"
    "nginx proxy_pass|http://$NGINX/proxy/|$MANY_KEYS|0|contender"
    "nginx limit_req|http://$NGINX/lr/|$MANY_KEYS|0|contender"
    "nginx limit_req, hot key|http://$NGINX/lrhot/|$HOT_KEYS|0|contender"
    "nginx+Lua EVALSHA|http://$NGINX/lua/|$MANY_KEYS|1|contender"
    "nginx+Lua EVALSHA, hot key|http://$NGINX/luahot/|$HOT_KEYS|1|contender"
    "nginx+Lua EVALSHA, Redis paused|http://$NGINX/luapaused/|$MANY_KEYS|0|contender"
    "bare Pingora|http://$BARE/|$MANY_KEYS|0|bare-pingora"
    "bare Pingora, per thread|http://$BARE_PER_THREAD/|$MANY_KEYS|0|bare-pingora-per-thread"
    "bare Pingora, refusing|http://$BARE_REFUSING/|$HOT_KEYS|0|bare-pingora-refusing"
    "proxy, no limits|http://$PROXY/free/|$MANY_KEYS|0|proxy-redis"
    "proxy, Redis|http://$PROXY/|$MANY_KEYS|1|proxy-redis"
    "proxy, Redis, hot key|http://$PROXY/hot/|$HOT_KEYS|1|proxy-redis"
    "proxy, Redis paused|http://$PROXY_PAUSED/|$MANY_KEYS|0|proxy-paused"
    "proxy, memory|http://$PROXY_MEM/|$MANY_KEYS|0|proxy-memory"
    "nginx proxy_pass, TLS|https://$NGINX_TLS/proxy/|$MANY_KEYS|0|contender"
    "proxy, no limits, TLS|https://$PROXY_TLS/free/|$MANY_KEYS|0|proxy-redis"
    "nginx+Lua EVALSHA, TLS|https://$NGINX_TLS/lua/|$MANY_KEYS|1|contender"
    "proxy, Redis, TLS|https://$PROXY_TLS/|$MANY_KEYS|1|proxy-redis"
)
if [[ -n ${BASELINE:-} ]]; then
    contenders+=(
        "baseline: proxy, no limits|http://$PROXY_BASE/free/|$MANY_KEYS|0|proxy-baseline"
        "baseline: proxy, Redis|http://$PROXY_BASE/|$MANY_KEYS|1|proxy-baseline"
        "baseline: proxy, Redis, hot key|http://$PROXY_BASE/hot/|$HOT_KEYS|1|proxy-baseline"
    )
fi

if [[ -n ${ONLY:-} ]]; then
    chosen=()
    for c in "${contenders[@]}"; do [[ ${c%%|*} =~ $ONLY ]] && chosen+=("$c"); done
    ((${#chosen[@]})) || die "ONLY=$ONLY matches no contender"
    contenders=("${chosen[@]}")
fi

serves() { # serves URL: answers 2xx, or 429 (the refusing contender answers nothing else)
    local code
    code=$(curl -sSk -o /dev/null -w '%{http_code}' "$1")
    [[ $code == 2?? || $code == 429 ]]
}
for c in "${contenders[@]}"; do
    IFS='|' read -r name url _ _ <<<"$c"
    wait_until 20 "$name to serve" serves "$url"
done

# Connection pools filled, keys created in Redis and memory, code paths warm: 1 s each.
log "warming up"
for c in "${contenders[@]}"; do
    IFS='|' read -r name url keys _ <<<"$c"
    KEYS=$keys wrk -t1 -c64 -d1s -s "$wrk_lua" "$url" >/dev/null
done
kill -STOP "$(cat "$work/redis-paused.pid")"
log "paused the second Redis (pid $(cat "$work/redis-paused.pid"))"

# --- the windows -------------------------------------------------------------------------------

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
results=$work/results.tsv
: >"$results"

window() { # window CONNECTIONS CONTENDER_LINE: appends "c name rps p50 p99 non2xx errors requests cmds evals redis cpu_ticks redis_cpu_s"
    local conns=$1 name url keys redis owner before after result owner_pids t0 t1 r0 r1
    IFS='|' read -r name url keys redis owner <<<"$2"
    owner_pids=$(pids_of "$owner")
    before=$(redis_calls)
    t0=$(proc_ticks $owner_pids) r0=$(redis_cpu)
    KEYS=$keys wrk -t1 -c"$conns" -d"${DURATION}s" --timeout 2s -s "$wrk_lua" "$url" >"$work/wrk.txt"
    t1=$(proc_ticks $owner_pids) r1=$(redis_cpu)
    after=$(redis_calls)
    result=$(grep '^RESULT ' "$work/wrk.txt") || die "no RESULT from wrk ($name): $(cat "$work/wrk.txt")"
    cat "$work/wrk.txt" >>"$work/wrk-all.txt"
    local f vals=()
    for f in rps p50_us p99_us non2xx socket_errors requests; do
        vals+=("$(grep -o "\b$f=[0-9]*" <<<"$result" | cut -d= -f2)")
    done
    read -r b_all b_ev <<<"$before"
    read -r a_all a_ev <<<"$after"
    # Other contenders' Redis use is not in this window; for contenders without Redis the delta
    # is 0 (minus the INFO calls excluded), which checks that nothing else talks to this Redis.
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$conns" "$name" "${vals[@]}" \
        $((a_all - b_all)) $((a_ev - b_ev)) "$redis" $((t1 - t0)) "$(awk -v a="$r0" -v b="$r1" 'BEGIN { printf "%.6f", b - a }')" >>"$results"
    log "c=$conns $name: ${result#RESULT }"
}

for conns in $CONNECTIONS; do
    for round in $(seq 1 "$ROUNDS"); do
        for c in "${contenders[@]}"; do window "$conns" "$c"; done
        for ((i = ${#contenders[@]} - 1; i >= 0; i--)); do window "$conns" "${contenders[i]}"; done
    done
done

# Median of the space-separated numbers in `list` (after a leading space): the mean of the middle two
# for an even count. Prepended to the awk programs below.
awk_median='
    function median(list,   v, n, i, j, t) {
        n = split(substr(list, 2), v, " ")
        for (i = 2; i <= n; i++)
            for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }'

# --- fixed rate: latency at half of peak ---------------------------------------------------------

# Closed-loop latency at saturation is queueing, not the check: here every contender of a pair
# gets the same offered rate, half the peak of the slower one ("proxy, Redis" at c=PACED_C), from
# oha with latency correction (a late response counts from when its request was due).
PACED_C=${PACED_C:-64}
paced_contenders=()
for c in "${contenders[@]}"; do
    case ${c%%|*} in "nginx proxy_pass" | "nginx+Lua EVALSHA" | "bare Pingora" | "proxy, no limits" | "proxy, Redis" | \
        "baseline: proxy, no limits" | "baseline: proxy, Redis") paced_contenders+=("$c") ;; esac
done
peak=$(awk -F'\t' -v c="$PACED_C" '$1 == c && $2 == "proxy, Redis" { print $3 }' "$results" | sort -n |
    awk '{ v[NR] = $1 } END { if (NR) print int((NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)) }')
paced=$work/paced.tsv
: >"$paced"
rate=0
if [[ -n $peak && ${#paced_contenders[@]} -gt 0 ]]; then
    rate=$((peak / 2))
    # Beside every window, PINGs to the Redis at RTT_RATE/s: what one Redis round trip costs on
    # this box at this load (the same small extra load for every contender).
    RTT_RATE=${RTT_RATE:-1000}
    # paced_window CONTENDER_LINE: appends "name rps p50 p90 p99 p99.9 success ping_p50 ping_p90
    # ping_p99 ping_p99.9 script_calls script_usec" (latencies in seconds)
    paced_window() {
        local name url probe script_before script_after
        IFS='|' read -r name url _ <<<"$1"
        script_before=$(redis_script_time)
        python3 bench/redis_rtt.py "$REDIS_PORT" "$DURATION" "$RTT_RATE" >"$work/rtt.out" 2>&1 &
        probe=$!
        oha -z "${DURATION}s" -q "$rate" -c "$PACED_C" --latency-correction --no-tui --output-format json \
            -H "X-Api-Key: k1" "$url" >"$work/oha.json" 2>"$work/oha.err" ||
            die "oha failed on $name: $(cat "$work/oha.err")"
        wait "$probe" || die "the Redis round-trip probe failed: $(cat "$work/rtt.out")"
        script_after=$(redis_script_time)
        python3 - "$name" "$work/oha.json" "$work/rtt.out" "$script_before" "$script_after" >>"$paced" <<'PY'
import json, sys
d = json.load(open(sys.argv[2]))
p, s = d["latencyPercentiles"], d["summary"]
ping = open(sys.argv[3]).read().split()[:4]
before, after = (list(map(int, a.split())) for a in sys.argv[4:6])
script = [str(after[0] - before[0]), str(after[1] - before[1])]
print("\t".join([sys.argv[1], "%.0f" % s["requestsPerSec"]] + ["%.6f" % (p[k] or 0) for k in ("p50", "p90", "p99", "p99.9")] + ["%.4f" % s["successRate"]] + ping + script))
PY
        log "paced $rate/s $name: $(tail -1 "$paced" | cut -f2-)"
    }
    for round in $(seq 1 "$ROUNDS"); do
        for c in "${paced_contenders[@]}"; do paced_window "$c"; done
        for ((i = ${#paced_contenders[@]} - 1; i >= 0; i--)); do paced_window "${paced_contenders[i]}"; done
    done
fi

# --- memory ----------------------------------------------------------------------------------------

# Redis, per bucket: REDIS_KEYS distinct clients through the proxy's query-keyed /seq/ route, whose
# buckets (1 token an hour) outlive the measurement; the keyed contenders' buckets refill at once
# and expire a second later, so they are gone by now.
REDIS_KEYS=${REDIS_KEYS:-100000}
redis_used() { redis-cli -p "$REDIS_PORT" INFO memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }'; }
redis_keys_before=$(redis-cli -p "$REDIS_PORT" DBSIZE) redis_mem_before=$(redis_used)
oha -n "$REDIS_KEYS" -c 64 --no-tui --output-format quiet --rand-regex-url "http://$PROXY/seq/\?k=[a-z]{16}" \
    >"$work/oha-redis-keys.log" 2>&1 || die "oha failed: $(cat "$work/oha-redis-keys.log")"
redis_keys=$(($(redis-cli -p "$REDIS_PORT" DBSIZE) - redis_keys_before)) redis_mem_after=$(redis_used)
sample_key=$(redis-cli -p "$REDIS_PORT" --scan --pattern 'rl:{seq:*' | head -1) || true
sample_usage=$(redis-cli -p "$REDIS_PORT" MEMORY USAGE "$sample_key")

# The embedded store: the proxy's resident memory before and after RSS_KEYS distinct clients.
RSS_KEYS=${RSS_KEYS:-1000000}
rss_kib() { awk '$1 == "VmRSS:" { print $2 }' "/proc/$(cat "$work/proxy-memory.pid")/status"; }
rss_before=$(rss_kib)
rss_after=$rss_before
if ((RSS_KEYS > 0)); then
    log "driving $RSS_KEYS distinct keys through the embedded store ..."
    # Random 16-letter clients (?k=): a million draws from 26^16 repeat none in practice.
    oha -n "$RSS_KEYS" -c 64 --no-tui --output-format quiet --rand-regex-url "http://$PROXY_MEM/seq/\?k=[a-z]{16}" \
        >"$work/oha-rss.log" 2>&1 || die "oha failed: $(cat "$work/oha-rss.log")"
    rss_after=$(rss_kib)
fi

# --- report --------------------------------------------------------------------------------------

# Per concurrency and contender, in the contenders' order: median req/s (the mean of the middle
# two for an even count) and min-max, median p50/p99, share of non-2xx, socket errors (sum), Redis
# commands per request, and req/s against nginx proxy_pass and nginx+Lua.
table=$(awk -F'\t' "$awk_median"'
    {
        k = $1 SUBSEP $2
        if (!(k in n)) { order[++rows] = k; conns[k] = $1; name[k] = $2 }
        n[k]++
        rps[k] = rps[k] " " $3; p50[k] = p50[k] " " $4; p99[k] = p99[k] " " $5
        if (!(k in lo) || $3 < lo[k]) lo[k] = $3
        if ($3 > hi[k]) hi[k] = $3
        bad[k] += $6; err[k] += $7; req[k] += $8; cmds[k] += $9; evals[k] += $10; redis[k] = $11
        ticks[k] += $12; rcpu[k] += $13
    }
    END {
        for (i = 1; i <= rows; i++) { k = order[i]; med[k] = median(rps[k]) }
        for (i = 1; i <= rows; i++) {
            k = order[i]
            base = med[conns[k] SUBSEP "nginx proxy_pass"]; lua = med[conns[k] SUBSEP "nginx+Lua EVALSHA"]
            per = redis[k] ? sprintf("%.3f | %.2f | %.1f", evals[k] / req[k], cmds[k] / req[k], 1e6 * rcpu[k] / req[k]) : "– | – | –"
            printf "| %s | %s | %d | %d–%d | %.2f | %.2f | %.1f %% | %d | %.1f | %s | %.2f | %.2f |\n",
                conns[k], name[k], med[k], lo[k], hi[k], median(p50[k]) / 1000, median(p99[k]) / 1000,
                100 * bad[k] / req[k], err[k], 1e6 * ticks[k] / tick / req[k], per,
                base ? med[k] / base : 0, lua ? med[k] / lua : 0
        }
    }' tick="$TICK" "$results")

per_window=$(awk -F'\t' '{ printf "| %s | %s | %d | %.2f | %.2f | %d | %d | %d |\n", $1, $2, $3, $4 / 1000, $5 / 1000, $6, $7, $10 }' "$results")

# nginx+Lua fails open on a Redis error, as the proxy does; each one is logged, so count them.
lua_failures=$(grep -c 'redis' "$work/contender/logs/error.log" || true)

# The Redis proxy's own count of its decisions over the whole run (warm-up included), by route and
# outcome: fail_open would mean Redis answered later than timeout_ms and the request went through
# unchecked.
proxy_decisions=$(curl -fsS "http://$PROXY_ADMIN/metrics" | awk '
    index($1, "ratelimit_decisions_total{") == 1 && $2 > 0 {
        match($1, /route="[^"]*"/); r = substr($1, RSTART + 7, RLENGTH - 8)
        match($1, /decision="[^"]*"/); d = substr($1, RSTART + 10, RLENGTH - 11)
        printf "%s%s %s=%d", sep, r, d, $2; sep = ", " }
    index($1, "ratelimit_deny_cache_hits_total{") == 1 && $2 > 0 { printf "%sdeny cache hits %d", sep, $2; sep = ", " }')

# Fixed-rate: medians over the windows, per contender (µs), and the pairs' differences.
paced_table=$(awk -F'\t' -v duration="$DURATION" "$awk_median"'
    {
        if (!($1 in n)) order[++rows] = $1
        n[$1]++; rps[$1] = rps[$1] " " $2
        for (f = 3; f <= 6; f++) lat[$1, f] = lat[$1, f] " " $f * 1e6
        if (!($1 in ok) || $7 < ok[$1]) ok[$1] = $7
        for (f = 8; f <= 11; f++) lat[$1, f] = lat[$1, f] " " $f * 1e6
        calls[$1] += $12; usec[$1] += $13; served[$1] += $2 * duration
    }
    END {
        for (i = 1; i <= rows; i++) {
            k = order[i]
            script = calls[k] ? sprintf("%.1f | %.1f", usec[k] / calls[k], served[k] / calls[k]) : "– | –"
            printf "| %s | %d | %d | %d | %d | %d | %d | %.2f %% | %d | %d | %s |\n", k, n[k], median(rps[k]),
                median(lat[k, 3]), median(lat[k, 4]), median(lat[k, 5]), median(lat[k, 6]), 100 * ok[k],
                median(lat[k, 8]), median(lat[k, 10]), script
            for (f = 3; f <= 10; f++) med[k, f] = median(lat[k, f])
        }
        # What bounds the check'"'"'s added latency: one Redis round trip at this load (PING) and the
        # script'"'"'s own time per call, while the proxy decides on Redis; what Pingora alone adds.
        if ("proxy, Redis" in n)
            printf "FLOOR\t%d\t%d\t%.1f\t%.1f\n", med["proxy, Redis", 8], med["proxy, Redis", 10],
                calls["proxy, Redis"] ? usec["proxy, Redis"] / calls["proxy, Redis"] : 0,
                calls["proxy, Redis"] ? served["proxy, Redis"] / calls["proxy, Redis"] : 0 > "/dev/stderr"
        if ("bare Pingora" in n && "nginx proxy_pass" in n)
            printf "PINGORA\t%d\t%d\t%d\t%d\n", med["bare Pingora", 3], med["bare Pingora", 5],
                med["nginx proxy_pass", 3], med["nginx proxy_pass", 5] > "/dev/stderr"
        # A difference only where both of its pair ran (empty otherwise: no target is judged).
        for (f = 3; f <= 6; f++) {
            ours = ("proxy, Redis" in n && "proxy, no limits" in n) ? int(med["proxy, Redis", f] - med["proxy, no limits", f]) : ""
            lua = ("nginx+Lua EVALSHA" in n && "nginx proxy_pass" in n) ? int(med["nginx+Lua EVALSHA", f] - med["nginx proxy_pass", f]) : ""
            printf "ADDED\t%s\t%s\t%s\n", f, ours, lua > "/dev/stderr"
        }
    }' "$paced" 2>"$work/added.tsv")
added() { awk -F'\t' -v f="$1" -v col="$2" '$1 == "ADDED" && $2 == f { print $col }' "$work/added.tsv"; }
# floor FIELD: the Redis round trip (PING p50, p99 µs), the script's µs per call, requests per call
floor() { awk -F'\t' -v col="$(($1 + 1))" '$1 == "FLOOR" { print $col }' "$work/added.tsv"; }
# pingora FIELD: bare Pingora p50, p99, nginx proxy_pass p50, p99 (µs) at the fixed rate
pingora() { awk -F'\t' -v col="$(($1 + 1))" '$1 == "PINGORA" { print $col }' "$work/added.tsv"; }

# The latency plot: percentiles of the fixed-rate runs, one line per contender.
plot=${out%.md}-latency.png
if [[ -s $paced ]]; then
    awk -F'\t' "$awk_median"'
        { if (!($1 in seen)) { seen[$1] = 1; order[++rows] = $1 } for (f = 3; f <= 6; f++) lat[$1, f] = lat[$1, f] " " $f * 1000 }
        END {
            split("p50 p90 p99 p99.9", label, " ")
            printf "percentile"; for (i = 1; i <= rows; i++) printf "\t\"%s\"", order[i]; print ""
            for (f = 3; f <= 6; f++) {
                printf "%s", label[f - 2]
                for (i = 1; i <= rows; i++) printf "\t%.4f", median(lat[order[i], f])
                print ""
            }
        }' "$paced" >"$work/plot.dat"
    series=$(head -1 "$work/plot.dat" | awk -F'\t' '{ print NF - 1 }')
    gnuplot <<EOF || die "gnuplot failed"
set terminal pngcairo size 900,540 noenhanced font "sans,10"
set output "$plot"
set title "ratelimit-proxy and nginx: latency at a fixed $rate req/s (c=$PACED_C), $(date -u +%Y-%m-%d)"
set ylabel "latency (ms), log scale"
set logscale y
set grid ytics
set key top left
set style data linespoints
set datafile separator "\t"
plot for [i=2:$((series + 1))] "$work/plot.dat" using i:xtic(1) title columnheader(i) lw 2 pt 7
EOF
fi

# Targets, from this run (issue 14's, and the earlier ones still held).
targets=$(awk -F'\t' -v added_p50="$(added 3 3)" -v added_p99="$(added 5 3)" -v c="$PACED_C" \
    -v ping_p50="$(floor 1)" -v ping_p99="$(floor 2)" -v script_call="$(floor 3)" -v per_call="$(floor 4)" \
    -v bare_p50="$(pingora 1)" -v bare_p99="$(pingora 2)" -v pass_p50="$(pingora 3)" -v pass_p99="$(pingora 4)" -v cpus="$(nproc)" -v tick="$TICK" "$awk_median"'
    { all[$1, $2] = all[$1, $2] " " $3; if (!($1 in seen)) { seen[$1] = 1; cs[++ncs] = $1 } }
    $1 == c { rps[$2] = rps[$2] " " $3; req[$2] += $8; bad[$2] += $6; evals[$2] += $10; windows[$2]++; ticks[$2] += $12; rcpu[$2] += $13 }
    function verdict(ok) { return ok ? "met" : "**missed**" }
    function cpu(k) { return req[k] ? 1e6 * ticks[k] / tick / req[k] : 0 }
    END {
        redis = median(rps["proxy, Redis"]); lua = median(rps["nginx+Lua EVALSHA"]); pass = median(rps["nginx proxy_pass"])
        hot = median(rps["proxy, Redis, hot key"]); lr = median(rps["nginx limit_req, hot key"])
        bare = median(rps["bare Pingora"]); free = median(rps["proxy, no limits"])
        if (bare && free) printf "| 1. no limits vs bare Pingora | ≥ 0.97× | %.2f× (CPU µs/req %.1f against %.1f) | %s |\n", free / bare, cpu("proxy, no limits"), cpu("bare Pingora"), verdict(free / bare >= 0.97)
        # The same floor built as the proxy now runs: the glue alone, with the threading equal.
        per = median(rps["bare Pingora, per thread"])
        if (per && free) printf "| 1. no limits vs bare Pingora, per thread | (reported) | %.2f× (CPU µs/req %.1f against %.1f) | – |\n", free / per, cpu("proxy, no limits"), cpu("bare Pingora, per thread")
        if (req["proxy, Redis"] && req["proxy, no limits"]) {
            d = cpu("proxy, Redis") - cpu("proxy, no limits")
            printf "| 2. the check'"'"'s proxy CPU per decision (Redis − no limits) | ≤ 5 µs | %.1f µs (%.1f − %.1f) | %s |\n", d, cpu("proxy, Redis"), cpu("proxy, no limits"), verdict(d <= 5)
            r = 1e6 * rcpu["proxy, Redis"] / req["proxy, Redis"]
            l = req["nginx+Lua EVALSHA"] ? sprintf("; nginx+Lua EVALSHA: %.1f µs", 1e6 * rcpu["nginx+Lua EVALSHA"] / req["nginx+Lua EVALSHA"]) : ""
            printf "| 3. Redis CPU per decision | ≤ 6 µs | %.1f µs%s | %s |\n", r, l, verdict(r <= 6)
        }
        for (i = 1; i <= ncs; i++) {
            x = median(all[cs[i], "proxy, Redis"]); y = median(all[cs[i], "nginx+Lua EVALSHA"])
            want = cs[i] == c ? 1.5 : 1.25
            if (x && y) printf "| 4. allowed path vs nginx+Lua EVALSHA, c=%s | ≥ %.2f× | %.2f× | %s |\n", cs[i], want, x / y, verdict(x / y >= want)
        }
        # The bound on target 4: with Redis the proxy forwards as it does without limits, plus the
        # check; a check that cost nothing would reach the no-limit route'"'"'s ratio.
        if (free && lua && req["proxy, Redis"] && req["proxy, no limits"])
            printf "| 4. the ceiling: no limits vs nginx+Lua EVALSHA, c=%s | (the bound) | %.2f×; the check costs %.1f µs of proxy CPU + %.1f µs of Redis CPU per decision, forwarding %.1f µs (bare Pingora %.1f, nginx proxy_pass %.1f) | – |\n", c, free / lua, cpu("proxy, Redis") - cpu("proxy, no limits"), 1e6 * rcpu["proxy, Redis"] / req["proxy, Redis"], cpu("proxy, no limits"), cpu("bare Pingora"), cpu("nginx proxy_pass")
        # The same in the box'"'"'s time: the whole box (cpus) spent per request, as if saturated.
        if (free && lua && redis)
            printf "| 4. what 1.5× allows the check, c=%s | (the bound) | %.1f µs of the %d CPUs'"'"' time per decision (%.1f µs per request at 1.5× nginx+Lua, less %.1f without limits); it takes %.1f (%.1f − %.1f) | – |\n", c, cpus * 1e6 / (1.5 * lua) - cpus * 1e6 / free, cpus, cpus * 1e6 / (1.5 * lua), cpus * 1e6 / free, cpus * 1e6 / redis - cpus * 1e6 / free, cpus * 1e6 / redis, cpus * 1e6 / free
        if (added_p50 != "") printf "| 5. check added at half of peak, p50 | ≤ 150 µs | %d µs | %s |\n", added_p50, verdict(added_p50 <= 150)
        if (added_p99 != "") printf "| 5. check added at half of peak, p99 | ≤ 500 µs | %d µs | %s |\n", added_p99, verdict(added_p99 <= 500)
        # The floor under target 5: a decision waits at least for one call, i.e. a round trip at
        # this load (a PING beside the proxy'"'"'s calls, queued behind any script running) plus its
        # own call'"'"'s script time.
        if (ping_p50 != "") printf "| 5. one Redis round trip at this load (PING beside the proxy'"'"'s calls), p50 / p99 | (the floor) | %d / %d µs; the script: %.1f µs per call of %.1f requests | – |\n", ping_p50, ping_p99, script_call, per_call
        if (bare_p50 != "") printf "| 5. bare Pingora at this rate, p50 / p99 | (reported) | %d / %d µs (nginx proxy_pass: %d / %d) | – |\n", bare_p50, bare_p99, pass_p50, pass_p99
        if (hot && lr) printf "| 6. hot key (deny cache) vs nginx limit_req rejecting | ≥ 1.0× | %.2f× | %s |\n", hot / lr, verdict(hot / lr >= 1)
        # What Pingora alone costs to answer 429: the floor under target 6.
        refusing = median(rps["bare Pingora, refusing"])
        if (refusing && lr) printf "| 6. bare Pingora answering 429 vs nginx limit_req rejecting | (the floor) | %.2f× (CPU µs/req %.1f against %.1f) | – |\n", refusing / lr, cpu("bare Pingora, refusing"), cpu("nginx limit_req, hot key")
        if (refusing && hot) printf "| 6. hot key vs bare Pingora answering 429 | (reported) | %.2f× (CPU µs/req %.1f against %.1f) | – |\n", hot / refusing, cpu("proxy, Redis, hot key"), cpu("bare Pingora, refusing")
        if (redis && pass) printf "| allowed path vs nginx proxy_pass | ≥ 0.75× | %.2f× | %s |\n", redis / pass, verdict(redis / pass >= 0.75)
        # HTTPS: both terminate TLS with the same certificate; keep-alive, so the handshakes happen
        # in the warm-up and the rows compare record encryption and the rest.
        for (i = 1; i <= ncs; i++) {
            x = median(all[cs[i], "proxy, no limits, TLS"]); y = median(all[cs[i], "nginx proxy_pass, TLS"])
            if (x && y) printf "| HTTPS, no limits vs nginx proxy_pass over TLS, c=%s | (reported) | %.2f× (%d against %d req/s) | – |\n", cs[i], x / y, x, y
            x = median(all[cs[i], "proxy, Redis, TLS"]); y = median(all[cs[i], "nginx+Lua EVALSHA, TLS"])
            if (x && y) printf "| HTTPS, Redis vs nginx+Lua EVALSHA over TLS, c=%s | (reported) | %.2f× (%d against %d req/s) | – |\n", cs[i], x / y, x, y
        }
        # A window starts with no denial cached (the bucket refilled while the others ran): the
        # first c requests past the burst each ask Redis; every denial after that is cached.
        # Admitted requests share calls (batches), so only calls beyond one per admitted request
        # can be for a denial.
        k = "proxy, Redis, hot key"
        if (req[k]) {
            admitted = req[k] - bad[k]
            extra = evals[k] > admitted ? evals[k] - admitted : 0
            printf "| Redis calls per denial (hot key, deny cache: calls beyond one per admitted request) | 0 | %.5f: %d EVALSHA for %d admitted and %d denied | %s |\n",
                bad[k] ? extra / bad[k] : 0, evals[k], admitted, bad[k], verdict(bad[k] && extra / bad[k] < 0.001)
        }
        # Decisions that queued during a round trip share the next call (batches), so at most one
        # call per decision. Requests still in flight when wrk stops (one per connection at most)
        # were decided but not counted by wrk.
        k = "proxy, Redis"
        if (req[k]) printf "| Redis calls per admitted request (batched) | ≤ 1 | %.4f | %s |\n", evals[k] / req[k], verdict(evals[k] <= req[k] + c * windows[k])
    }' "$results")

command="${overrides}bench/compare.sh"
mkdir -p "$(dirname "$out")"
cat >"$out" <<EOF
# ratelimit-proxy side by side with nginx

- date: $(date -u '+%Y-%m-%d %H:%M UTC')
- machine: $(nproc) CPUs, $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr); shared with other work (load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg))
- command: \`$command\` (from the repo root)
- measured: $measured
- ${said}
- $(nginx -v 2>&1 | sed 's/.*: //'), ngx_http_lua $(dpkg-query -W -f '${Version}' libnginx-mod-http-lua 2>/dev/null || echo '?'), $(redis-server --version | cut -d' ' -f1-3), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2), $(oha --version)
- load: \`wrk -t1 -c<c> -d${DURATION}s\`, closed loop at full speed, every request with an X-Api-Key drawn at
  random from $MANY_KEYS keys (or one hot key); $ROUNDS rounds per concurrency, each round every
  contender forward then backward, so $((2 * ROUNDS)) windows per contender; everything (wrk, Redis, upstream,
  contenders) on the same $(nproc) CPUs over loopback
- upstream: nginx, 1 worker, \`return 200\`; nginx contenders: $workers workers, upstream keepalive; the
  proxy: one thread per CPU ($workers)

## Targets (c=$PACED_C, ratios of medians from this run)

| target | wanted | this run | |
|---|---|---|---|
${targets}

## Throughput, closed loop

Columns: req/s is the median over the windows (min–max across them); p50/p99 latency in ms (medians
over the windows); non-2xx is the share of responses with status >= 400 (429 here). **CPU µs/req**:
CPU time (user + system, every thread) of the contender's own processes per request: the nginx
master and workers, or the proxy (for "upstream": the upstream nginx). Redis, from the INFO
commandstats delta over the windows divided by the requests wrk completed: **EVAL/req** the
EVALSHA + EVAL calls, i.e. round trips per decision; **cmds/req** every command counted (INFO
itself excluded), which includes the calls the script makes inside Redis (TIME, HMGET, and HSET +
PEXPIRE when it admits: 5 per admitted decision, 3 per rejected one); **Redis CPU µs/req** Redis's
own CPU (INFO cpu) per request. The last two columns are req/s against nginx proxy_pass and against
nginx+Lua EVALSHA at the same concurrency.

| c | contender | req/s | min–max | p50 | p99 | non-2xx | socket errors | CPU µs/req | Redis EVAL/req | Redis cmds/req | Redis CPU µs/req | vs nginx proxy_pass | vs nginx+Lua |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
${table}

Contenders: **upstream** wrk straight at the upstream (the ceiling); **nginx proxy_pass**; **nginx
limit_req** keyed by X-Api-Key at 100,000 r/s (never rejects); **hot key** one key at 100 r/s, burst
100; **nginx+Lua EVALSHA** \`access_by_lua\` running \`lua/token_bucket.lua\` by EVALSHA per request over
a cosocket pool (\`bench/compare/redis_bucket.lua\`, a minimal RESP client: Debian packages no
lua-resty-redis), capacity 10^9 at 10^6/s, or capacity 100 at 100/s for the hot key; **proxy** the
release build, a route without limits, a limit keyed by \`header:X-Api-Key\` (10^9 at 10^6/s) on Redis
(\`timeout_ms: 25\`, fail-open; the deny cache is always on with Redis) and in memory, and the hot key
(capacity 100 at 100/s) on Redis. **Redis paused**: the same limit on a second Redis, SIGSTOPped
after the warm-up: nginx+Lua waits out its 25 ms timeout on every request, the proxy's circuit
breaker stops calling after three. Over the whole run, warm-up included: Redis errors (each a
fail-open) in nginx+Lua: $lua_failures; the Redis proxy's decisions: ${proxy_decisions:-none}.

## Latency at a fixed rate: half of peak

$(if [[ -s $paced ]]; then cat <<EOT
\`oha -z ${DURATION}s -q $rate -c $PACED_C --latency-correction\` (one X-Api-Key), $rate req/s being half the median
peak of "proxy, Redis" at c=$PACED_C above; $((2 * ROUNDS)) windows per contender, alternating as above. Latencies in
µs, medians over the windows. Beside every window, \`bench/redis_rtt.py\` sends $RTT_RATE PINGs a second to the
Redis and times each round trip (**Redis PING**): what one call costs on this box at this load, queued behind
whatever script Redis runs at the time. **script µs/call**: Redis's own time in EVALSHA per call (INFO
commandstats), and the requests each call decided.

| contender | windows | req/s | p50 | p90 | p99 | p99.9 | success (min) | Redis PING p50 | Redis PING p99 | script µs/call | requests/call |
|---|---|---|---|---|---|---|---|---|---|---|---|
${paced_table}

Added by the check (proxy, Redis − proxy, no limits): p50 $(added 3 3) µs, p90 $(added 4 3) µs, p99 $(added 5 3) µs,
p99.9 $(added 6 3) µs.$([[ -z $(added 3 4) ]] || echo " For comparison, nginx+Lua EVALSHA − nginx proxy_pass: p50 $(added 3 4) µs, p99 $(added 5 4) µs.")

![latency at a fixed rate]($(basename "$plot"))
EOT
else echo "Not run (needs the \"proxy, Redis\" contender at c=$PACED_C)."; fi)

## Memory

- Redis, per bucket, $REDIS_KEYS distinct clients through a query-keyed route: $(awk -v a="$redis_mem_before" -v b="$redis_mem_after" -v n="$redis_keys" 'BEGIN { if (n) printf "%.0f B of used_memory over %d keys", (b - a) / n, n }'); \`MEMORY USAGE\` of one bucket (\`$sample_key\`): $sample_usage B
- The proxy's embedded store at $RSS_KEYS distinct clients (route /seq/, one bucket per \`?k=\` value, none full so
  none forgotten): RSS $((rss_before / 1024)) MiB before, $((rss_after / 1024)) MiB after$( ((RSS_KEYS > 0)) && awk -v a="$rss_before" -v b="$rss_after" -v n="$RSS_KEYS" 'BEGIN { printf ", %.0f B per bucket", (b - a) * 1024 / n }')

## Every window

| c | contender | req/s | p50 | p99 | non-2xx | socket errors | Redis EVALSHA+EVAL |
|---|---|---|---|---|---|---|---|
${per_window}
EOF
cat "$out"
