#!/usr/bin/env bash
# Compares `ustrace bench --json` between builds on a shared, noisy machine: runs each
# binary N times, alternating them so that drifts in load hit all alike, and prints each
# figure's median ns/op (and median ratio to the run's own baseline), plus every run's
# two-thread scaling.
#
#   scripts/bench-compare.sh 7 /tmp/ustrace-old target/release/ustrace
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 RUNS USTRACE_BINARY..." >&2
    exit 2
fi
runs=$1
shift
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq 1 "$runs"); do
    for b in $(seq 1 $#); do
        "${!b}" bench --json >"$out/$b-$i.json"
    done
done
python3 - "$out" "$runs" "$@" <<'PY'
import json, statistics, sys
out, runs, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(path):
    with open(path) as f:
        return {j["name"]: j for j in map(json.loads, f)}
data = [[load(f"{out}/{b + 1}-{i}.json") for i in range(1, runs + 1)] for b in range(len(bins))]
print(f"{'figure':34s}" + "".join(f"{'build ' + str(b + 1):>18s}" for b in range(len(bins))))
for name in data[0][0]:
    row = f"{name:34s}"
    for runs_of in data:
        ns = statistics.median(r[name]["ns_per_op"] for r in runs_of)
        ratio = statistics.median(r[name]["ratio"] for r in runs_of)
        row += f"{ns:10.2f} ({ratio:5.1f})"
    print(row)
for b, runs_of in enumerate(data):
    scaling = sorted(r["ring_buffer_write_32b_2threads"]["scaling"] for r in runs_of
                     if "ring_buffer_write_32b_2threads" in r)
    print(f"build {b + 1}: {bins[b]}; scaling per run: {scaling}")
PY
