# shellcheck shell=bash
# Mount helpers shared by hack/containerd.sh and hack/cluster.sh (sourced;
# the caller defines log()).

# Mount points (decoded) at or below any of the given directories, deepest
# and most recent first.
mounts_under() {
    awk -v prefixes="$*" '
    function unescape(s,   out, i, c) {
        out = ""
        for (i = 1; i <= length(s); i++) {
            c = substr(s, i, 1)
            if (c == "\\" && substr(s, i + 1, 3) ~ /^[0-7][0-7][0-7]$/) {
                out = out sprintf("%c", (substr(s, i + 1, 1) * 64) + (substr(s, i + 2, 1) * 8) + substr(s, i + 3, 1))
                i += 3
            } else out = out c
        }
        return out
    }
    BEGIN { n = split(prefixes, p, " ") }
    {
        m = unescape($5)
        for (i = 1; i <= n; i++)
            if (m == p[i] || index(m, p[i] "/") == 1) { print gsub(/\//, "/", m) "\t" NR "\t" m; break }
    }' /proc/self/mountinfo | sort -t "$(printf '\t')" -k1,1nr -k2,2nr | cut -f3-
}

# Unmounts everything at or below the given directories, deepest first, in
# up to five rounds (lazily where a plain umount fails); returns 1, with a
# warning, if mounts remain.
unmount_under() {
    local round m left
    for round in 1 2 3 4 5; do
        left=0
        while IFS= read -r m; do
            [[ -n "$m" ]] || continue
            left=1
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null ||
                log "warning: cannot unmount $m (round $round)"
        done < <(mounts_under "$@")
        ((left)) || return 0
    done
    [[ -z "$(mounts_under "$@")" ]] || {
        log "warning: mounts remain under $*"
        return 1
    }
}
