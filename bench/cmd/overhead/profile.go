package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"syscall"
	"time"
)

// startProfiles starts a CPU profile into cpuPath and arranges an
// allocation profile into memPath (either may be empty) and returns the
// function that stops the CPU profile and writes the allocation profile.
// Profile the ramjet code alone with, e.g.,
// `go tool pprof -focus 'ramjet-llm/ramjet/(module|edge|observe|selection)' cpu.out`.
func startProfiles(cpuPath, memPath string) (stop func() error, err error) {
	var cpu *os.File
	if cpuPath != "" {
		cpu, err = os.Create(cpuPath)
		if err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(cpu); err != nil {
			cpu.Close()
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
	}
	return func() error {
		var first error
		if cpu != nil {
			pprof.StopCPUProfile()
			if err := cpu.Close(); err != nil {
				first = fmt.Errorf("cpu profile: %w", err)
			}
		}
		if memPath != "" {
			runtime.GC() // up-to-date statistics
			f, err := os.Create(memPath)
			if err != nil {
				return fmt.Errorf("mem profile: %w", err)
			}
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil && first == nil {
				first = fmt.Errorf("mem profile: %w", err)
			}
			if err := f.Close(); err != nil && first == nil {
				first = fmt.Errorf("mem profile: %w", err)
			}
		}
		return first
	}, nil
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapCounters are the process's cumulative heap allocations, bytes and
// objects (runtime/metrics; reading them stops nothing). Unlike CPU time
// they barely move with the machine's load.
func heapCounters() (bytes, objects uint64) {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// goroutinesCreated is how many goroutines the process has started
// (runtime/metrics).
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
