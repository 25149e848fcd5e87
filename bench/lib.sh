# bench/lib.sh: the plumbing the bench scripts share. Sourced by them once they have defined
# die() and log() and set repo, target_dir, work and REV.

# A port that no socket uses now and that this script has not handed out; in $REPLY (not
# echoed: a command substitution's subshell would lose the record of handed-out ports).
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

# wait_until SECONDS WHAT CMD...: polls CMD every 50 ms.
wait_until() {
    local limit=$1 what=$2; shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out after ${limit}s waiting for $what"
        sleep 0.05
    done
}

# build_rev NAME CARGO_BUILD_ARGS...: a release build of REV, a commit (from a `git archive`
# snapshot, so that uncommitted edits in a shared checkout neither break the build nor slip into
# the numbers) or "worktree" (the checkout as it is). Sets build_dir, the target dir it built in,
# and measured, what was built, for the report.
build_rev() {
    local name=$1 src commit
    shift
    if [[ $REV == worktree ]]; then
        src=$repo build_dir=$target_dir
        measured="working tree on $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src lua Cargo.toml Cargo.lock || echo ', with uncommitted changes to the code')"
    else
        commit=$(git rev-parse --verify --quiet "$REV^{commit}") || die "REV=$REV is not a commit"
        # A fixed path inside the build output (a fresh path per run would rebuild from scratch),
        # and a target dir of its own: cargo names a root package's artifacts by its path relative
        # to the workspace, which is the same for the snapshot and the checkout, so in a shared
        # target dir each build would take the other's for up to date.
        src=$target_dir/$name/src build_dir=$target_dir/$name/target
        if [[ $(cat "$src/.commit" 2>/dev/null) != "$commit" ]]; then
            rm -rf "$src"
            mkdir -p "$src"
            git archive "$commit" | tar -x -C "$src"
            echo "$commit" >"$src/.commit"
        fi
        measured="commit $(git rev-parse --short "$commit") ($(git log -1 --format=%s "$commit"))"
    fi
    log "building $measured (release; the first build of a snapshot takes minutes) ..."
    (cd "$src" && CARGO_TARGET_DIR=$build_dir cargo build --release "$@") \
        >"$work/build.log" 2>&1 || die "build failed: $(tail -20 "$work/build.log")"
}
