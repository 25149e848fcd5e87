#!/usr/bin/env bash
# Throughput and latency of ratelimit-proxy side by side with nginx, on one machine, on loopback.
#
# Usage (from the repo root):
#
#     bench/compare.sh
#
# Optional environment: CONNECTIONS (wrk -c values, default "64"; e.g. "16 64 256"), ROUNDS
# (default 2: see "Order" below), DURATION seconds per wrk window (5), REV (commit to build, default
# HEAD, from a `git archive` snapshot so that uncommitted edits in the shared checkout neither break
# the build nor slip into the numbers; REV=worktree builds the checkout as it is), KEEP_TMP=1 (keep
# the temp dir: configs, logs, raw wrk output), OUT (default bench/results/compare.md). The Markdown
# report is printed too.
#
# Needs git, cargo, redis-server, redis-cli, wrk, curl, ss, and nginx with the Lua module (Debian:
# apt-get install -y nginx-light libnginx-mod-http-lua wrk redis-server). The system nginx and its
# config are never used: each nginx here runs in the foreground with a config and prefix in the
# temp dir. Everything listens on 127.0.0.1, on free ports in 20000-31999 (never 80 or 6379), and
# every process the script starts is killed on exit.
#
# Contenders (all behind one upstream, an nginx answering `return 200` with one worker):
#   upstream            wrk straight at the upstream: the ceiling
#   nginx proxy_pass    nginx (as many workers as CPUs, like the proxy's threads), upstream keepalive
#   nginx limit_req     the same plus limit_req keyed by X-Api-Key, a rate never reached
#   nginx limit_req hot the same, one hot key at 100 r/s: nearly every request rejected (429)
#   nginx+Lua EVALSHA   access_by_lua: EVALSHA of lua/token_bucket.lua per request, pooled
#                       connections (bench/compare/redis_bucket.lua; Debian has no lua-resty-redis)
#   nginx+Lua hot       the same, one hot key at capacity 100, 100/s: nearly every request rejected
#   proxy no limits     ratelimit-proxy, a route without limits
#   proxy Redis         a limit keyed by X-Api-Key, never binding, 10,000 keys: one EVALSHA each
#   proxy Redis hot     one hot key at capacity 100, 100/s: nearly all rejected, mostly from the
#                       deny cache (always on with Redis)
#   proxy memory        the 10,000-key limit in the embedded in-memory store
# wrk sends every request with an X-Api-Key drawn from 10,000 keys (or the one hot key), to every
# contender alike, so the client's cost is the same in every row.
#
# Order: within a round the contenders run forward then backward (A B C ... C B A), so slow drift
# in the shared machine's load falls evenly on all of them; ROUNDS such rounds per concurrency.

set -euo pipefail

overrides=""
for v in REV CONNECTIONS ROUNDS DURATION OUT; do [[ -n ${!v:-} ]] && overrides+="$v=$(printf %q "${!v}") "; done

CONNECTIONS=${CONNECTIONS:-64}
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

for tool in git tar cargo redis-server redis-cli wrk curl ss nginx; do
    command -v "$tool" >/dev/null || die "needs $tool on PATH (Debian: apt-get install -y nginx-light libnginx-mod-http-lua wrk redis-server)"
done
nginx_modules=/usr/share/nginx/modules
[[ -f $nginx_modules/ngx_http_lua_module.so ]] || die "needs the nginx Lua module (apt-get install -y libnginx-mod-http-lua)"

work=$(mktemp -d "${TMPDIR:-/tmp}/compare.XXXXXX")
pids=()

cleanup() {
    local status=$? p
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    if [[ $status -ne 0 || ${KEEP_TMP:-} == 1 ]]; then
        echo "compare: logs and configs kept in $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME CMD...: runs CMD in the background, output to $work/NAME.log.
start() {
    local name=$1; shift
    "$@" >"$work/$name.log" 2>&1 </dev/null &
    pids+=("$!")
}

# A free port not handed out before, in $REPLY (not echoed: a subshell would lose the record).
handed_out=" "
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 12000))
        [[ $handed_out == *" $p "* ]] && continue
        [[ -z $(ss -Htan "sport = :$p") ]] || continue
        handed_out+="$p "
        REPLY=$p
        return
    done
}

wait_until() {
    local limit=$1 what=$2; shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out after ${limit}s waiting for $what"
        sleep 0.05
    done
}

# --- build -------------------------------------------------------------------------------------

if [[ $REV == worktree ]]; then
    src=$repo
    measured="working tree on $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src lua Cargo.toml Cargo.lock || echo ', with uncommitted changes to the code')"
else
    commit=$(git rev-parse --verify --quiet "$REV^{commit}") || die "REV=$REV is not a commit"
    # A fixed path inside the build output: cargo keys artifacts by source path, so a fresh path
    # per run would rebuild from scratch and pile up copies.
    src=$target_dir/compare/src
    if [[ $(cat "$src/.commit" 2>/dev/null) != "$commit" ]]; then
        rm -rf "$src"
        mkdir -p "$src"
        git archive "$commit" | tar -x -C "$src"
        echo "$commit" >"$src/.commit"
    fi
    measured="commit $(git rev-parse --short "$commit") ($(git log -1 --format=%s "$commit"))"
fi
log "building $measured (release; waits if another cargo holds the target dir) ..."
(cd "$src" && CARGO_TARGET_DIR=$target_dir cargo build --release --bin ratelimit-proxy) \
    >"$work/build.log" 2>&1 || die "build failed: $(tail -20 "$work/build.log")"
# A private copy: another build in the shared target dir may replace the binary mid-run.
cp "$target_dir/release/ratelimit-proxy" "$work/ratelimit-proxy"
proxy_bin=$work/ratelimit-proxy

# --- Redis ---------------------------------------------------------------------------------------

free_port; REDIS_PORT=$REPLY
start redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" --logfile "$work/redis.server.log"
wait_until 10 "redis on $REDIS_PORT" redis-cli -p "$REDIS_PORT" PING
# The same script the proxy loads; its SHA is what nginx+Lua calls.
SHA=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat lua/token_bucket.lua)")

# Calls of every command but INFO itself, summed over INFO commandstats; and EVALSHA + EVAL.
redis_calls() {
    redis-cli -p "$REDIS_PORT" INFO commandstats | tr -d '\r' | awk -F'[:=,]' '
        /^cmdstat_/ && $1 != "cmdstat_info" { all += $3 }
        $1 == "cmdstat_evalsha" || $1 == "cmdstat_eval" { ev += $3 }
        END { print all + 0, ev + 0 }'
}

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

free_port; NGINX=127.0.0.1:$REPLY
workers=$(nproc) # the proxy runs one thread per CPU
start_nginx contender "$workers" "
    lua_package_path '$repo/bench/compare/?.lua;;';
    init_by_lua_block {
        require('redis_bucket').init('127.0.0.1', $REDIS_PORT, '$SHA', '$repo/lua/token_bucket.lua')
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
        location /lua/ {
            access_by_lua_block {
                if not require('redis_bucket').allowed('rl:{ngx:' .. (ngx.var.http_x_api_key or '') .. '}:per_key', 1000000000, 1, 1, 1) then
                    return ngx.exit(429)
                end
            }
            proxy_pass http://up;
        }
        location /luahot/ {
            access_by_lua_block {
                if not require('redis_bucket').allowed('rl:{ngxhot:' .. (ngx.var.http_x_api_key or '') .. '}:hot', 100, 10000, 1, 1) then
                    return ngx.exit(429)
                end
            }
            proxy_pass http://up;
        }
    }"

# --- the proxies -------------------------------------------------------------------------------

# start_proxy NAME YAML_HEAD ROUTES: sets REPLY to its listen address.
start_proxy() {
    local name=$1 head=$2 routes=$3
    free_port; local listen=127.0.0.1:$REPLY
    free_port; local admin=127.0.0.1:$REPLY
    local conf=$work/$name.yaml
    printf 'listen: "%s"\nadmin: "%s"\nshutdown_grace_seconds: 0\n%s\nroutes:\n%s\n' \
        "$listen" "$admin" "$head" "$routes" >"$conf"
    "$proxy_bin" --config "$conf" --check >/dev/null || die "invalid config $conf"
    RUST_LOG=warn start "$name" "$proxy_bin" --config "$conf" --upgrade-sock "$work/$name-upgrade.sock"
    ADMIN=$admin
    REPLY=$listen
}

# Never binding: 10^9 tokens refilled at 10^6/s; the hot route: 100 tokens at 100/s.
keyed_limit='    limits:
      - name: per_key
        capacity: 1000000000
        refill: "1000000/s"
        key: "header:X-Api-Key"'
start_proxy proxy-redis "redis:
  url: \"redis://127.0.0.1:$REDIS_PORT/0\"
  timeout_ms: 25
on_redis_error: open" "  - name: free
    match: { path_prefix: /free/ }
    upstream: \"$UPSTREAM\"
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
PROXY=$REPLY PROXY_ADMIN=$ADMIN
start_proxy proxy-memory "" "  - name: keyed
    upstream: \"$UPSTREAM\"
$keyed_limit"
PROXY_MEM=$REPLY

# name|url|keys|uses Redis (1: commands per decision are counted)
contenders=(
    "upstream|http://$UPSTREAM/|$MANY_KEYS|0"
    "nginx proxy_pass|http://$NGINX/proxy/|$MANY_KEYS|0"
    "nginx limit_req|http://$NGINX/lr/|$MANY_KEYS|0"
    "nginx limit_req, hot key|http://$NGINX/lrhot/|$HOT_KEYS|0"
    "nginx+Lua EVALSHA|http://$NGINX/lua/|$MANY_KEYS|1"
    "nginx+Lua EVALSHA, hot key|http://$NGINX/luahot/|$HOT_KEYS|1"
    "proxy, no limits|http://$PROXY/free/|$MANY_KEYS|0"
    "proxy, Redis|http://$PROXY/|$MANY_KEYS|1"
    "proxy, Redis, hot key|http://$PROXY/hot/|$HOT_KEYS|1"
    "proxy, memory|http://$PROXY_MEM/|$MANY_KEYS|0"
)

for c in "${contenders[@]}"; do
    IFS='|' read -r name url _ _ <<<"$c"
    wait_until 20 "$name to serve" curl -fsS -o /dev/null "$url"
done

# Connection pools filled, keys created in Redis and memory, code paths warm: 1 s each.
log "warming up"
for c in "${contenders[@]}"; do
    IFS='|' read -r name url keys _ <<<"$c"
    KEYS=$keys wrk -t1 -c64 -d1s -s "$wrk_lua" "$url" >/dev/null
done

# --- the windows -------------------------------------------------------------------------------

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
results=$work/results.tsv
: >"$results"

window() { # window CONNECTIONS CONTENDER_LINE: appends "c name rps p50 p99 non2xx errors requests cmds evals"
    local conns=$1 name url keys redis before after result
    IFS='|' read -r name url keys redis <<<"$2"
    before=$(redis_calls)
    KEYS=$keys wrk -t1 -c"$conns" -d"${DURATION}s" --timeout 2s -s "$wrk_lua" "$url" >"$work/wrk.txt"
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
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$conns" "$name" "${vals[@]}" \
        $((a_all - b_all)) $((a_ev - b_ev)) "$redis" >>"$results"
    log "c=$conns $name: ${result#RESULT }"
}

for conns in $CONNECTIONS; do
    for round in $(seq 1 "$ROUNDS"); do
        for c in "${contenders[@]}"; do window "$conns" "$c"; done
        for ((i = ${#contenders[@]} - 1; i >= 0; i--)); do window "$conns" "${contenders[i]}"; done
    done
done

# --- report --------------------------------------------------------------------------------------

# Per concurrency and contender, in the contenders' order: median req/s (the mean of the middle
# two for an even count) and min-max, median p50/p99, share of non-2xx, socket errors (sum), Redis
# commands per request, and req/s against nginx proxy_pass and nginx+Lua.
table=$(awk -F'\t' '
    function median(list,   v, n, i, j, t) {
        n = split(substr(list, 2), v, " ")
        for (i = 2; i <= n; i++)
            for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    {
        k = $1 SUBSEP $2
        if (!(k in n)) { order[++rows] = k; conns[k] = $1; name[k] = $2 }
        n[k]++
        rps[k] = rps[k] " " $3; p50[k] = p50[k] " " $4; p99[k] = p99[k] " " $5
        if (!(k in lo) || $3 < lo[k]) lo[k] = $3
        if ($3 > hi[k]) hi[k] = $3
        bad[k] += $6; err[k] += $7; req[k] += $8; cmds[k] += $9; evals[k] += $10; redis[k] = $11
    }
    END {
        for (i = 1; i <= rows; i++) { k = order[i]; med[k] = median(rps[k]) }
        for (i = 1; i <= rows; i++) {
            k = order[i]
            base = med[conns[k] SUBSEP "nginx proxy_pass"]; lua = med[conns[k] SUBSEP "nginx+Lua EVALSHA"]
            per = redis[k] ? sprintf("%.3f | %.2f", evals[k] / req[k], cmds[k] / req[k]) : "– | –"
            printf "| %s | %s | %d | %d–%d | %.2f | %.2f | %.1f %% | %d | %s | %.2f | %.2f |\n",
                conns[k], name[k], med[k], lo[k], hi[k], median(p50[k]) / 1000, median(p99[k]) / 1000,
                100 * bad[k] / req[k], err[k], per, base ? med[k] / base : 0, lua ? med[k] / lua : 0
        }
    }' "$results")

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

command="${overrides}bench/compare.sh"
mkdir -p "$(dirname "$out")"
cat >"$out" <<EOF
# ratelimit-proxy side by side with nginx

- date: $(date -u '+%Y-%m-%d %H:%M UTC')
- machine: $(nproc) CPUs, $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr); shared with other work (load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg))
- command: \`$command\` (from the repo root)
- measured: $measured
- $(nginx -v 2>&1 | sed 's/.*: //'), ngx_http_lua $(dpkg-query -W -f '${Version}' libnginx-mod-http-lua 2>/dev/null || echo '?'), $(redis-server --version | cut -d' ' -f1-3), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)
- load: \`wrk -t1 -c<c> -d${DURATION}s\`, closed loop at full speed, every request with an X-Api-Key drawn at
  random from $MANY_KEYS keys (or one hot key); $ROUNDS rounds per concurrency, each round every
  contender forward then backward, so $((2 * ROUNDS)) windows per contender; everything (wrk, Redis, upstream,
  contenders) on the same $(nproc) CPUs over loopback
- upstream: nginx, 1 worker, \`return 200\`; nginx contenders: $workers workers, upstream keepalive; the
  proxy: one thread per CPU ($workers)

Columns: req/s is the median over the windows (min–max across them); p50/p99 latency in ms (medians
over the windows); non-2xx is the share of responses with status >= 400 (429 here). Redis, from the
INFO commandstats delta over the windows divided by the requests wrk completed: **EVAL/req** the
EVALSHA + EVAL calls, i.e. round trips per decision; **cmds/req** every command counted (INFO
itself excluded), which includes the calls the script makes inside Redis (TIME, HMGET, and HSET +
PEXPIRE when it admits: 5 per admitted decision, 3 per rejected one). The last two columns are
req/s against nginx proxy_pass and against nginx+Lua EVALSHA at the same concurrency.

| c | contender | req/s | min–max | p50 | p99 | non-2xx | socket errors | Redis EVAL/req | Redis cmds/req | vs nginx proxy_pass | vs nginx+Lua |
|---|---|---|---|---|---|---|---|---|---|---|---|
${table}

Contenders: **upstream** wrk straight at the upstream (the ceiling); **nginx proxy_pass**; **nginx
limit_req** keyed by X-Api-Key at 100,000 r/s (never rejects); **hot key** one key at 100 r/s, burst
100; **nginx+Lua EVALSHA** \`access_by_lua\` running \`lua/token_bucket.lua\` by EVALSHA per request over
a cosocket pool (\`bench/compare/redis_bucket.lua\`, a minimal RESP client: Debian packages no
lua-resty-redis), capacity 10^9 at 10^6/s, or capacity 100 at 100/s for the hot key; **proxy** the
release build, a route without limits, a limit keyed by \`header:X-Api-Key\` (10^9 at 10^6/s) on Redis
(\`timeout_ms: 25\`, fail-open; the deny cache is always on with Redis) and in memory, and the hot key
(capacity 100 at 100/s) on Redis. Over the whole run, warm-up included: Redis errors (each
a fail-open) in nginx+Lua: $lua_failures; the Redis proxy's decisions: ${proxy_decisions:-none}.

Every window:

| c | contender | req/s | p50 | p99 | non-2xx | socket errors | Redis EVALSHA+EVAL |
|---|---|---|---|---|---|---|---|
${per_window}
EOF
cat "$out"
