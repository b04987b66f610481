#!/usr/bin/env bash
# Runs the kernel's own ftrace selftests (tools/testing/selftests/ftrace of Debian's
# linux-source-6.12) against a ustrace tracefs: a process that links ustrace serves its
# tracefs, and in a private mount namespace (unshare -m) the kernel's tracefs mounts are
# taken away and the process's FUSE tracefs is mounted at /sys/kernel/tracing, where
# ftracetest looks. Nothing outside that namespace sees the mount; ftracetest's one write
# outside tracefs (/proc/sys/kernel/sched_rt_runtime_us) goes to a file bound over it there,
# and its modprobe/rmmod of the kernel's sample modules are refused.
#
#   scripts/ftrace-selftests.sh [--ustrace BIN] [--pid PID] [--results FILE] [--logdir DIR]
#                               [TEST.tc|DIR ...]
#   scripts/ftrace-selftests.sh --prepare     only extract the selftests (scripts/test.sh)
#
# --ustrace  the `ustrace` command (default: target/debug/ustrace)
# --fixture  the program to trace (default: ustrace-ftrace-fixture next to --ustrace): it
#            declares events shaped like the kernel's that the tests use and fires them
# --pid      trace this running process instead of starting the fixture
#            (USTRACE_SOCKET_DIR must reach its socket)
# --results  write one line per test: RESULT DIR/FILE.tc[ (instance)]
# --logdir   where ftracetest writes its logs (kept for every test)
# --update   rewrite tests/ftrace-selftests.expected from this run (FAIL reasons are kept;
#            a new FAIL needs one written by hand). Run it on all the default directories.
# -v, -vv, -vvv, -d, --stop-fail   passed to ftracetest (-v prints the log of each failure)
# TEST/DIR   relative to test.d (default: the directories listed in DIRS below)
#
# The selftests come from target/ftrace-selftests (extracted from
# /usr/src/linux-source-6.12.tar.xz when missing; scripts/test.sh installs the package).
# Exit status: 0 when ftracetest ran (whatever its results: the caller compares them with
# tests/ftrace-selftests.expected), 4 with "skipped: <why>" when it cannot run here.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

DIRS=(00basic event trigger dynevent filter instances ftrace)
ustrace=$root/target/debug/ustrace
fixture=
pid=
results=
logdir=
tests=()
ftopts=()
prepare=0
update=0
PLACEHOLDER="(why it fails: not written yet)"
while [ $# -gt 0 ]; do
    case "$1" in
    --ustrace) ustrace=$2; shift 2 ;;
    --fixture) fixture=$2; shift 2 ;;
    --pid) pid=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --logdir) logdir=$2; shift 2 ;;
    --prepare) prepare=1; shift ;;
    --update) update=1; shift ;;
    -v|-vv|-vvv|-d|--stop-fail) ftopts+=("$1"); shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) tests+=("$1"); shift ;;
    esac
done
[ -n "$fixture" ] || fixture=$(dirname "$ustrace")/ustrace-ftrace-fixture

skip() {
    echo "ftrace-selftests: skipped: $*" >&2
    exit 4
}

src=$root/target/ftrace-selftests
ft=$src/tools/testing/selftests/ftrace
tarball=/usr/src/linux-source-6.12.tar.xz
if ! [ -x "$ft/ftracetest" ]; then
    [ -f "$tarball" ] || skip "no $tarball (apt-get install linux-source-6.12; scripts/test.sh does as root)"
    mkdir -p "$src"
    tar -xJf "$tarball" -C "$src" --strip-components=1 --wildcards \
        'linux-source-6.12/tools/testing/selftests/ftrace/*' \
        || skip "could not extract the ftrace selftests from $tarball"
fi
[ "$prepare" = 0 ] || exit 0

[ "$(id -u)" = 0 ] || skip "needs root (ftracetest refuses to run otherwise, and mount(2) in a namespace)"
command -v unshare >/dev/null || skip "no unshare(1)"
[ -e /dev/fuse ] || skip "no /dev/fuse"
[ -d /sys/kernel/tracing ] || skip "no /sys/kernel/tracing directory to mount on"
unshare -m true 2>/dev/null || skip "cannot make a mount namespace (unshare -m)"
[ -x "$ustrace" ] || skip "no ustrace command at $ustrace (cargo build -p ustrace-cli)"

work=$(mktemp -d /tmp/ustrace-ftrace-selftests.XXXXXX)
child=
cleanup() {
    local status=$?
    if [ -n "$child" ]; then
        kill -9 "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
[ -n "$logdir" ] || logdir=$work/logs
mkdir -p "$logdir"
logdir=$(cd "$logdir" && pwd)
# Logs of an earlier run would be taken for this one's (they are found by case number).
rm -f "$logdir"/ftracetest.log "$logdir"/*-log.*

if [ -z "$pid" ]; then
    [ -x "$fixture" ] || skip "no fixture program at $fixture (cargo build -p ustrace-cli)"
    export USTRACE_SOCKET_DIR=$work/sock
    mkdir -p "$USTRACE_SOCKET_DIR"
    "$fixture" >"$work/fixture.out" 2>&1 &
    child=$!
    pid=$child
    for _ in $(seq 1 500); do
        [ -S "$USTRACE_SOCKET_DIR/$pid.sock" ] && break
        kill -0 "$pid" 2>/dev/null || { cat "$work/fixture.out" >&2; echo "ftrace-selftests: the fixture exited" >&2; exit 1; }
        sleep 0.02
    done
    [ -S "$USTRACE_SOCKET_DIR/$pid.sock" ] || { echo "ftrace-selftests: the fixture never served" >&2; exit 1; }
fi

args=()
if [ "$update" = 1 ] && [ ${#tests[@]} -gt 0 ]; then
    echo "ftrace-selftests: --update takes no test list (it rewrites the whole file)" >&2
    exit 2
fi
if [ ${#tests[@]} -eq 0 ]; then
    tests=("${DIRS[@]}")
fi
for t in "${tests[@]}"; do args+=("$ft/test.d/$t"); done
args=(${ftopts[@]+"${ftopts[@]}"} "${args[@]}")

# Inside the namespace: unmount every tracefs (the kernel's), mount ours where ftracetest
# looks first, run it, unmount. The namespace (and any mount left in it) dies with the shell.
cat >"$work/inner.sh" <<'EOF'
set -u
grep -w tracefs /proc/self/mounts | cut -d' ' -f2 | sort -r | while read -r m; do
    umount -l "$m" || exit 1
done
if grep -qw tracefs /proc/self/mounts; then
    echo "ftrace-selftests: a kernel tracefs is still mounted in the namespace" >&2
    exit 1
fi
echo 950000 > "$WORK/sched_rt_runtime_us"
mount --bind "$WORK/sched_rt_runtime_us" /proc/sys/kernel/sched_rt_runtime_us || exit 1
# Some tests load and unload the kernel's sample modules: the machine's kernel is not what
# is under test, so modprobe and rmmod refuse here (those tests end UNRESOLVED).
mkdir -p "$WORK/bin"
for tool in modprobe rmmod insmod; do
    printf '#!/bin/sh\necho "ftrace-selftests: no kernel modules under ustrace: %s $*" >&2\nexit 1\n' "$tool" >"$WORK/bin/$tool"
    chmod +x "$WORK/bin/$tool"
done
export PATH="$WORK/bin:$PATH"
"$USTRACE" mount -p "$PID" /sys/kernel/tracing 2>"$WORK/mount.err" &
m=$!
for _ in $(seq 1 500); do
    grep -q "^tracefs /sys/kernel/tracing " /proc/self/mounts && [ -e /sys/kernel/tracing/trace ] && break
    kill -0 $m 2>/dev/null || { cat "$WORK/mount.err" >&2; exit 1; }
    sleep 0.02
done
grep -q "^tracefs /sys/kernel/tracing " /proc/self/mounts || { echo "ftrace-selftests: the mount never appeared" >&2; exit 1; }
# A whole run takes well under a minute; a test that blocks (a read of trace_pipe that
# never ends) must not hold the caller forever.
timeout 900 "$FT/ftracetest" -k -l "$LOGDIR" "$@" </dev/null
rc=$?
[ $rc = 124 ] && echo "ftrace-selftests: ftracetest did not finish within 900 s" >&2
kill $m 2>/dev/null || { echo "ftrace-selftests: ustrace mount died during the run:" >&2; cat "$WORK/mount.err" >&2; }
wait $m 2>/dev/null
umount -l /sys/kernel/tracing 2>/dev/null
exit $rc
EOF
set +e
WORK=$work USTRACE=$ustrace PID=$pid FT=$ft LOGDIR=$logdir \
    unshare -m --propagation private sh "$work/inner.sh" "${args[@]}"
rc=$?
set -e
if [ -n "$child" ] && ! kill -0 "$child" 2>/dev/null; then
    echo "ftrace-selftests: the fixture died during the run:" >&2
    cat "$work/fixture.out" >&2
fi
log=$logdir/ftracetest.log
[ -f "$log" ] || { echo "ftrace-selftests: ftracetest did not run (exit $rc)" >&2; exit 1; }

# One line per test: its case number maps to the file through its kept log, whose first
# line is "execute[ (instance) ]: PATH".
table=$work/results
: >"$table"
sed -n 's/^\[\([0-9]*\)\]\(.*\)\t\[\([A-Z]*\)\]$/\1 \3/p' "$log" | while read -r n result; do
    f=$(ls "$logdir/$n-"*-log.* 2>/dev/null | head -1)
    [ -n "$f" ] || continue
    first=$(head -1 "$f")
    path=${first#*: }
    name=${path#"$ft/test.d/"}
    case "$first" in "execute (instance) "*) name="$name (instance)" ;; esac
    # Why a test did not run, in ftracetest's words (its requires: check, a missing module).
    why=
    case "$result" in UNSUPPORTED|UNRESOLVED|UNTESTED)
        why=$(grep -E '^(Required .*|No .* module - .*)$' "$f" | tail -1 || true) ;;
    esac
    echo "$result $name${why:+ # $why}"
done >"$table"
if [ -n "$results" ]; then cp "$table" "$results"; else cat "$table"; fi

# --update rewrites the expectations with this run's outcomes: a FAIL keeps the reason
# written for it before, or gets a placeholder the ftrace_selftests test refuses, so that
# each new failure is explained by hand.
if [ "$update" = 1 ]; then
    expected=$root/tests/ftrace-selftests.expected
    new=$work/expected
    grep '^#' "$expected" >"$new" || true
    while read -r result rest; do
        name=${rest%% # *}
        if [ "$result" = FAIL ]; then
            why=$(grep -F "FAIL $name # " "$expected" | head -1 | sed 's/^[^#]*# //' || true)
            echo "FAIL $name # ${why:-$PLACEHOLDER}"
        else
            echo "$result $rest"
        fi
    done <"$table" >>"$new"
    cp "$new" "$expected"
    echo "ftrace-selftests: wrote $expected" >&2
fi
exit 0
