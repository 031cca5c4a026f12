//go:build unix

package selection

import "syscall"

// processCPU is the CPU time the process has used, in nanoseconds (user
// and system), 0 where it is not known.
func processCPU() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
