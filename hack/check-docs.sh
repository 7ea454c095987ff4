#!/usr/bin/env bash
# Every repository path named in README.md and docs/*.md must exist.
# A path is a backquoted or linked word that starts with one of the tree's
# top-level folders (src/, tests/, hack/, docs/, …); globs, placeholders
# (DIR, NAME, …) and paths under / are not checked.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tops='src|tests|hack|docs|deploy|systemd|proto|etc|examples|benches|fuzz|\.ci'
missing=0
for doc in README.md docs/*.md; do
    dir=$(dirname "$doc")
    while IFS= read -r p; do
        p=${p%%[),:;]*}
        p=${p%/}
        p=${p%.}
        [[ $p == *'*'* || $p == *'…'* || $p == *'<'* || $p =~ [A-Z]{3,} ]] && continue
        if [[ -e $p || -e $p.rs || -e $dir/$p ]]; then continue; fi
        echo "check-docs: $doc names $p, which does not exist" >&2
        missing=1
    done < <(grep -oE "(\`|\]\()(\.\./)?($tops)/[^\` )#]*" "$doc" | sed -E 's/^(`|\]\()//' | sed -E 's#^\.\./##' | sort -u)
done
exit "$missing"
