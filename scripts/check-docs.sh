#!/usr/bin/env bash
# Checks the documents (bash, grep, sed and awk only; no Python):
#   1. every relative markdown link [text](path#anchor) in README.md, CHANGELOG.md, BENCHMARKS.md
#      and docs/*.md points to an existing file and, if it has an anchor and the target is a
#      markdown file, to a heading of that file that produces the anchor (GitHub's rule: strip
#      the heading's markup, lowercase, drop every character but letters, digits, spaces,
#      hyphens and underscores, spaces to hyphens; a repeated heading gets -1, -2, ...). Links
#      inside fenced code blocks and inline code are not links; http(s) and mailto links are not
#      checked;
#   2. README.md is at most 16000 bytes (it is the front door; the rest lives in docs/);
#   3. no file outside .venv, target and .git names the old specification document (SPEC, its
#      .md file) or the old shared directory (../shared): the design document is
#      docs/design.md. Mentions under src/ and fencing-core/ are reported as warnings and only
#      fail the check with --strict (they are being rewritten); elsewhere they always fail;
#   4. every source file of the crate (src/**/*.rs) is in docs/design.md's module map: by its
#      path (`src/guard/trigger.rs`), or in a row that names its top folder (`src/guard/`) by its
#      path below that folder (`trigger.rs`, `etcd/client.rs`); a folder's `mod.rs` by the row
#      that names the folder.
# Usage: scripts/check-docs.sh [--strict]   (exit status 1 and one line per finding if broken)
set -euo pipefail
source "$(dirname "$0")/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
source scripts/lib.sh

strict=0
for a in "$@"; do
    case "$a" in
        --strict) strict=1 ;;
        *) echo "usage: scripts/check-docs.sh [--strict]" >&2; exit 2 ;;
    esac
done

bad=0
finding() { echo "check-docs: $*" >&2; bad=1; }
export LC_ALL=C

# The anchors a markdown file's headings produce, one per line.
anchors() {
    awk '
        /^[[:space:]]*(```|~~~)/ { fence = !fence; next }
        fence { next }
        /^##?#?#?#?#?[ \t]/ {
            h = $0
            sub(/^#+[[:space:]]+/, "", h); sub(/[[:space:]]+#+[[:space:]]*$/, "", h)
            sub(/[[:space:]]+$/, "", h)
            # Markup that GitHub renders away: links keep their text, images their alt text.
            while (match(h, /!?\[[^]]*\]\([^)]*\)/)) {
                t = substr(h, RSTART, RLENGTH); sub(/^!?\[/, "", t); sub(/\]\(.*$/, "", t)
                h = substr(h, 1, RSTART - 1) t substr(h, RSTART + RLENGTH)
            }
            s = tolower(h)
            gsub(/[^a-z0-9 _-]/, "", s)
            gsub(/ /, "-", s)
            if (s in seen) { n = ++seen[s]; s = s "-" n } else { seen[s] = 0 }
            print s
        }
    ' "$1"
}

# The links of a markdown file: LINE<TAB>TARGET, one per line.
links() {
    awk '
        /^[[:space:]]*(```|~~~)/ { fence = !fence; next }
        fence { next }
        {
            line = $0
            gsub(/``[^`]*``/, "", line)
            gsub(/`[^`]*`/, "", line)
            while (match(line, /\[[^]]*\]\([^)]*\)/)) {
                t = substr(line, RSTART, RLENGTH)
                sub(/^\[[^]]*\]\(/, "", t); sub(/\)$/, "", t)
                sub(/^[[:space:]]+/, "", t); sub(/[[:space:]].*$/, "", t)
                gsub(/^<|>$/, "", t)
                print NR "\t" t
                line = substr(line, RSTART + RLENGTH)
            }
        }
    ' "$1"
}

docs=(README.md CHANGELOG.md BENCHMARKS.md CONTRIBUTING.md)
for f in docs/*.md; do docs+=("$f"); done
nlinks=0
for f in "${docs[@]}"; do
    if ! [ -f "$f" ]; then
        finding "$f: missing"
        continue
    fi
    dir=$(dirname "$f")
    while IFS=$'\t' read -r line target; do
        case "$target" in
            http://* | https://* | mailto:* | '') continue ;;
        esac
        nlinks=$((nlinks + 1))
        path=${target%%#*}
        anchor=
        [[ $target == *'#'* ]] && anchor=${target#*#}
        if [ -z "$path" ]; then
            dest=$f
        else
            dest=$(realpath -m --relative-to=. "$dir/$path")
        fi
        if ! [ -e "$dest" ]; then
            finding "$f:$line: link to a missing file: $target"
            continue
        fi
        if [ -n "$anchor" ]; then
            case "$dest" in
                *.md)
                    if ! anchors "$dest" | grep -qxF -- "$anchor"; then
                        finding "$f:$line: no heading of $dest makes the anchor #$anchor: $target"
                    fi
                    ;;
            esac
        fi
    done < <(links "$f")
done

size=$(wc -c <README.md)
if [ "$size" -gt 16000 ]; then
    finding "README.md is $size bytes, more than 16000: move detail into docs/"
fi

# The module map names every source file.
map=$(awk '/^## Module map/ { p = 1; next } /^## / { p = 0 } p' docs/design.md)
nfiles=0
while IFS= read -r f; do
    nfiles=$((nfiles + 1))
    rel=${f#src/}
    grep -qF "\`$f\`" <<<"$map" && continue
    case "$rel" in
        */*) top=${rel%%/*}; below=${rel#*/} ;;
        *) finding "docs/design.md, \"Module map\": $f is not named (as \`$f\`)"; continue ;;
    esac
    rows=$(grep -F "\`src/$top/" <<<"$map" || true)
    grep -qF "\`$below\`" <<<"$rows" && continue
    case "$below" in
        mod.rs) [ -n "$rows" ] && continue ;;
        */mod.rs) grep -qF "\`${below%mod.rs}\`" <<<"$rows" && continue ;;
    esac
    finding "docs/design.md, \"Module map\": $f is not named (its row names \`src/$top/\` and \`$below\`)"
done < <(find src -name '*.rs' | sort)

# The old specification and the old shared directory, spelled so that this file does not match.
old_refs='SPEC[.]md|[.][.]/shared|(^|[^A-Za-z0-9_])SPEC([^A-Za-z0-9_]|$)'
nwarn=0
while IFS= read -r hit; do
    case "$hit" in
        ./src/* | ./fencing-core/*)
            if [ "$strict" -eq 1 ]; then
                finding "${hit#./}: cites the old specification; cite docs/design.md"
            else
                echo "check-docs: warning: ${hit#./}: cites the old specification; cite docs/design.md" >&2
                nwarn=$((nwarn + 1))
            fi
            ;;
        *) finding "${hit#./}: cites the old specification; cite docs/design.md" ;;
    esac
done < <(find . \( -name .venv -o -name target -o -name .git \) -prune -o -type f \
        ! -path ./scripts/check-docs.sh -print0 \
        | xargs -0 grep -InE "$old_refs" 2>/dev/null | cut -c1-200 || true)

if [ "$bad" -ne 0 ]; then
    echo "check-docs: FAILED" >&2
    exit 1
fi
warned=; [ "$nwarn" -gt 0 ] && warned=", $nwarn warnings (--strict fails on them)"
echo "check-docs: ok (${#docs[@]} documents, $nlinks relative links, README.md $size bytes, $nfiles source files in the module map$warned)"
