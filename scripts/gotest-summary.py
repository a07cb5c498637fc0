#!/usr/bin/env python3
"""Reads `go test -json` on stdin and prints what a reader of the plain output would see: each
package's closing line (ok / FAIL / no test files) as it arrives, and the whole output of every
failed test. It then prints the counts as "N passed, N failed, N skipped" and exits 1 when a test
failed, the build failed, or (with --fail-all-skipped) a package ran tests and every one of them
skipped: a suite whose every case skipped has not passed.

Usage: go test -json ./... | scripts/gotest-summary.py [--fail-all-skipped]
"""
import json
import sys


def main() -> int:
    fail_all_skipped = "--fail-all-skipped" in sys.argv[1:]
    # Output of tests still running, by (package, test), printed only if the test fails.
    pending: dict[tuple[str, str], list[str]] = {}
    # Top-level test results per package.
    results: dict[str, dict[str, int]] = {}
    failed_build = False
    for line in sys.stdin:
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            # go test prints build errors as plain text before the JSON stream.
            sys.stdout.write(line)
            failed_build = failed_build or line.startswith("FAIL")
            continue
        pkg, test, action = ev.get("Package", ""), ev.get("Test", ""), ev.get("Action", "")
        if action == "build-output":
            sys.stdout.write(ev.get("Output", ""))
            continue
        if action == "build-fail":
            failed_build = True
            continue
        if not test:
            if action == "output":
                out = ev.get("Output", "")
                # The package's own lines: its closing line and anything printed outside a test
                # (TestMain, a panic); PASS/FAIL alone repeat the closing line.
                # "no tests to run" (a -run pattern that matches nothing in a package) is noise.
                if out.strip() not in ("PASS", "FAIL") and "no tests to run" not in out:
                    sys.stdout.write(out)
                    sys.stdout.flush()
            elif action == "fail":
                results.setdefault(pkg, {}).setdefault("pkgfail", 0)
                results[pkg]["pkgfail"] += 1
            continue
        key = (pkg, test)
        if action == "output":
            pending.setdefault(key, []).append(ev.get("Output", ""))
        elif action in ("pass", "fail", "skip"):
            lines = pending.pop(key, [])
            if action == "fail":
                sys.stdout.write("".join(lines))
                sys.stdout.flush()
            if "/" not in test:
                counts = results.setdefault(pkg, {})
                counts[action] = counts.get(action, 0) + 1
    passed = sum(c.get("pass", 0) for c in results.values())
    failed = sum(c.get("fail", 0) for c in results.values())
    skipped = sum(c.get("skip", 0) for c in results.values())
    status = 0
    if failed or failed_build or any(c.get("pkgfail", 0) for c in results.values()):
        status = 1
    all_skipped = sorted(p for p, c in results.items() if c.get("skip", 0) and not c.get("pass", 0) and not c.get("fail", 0))
    if all_skipped:
        word = "FAIL" if fail_all_skipped else "note"
        for p in all_skipped:
            print(f"{word}: every test of {p} skipped ({results[p]['skip']}): the suite did not run")
        if fail_all_skipped:
            status = 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return status


if __name__ == "__main__":
    sys.exit(main())
