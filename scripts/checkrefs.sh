#!/usr/bin/env bash
# checkrefs.sh fails, listing the lines, when a tracked file refers a reader to something outside
# the repository: a design brief or style guide that is not in it (a DESIGN.md that does not
# resolve to a file in the repository, STYLE.md, "spec §N", spec/*.md, a section sign "§N"), a
# path into ../shared, an issue tracker the reader does not have ("issue 15", "issues #692",
# "issue-11", "the issue's", a tracker id such as "SG-38945" or "PM-12"), or the brief itself
# ("the design's").
#
# Allowed: a DESIGN.md that exists (local/DESIGN.md from anywhere, or DESIGN.md beside the file
# that names it), section signs after a public standard ("RFC 9110 §7.6.1", "WHATWG HTML §9.2"),
# and upstream trackers named by repository ("vllm-project/vllm#1234", "PR #2114"); the
# dash-numbered names of standards and formats (UTF-8, SHA-256, IEEE-754, ...). Files under
# data/ and this script are not checked.
#
# Usage: scripts/checkrefs.sh   (exit 0: clean; 1: references listed on stderr)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
self="scripts/checkrefs.sh"

# Candidate lines (text files only); the awk below decides.
candidates="$(git grep -nIE 'DESIGN\.md|STYLE\.md|§|[Ii]ssues?[ _-]?#?[0-9]|[Tt]h(e|is) issue|[Dd]esign.s|[A-Z][A-Z0-9]+-[0-9]+|\.\./shared|/work/shared|(^|[^[:alnum:]_./-])spec/[[:alnum:]_.-]+\.md' \
	-- . ':(exclude)data' ":(exclude)$self" || true)"

bad="$(
	{
		git ls-files -- '*DESIGN.md' '*spec/*.md' | sed 's/^/@exists:/'
		printf '%s\n' "$candidates"
	} | awk '
	# norm resolves "." and ".." segments of a slash-separated path.
	function norm(p,    n, parts, out, k, i) {
		n = split(p, parts, "/"); k = 0
		for (i = 1; i <= n; i++) {
			if (parts[i] == "" || parts[i] == ".") continue
			if (parts[i] == "..") { if (k > 0) k--; continue }
			out[++k] = parts[i]
		}
		p = ""
		for (i = 1; i <= k; i++) p = p (i > 1 ? "/" : "") out[i]
		return p
	}
	# resolves reports whether path p, named in file f, is a tracked file: relative to f'\''s
	# directory or to the repository root.
	function resolves(p, f,    dir) {
		dir = f; sub(/\/?[^\/]*$/, "", dir)
		return (norm(dir "/" p) in exists) || (norm(p) in exists)
	}
	/^@exists:/ { exists[substr($0, 9)] = 1; next }
	$0 == "" { next }
	{
		# file:line:text (paths in this repository contain no colon)
		f = $0; sub(/:.*/, "", f)
		rest = substr($0, length(f) + 2)
		ln = rest; sub(/:.*/, "", ln)
		text = substr(rest, length(ln) + 2)
		t = text
		# Public standards and upstream trackers named by repository are citations, not briefs.
		gsub(/(RFC ?[0-9]+|WHATWG HTML|ECMA-?[0-9]+|ISO\/IEC [0-9]+) ?§ ?[0-9][0-9.]*/, "", t)
		# Standards and formats named with a dash and a number are not tracker ids.
		gsub(/(UTF|UCS|SHA|CRC|FNV|GPT|IEEE|ISO|ECMA|RFC|TLS|HTTP|AES|GCM|X|P|E|ED|MD|BF|FP|INT|UINT)-[0-9]+/, "", t)
		why = ""
		if (t ~ /STYLE\.md/) why = "STYLE.md is not in the repository"
		else if (t ~ /spec §/) why = "\"spec §N\" cites a brief outside the repository"
		else if (t ~ /§ ?[0-9]/) why = "a section sign cites a document outside the repository"
		else if (t ~ /[Ii]ssues?[ _-]?#?[0-9]/) why = "an issue number from a tracker the reader lacks"
		else if (t ~ /[Tt]h(e|is) issue([^[:alnum:]]|$)/) why = "\"the issue\" points at a tracker the reader lacks"
		else if (t ~ /[Dd]esign.s([^[:alnum:]]|$)/) why = "\"the design'"'"'s\" cites a brief outside the repository"
		else if (t ~ /(^|[^[:alnum:]_\/.-])[A-Z][A-Z0-9]+-[0-9]+([^[:alnum:]]|$)/) why = "a tracker id the reader cannot look up"
		else if (t ~ /\.\.\/shared|\/work\/shared/) why = "a path outside the repository"
		else {
			s = t
			while (why == "" && match(s, /[[:alnum:]_.\/-]*DESIGN\.md/)) {
				p = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
				if (!resolves(p, f)) why = p " does not resolve to a file in the repository"
			}
			s = t
			while (why == "" && match(s, /[[:alnum:]_.\/-]*spec\/[[:alnum:]_.-]+\.md/)) {
				p = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
				if (!resolves(p, f)) why = p " does not resolve to a file in the repository"
			}
		}
		if (why != "") printf "%s:%s: %s\n    %s\n", f, ln, why, text
	}'
)"

if [ -n "$bad" ]; then
	echo "checkrefs: references to documents or trackers outside the repository:" >&2
	printf '%s\n' "$bad" >&2
	n="$(printf '%s\n' "$bad" | grep -c '^[^ ]' || true)"
	echo "checkrefs: $n line(s); cite the in-repository doc and heading instead (docs/, a package's doc or DESIGN.md), or state the fact itself" >&2
	exit 1
fi
echo "checkrefs: no references outside the repository" >&2
