#!/usr/bin/env bash
# checkrules.sh checks what operators look at: the Prometheus alert rules the chart ships
# (promtool check rules), their unit tests (promtool test rules: every alert fires from synthetic
# series), and the Grafana dashboard (well-formed JSON; every panel has a datasource and at least
# one query, and no query uses a template variable other than $__rate_interval and $__interval),
# and that every alert's runbook_url names a section of docs/operations.md.
# Without promtool it fails when CI is set (non-empty, not 0 or false) and skips otherwise.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
rules=deploy/helm/prefixmesh/files/alerts/prefixmesh-rules.yaml
tests=deploy/prometheus/rules_test.yaml
dashboard=deploy/helm/prefixmesh/files/dashboards/prefixmesh.json

if ! command -v promtool >/dev/null; then
	case "${CI:-}" in
	"" | 0 | false) echo "checkrules: SKIPPED (no promtool; Debian: apt-get install prometheus)"; exit 0 ;;
	*) echo "checkrules: promtool not found and CI is set" >&2; exit 1 ;;
	esac
fi

# run CMD… runs a promtool command quietly, showing its output only when it fails.
run() {
	local out
	if ! out="$("$@" 2>&1)"; then
		printf '%s\n' "$out" >&2
		echo "checkrules: $* failed" >&2
		exit 1
	fi
}
run promtool check rules "$rules"
run promtool test rules "$tests"

panels="$(python3 - "$dashboard" <<'EOF'
import json, re, sys

path = sys.argv[1]
with open(path) as f:
    dash = json.load(f)
variables = {v["name"] for v in dash.get("templating", {}).get("list", [])}
if "datasource" not in variables:
    sys.exit(f"{path}: no datasource template variable")
errors, panels, targets = [], 0, 0
for p in dash["panels"]:
    if p.get("type") == "row":
        continue
    panels += 1
    where = f"panel {p.get('id')} {p.get('title')!r}"
    if not p.get("datasource"):
        errors.append(f"{where}: no datasource")
    if not p.get("targets"):
        errors.append(f"{where}: no targets")
    for t in p.get("targets", []):
        targets += 1
        expr = t.get("expr", "")
        if not expr.strip():
            errors.append(f"{where}: target {t.get('refId')} has no expr")
        if not t.get("datasource"):
            errors.append(f"{where}: target {t.get('refId')} has no datasource")
        for var in re.findall(r"\$\{?(\w+)", expr):
            if var not in ("__rate_interval", "__interval"):
                errors.append(f"{where}: expr uses ${var}")
if errors:
    sys.exit("\n".join(errors))
print(panels, targets)
EOF
)"
read -r npanels ntargets <<<"$panels"

# Every runbook_url names a section of docs/operations.md that exists (GitHub's heading anchors).
python3 - "$rules" docs/operations.md <<'EOF'
import re, sys

rules, doc = sys.argv[1], sys.argv[2]
with open(doc) as f:
    anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", f.read(), re.M)}
with open(rules) as f:
    urls = re.findall(r"runbook_url: *(\S+)", f.read())
bad = [u for u in urls if not u.startswith(doc + "#") or u.split("#", 1)[1] not in anchors]
if not urls or bad:
    sys.exit("runbook_url without a section in %s: %s" % (doc, " ".join(bad) or "none found"))
EOF
nrules="$(grep -c '^      - alert:' "$rules")"
echo "checkrules: ok: $nrules alerts checked and unit-tested; dashboard: $npanels panels, $ntargets queries"
