// Command cgcost turns two callgrind runs of one workload, a short and a
// long one, into costs per request (or per benchmark op): the slope of
// every event between the runs, so that start-up and the runs' common
// work drop out. It groups functions by part (ramjet's own code, the bench
// harness, Caddy, net/http and the network, the collector, the scheduler,
// the rest of the runtime, the rest of the standard library) and prices
// each part with two cycle models, for the runs made with
// --cache-sim=yes --branch-sim=yes:
//
//	estA = Ir + 10*(I1 + D1 misses) + 15*mispredicts
//	estB = Ir + 14*(I1 + D1 misses) + 50*LL misses + 15*mispredicts
//
// (estA is the crude model of bench/RESULTS.md; estB prices a level-1 miss
// that hits the last level as an L2 hit of this machine's AMD Zen 4, about
// 14 cycles, and a last-level miss as an L3 hit, about 50 more.) Both
// count every instruction as a cycle: they rank and compare, they do not
// predict a run's time. Without cache or branch simulation only Ir is
// reported. "steady" is the total without the collector and the scheduler,
// whose counts swing between runs.
//
// The overhead benchmark, one target per process (issue 11's recipe):
//
//	go build -trimpath -o ov ./bench/cmd/overhead
//	GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=callgrind --cache-sim=yes --branch-sim=yes \
//	    --I1=32768,8,64 --D1=32768,8,64 --LL=1048576,8,64 --callgrind-out-file=cg-ramjet-$d.out \
//	    ./ov -engine echo -targets ramjet -concurrency 16 -rounds 1 -round $d -scenarios small -json > ov-ramjet-$d.json
//	# d = 5s, 20s
//	go run ./bench/cmd/cgcost cg-ramjet-5s.out:ov-ramjet-5s.json cg-ramjet-20s.out:ov-ramjet-20s.json
//
// Each argument is FILE:COUNT, COUNT being the run's requests or ops, or
// the overhead command's -json output, whose requests it sums.
//
// Runs made with --dump-instr=yes (and --compress-pos=no, or not) also get
// a "lines" column: the distinct 64-byte code lines a part or function
// touches per request (those whose instructions' Ir slope is at least
// 0.5), the code footprint that the I1 misses follow. Functions of
// _test.go files count as the harness (a package benchmark's stand-ins),
// e.g. for module's BenchmarkWholeChain:
//
//	go test -c -o m.test ./module
//	GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=callgrind --cache-sim=yes --branch-sim=yes \
//	    --I1=32768,8,64 --D1=32768,8,64 --LL=1048576,8,64 --dump-instr=yes --compress-pos=no \
//	    --callgrind-out-file=cg-$n.out ./m.test -test.run XXX -test.bench 'WholeChain/1KiB' -test.benchtime ${n}x -test.cpu 1
//	# n = 2000, 6000
//	go run ./bench/cmd/cgcost cg-2000.out:2000 cg-6000.out:6000
package main
