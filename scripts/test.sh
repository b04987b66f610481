#!/usr/bin/env bash
# The whole test suite, with everything it needs from the system set up first.
#
# As root (CI, the dev machines) it installs the Debian packages the tests use and mounts
# tracefs for the differential tests against the kernel; without root those tests say
# "skipped: <why>" and pass. USTRACE_STRESS_SECS sets how long each stress test runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    need=()
    # uftrace, lttng-tools and liblttng-ust-dev are peers of `ustrace bench --peers` (its
    # smoke test runs them for a few thousand calls); linux-source-6.12 carries the kernel's
    # ftrace selftests (scripts/ftrace-selftests.sh).
    # trace-cmd reads the trace.dat files ustrace writes (ustrace-tracedat's trace_cmd test).
    for pkg in libtraceevent-dev fuse3 pkg-config uftrace lttng-tools liblttng-ust-dev trace-cmd \
        linux-source-6.12; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
    done
    if [ ${#need[@]} -gt 0 ]; then
        echo "test.sh: installing ${need[*]}"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") \
            || echo "test.sh: skipped: could not install ${need[*]} (tests that need them will say so)"
    fi
    bash scripts/ftrace-selftests.sh --prepare \
        || echo "test.sh: skipped: no ftrace selftests (ftrace_selftests will skip)"
    if [ -d /sys/kernel/tracing ] && ! [ -e /sys/kernel/tracing/trace ]; then
        mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null \
            || echo "test.sh: skipped: cannot mount tracefs (kernel differential tests will skip)"
    fi
else
    echo "test.sh: not root: system packages, tracefs and FUSE tests may be skipped"
fi

export USTRACE_STRESS_SECS="${USTRACE_STRESS_SECS:-30}"
# --show-output prints what passing tests wrote, so every "skipped: <why>" (and the stress
# and differential summaries) reaches the log; the skips are listed again at the end.
extra=(-- --show-output)
for arg in "$@"; do [ "$arg" = "--" ] && extra=(); done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --no-fail-fast "$@" "${extra[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
echo "== tests that skipped something (count, reason)"
grep -ho "skipped: .*" "$log" | sort | uniq -c || echo "   none"
exit "$status"
