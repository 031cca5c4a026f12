#!/bin/sh
# precise_grid.sh: the powered grid of `ramjet-precise` against `ramjet` (EXPERIMENTS 108, helper prec28).
# One fleetsim process per draw (one seed / trace x rate), both policies paired in it; every draw writes
# OUT/<cell>__<draw>.json and is skipped when that file exists, so the grid resumes. Jobs run in the order of
# the list below (the most informative cells first), JOBS at a time (default 2). Summarise with precise_grid.py.
#
#   go build -o /tmp/fs ./bench/cmd/fleetsim
#   FS=/tmp/fs OUT=/tmp/grid TRACES=/tmp/traces JOBS=2 sh bench/scripts/precise_grid.sh [list|run] [GROUP...]
#
# Groups (default: all, in this order): tool65k-r1 syn af-low tool65k-rest af-full tool196k-r1 toolDef-r1 sp196k r64
# afrest tool196k-rest toolDef-rest r64conv
# Tool-agent traces N = 1..12 are written to TRACES first (fs -write-trace toolN.jsonl -gen-trace tool-agent -seed N),
# and conversation traces N = 1..6 (convN.jsonl, -gen-trace conversation) for r64conv. Held out (not in the default
# list; NTRACES=60 writes their traces): tool65k-held (traces 13-36 x 0.99/1/1.01, 37-60 at 1), sp-held (shared-prefix
# seeds 13-24 at the default KV), cellB-held (seeds 13-24 at 196,608); give them their own OUT to keep them apart
# from the grid's cells of the same name (in one OUT they pool).
set -eu
FS=${FS:-/tmp/fs}
OUT=${OUT:-/tmp/precise_grid}
TRACES=${TRACES:-$OUT/traces}
JOBS=${JOBS:-2}
POL=${POL:-ramjet,ramjet-precise}   # e.g. POL='ramjet,ramjet-precise,ramjet-precise@qx'
mode=${1:-run}
[ $# -gt 0 ] && shift
groups=${*:-tool65k-r1 syn af-low tool65k-rest af-full tool196k-r1 toolDef-r1 sp196k r64 afrest tool196k-rest toolDef-rest r64conv}
mkdir -p "$OUT" "$TRACES"
for n in $(seq 1 ${NTRACES:-12}); do
	[ -s "$TRACES/tool$n.jsonl" ] || "$FS" -write-trace "$TRACES/tool$n.jsonl" -gen-trace tool-agent -seed "$n" >/dev/null
done
for n in 1 2 3 4 5 6; do
	[ -s "$TRACES/conv$n.jsonl" ] || "$FS" -write-trace "$TRACES/conv$n.jsonl" -gen-trace conversation -seed "$n" >/dev/null
done
SEEDS='1 2 3 4 5 6 7 8 9 10 11 12'

# job line: <cell>__<draw> <fleetsim arguments...>
tool() { # kv (0 = preset) rates
	kv=$1; rates=$2
	kva=''; [ "$kv" != 0 ] && kva="-kv-capacity $kv"
	for r in $rates; do for n in $SEEDS; do
		echo "tool_kv$kv""__t$n""_r$r -trace $TRACES/tool$n.jsonl -replicas 8 -seeds $n $kva -trace-time-scale $r"
	done; done
}
af() { # scale kv
	kva=''; [ "$2" != 0 ] && kva="-kv-capacity $2"
	for s in $SEEDS; do echo "af_sc$1_kv$2__s$s -workload agent-fleet -replicas 8 -seeds $s -scale $1 $kva"; done
}
syn() { # kv workloads
	kva=''; [ "$1" != 0 ] && kva="-kv-capacity $1"
	for s in $SEEDS; do echo "syn_kv$1__s$s -workload $2 -replicas 8 -seeds $s $kva"; done
}
jobs() {
	for g in $groups; do case $g in
	tool65k-r1) tool 65536 1 ;;
	tool65k-rest) tool 65536 '0.98 1.02 0.99 1.01' ;;
	af-low) af 0.25 65536; af 0.5 65536; af 0.5 131072; af 1 65536 ;;
	af-full) af 1 131072; af 1 0 ;;
	syn) syn 65536 shared-prefix,hotspot,burst,locality,spec-pair; syn 0 shared-prefix,hotspot,burst,locality,spec-pair ;;
	tool196k-r1) tool 196608 1 ;;
	toolDef-r1) tool 0 1 ;;
	afrest) af 0.5 0; af 0.25 131072; af 0.25 0 ;;
	sp196k) syn 196608 shared-prefix ;;
	tool196k-rest) tool 196608 '0.98 1.02 0.99 1.01' ;;
	toolDef-rest) tool 0 '0.98 1.02 0.99 1.01' ;;
	r64) for s in 1 2 3 4 5 6; do
		echo "r64_af__s$s -workload agent-fleet -replicas 64 -seeds $s"
		echo "r64_sp__s$s -workload shared-prefix -replicas 64 -seeds $s"
	     done ;;
	tool65k-held) (SEEDS=$(seq 13 36); tool 65536 '0.99 1 1.01'); (SEEDS=$(seq 37 60); tool 65536 1) ;;
	sp-held) (SEEDS=$(seq 13 24); syn 0 shared-prefix) ;;
	cellB-held) (SEEDS=$(seq 13 24); syn 196608 shared-prefix) ;;
	r64conv) for n in 1 2 3 4 5 6; do echo "r64_conv__s$n -trace $TRACES/conv$n.jsonl -replicas 64 -seeds $n"; done ;;
	*) echo "unknown group $g" >&2; exit 2 ;;
	esac; done
}
# xargs -L continues a line ending in a blank: strip trailing blanks.
if [ "$mode" = list ]; then jobs | sed 's/ *$//'; exit 0; fi
export FS OUT POL
jobs | sed 's/ *$//' | xargs -P "$JOBS" -L 1 sh -c '
	name=$0; f="$OUT/$name.json"
	[ -s "$f" ] && exit 0
	"$FS" "$@" -parallel 1 -policy "$POL" -json "$f.tmp" >"$OUT/$name.log" 2>&1 && mv "$f.tmp" "$f" || echo "failed: $name" >&2'
