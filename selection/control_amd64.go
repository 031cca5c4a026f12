package selection

// stringRun returns the index of the first byte of s that is '"', a
// control character, or a backslash that does not start a two-byte
// escape, len(s) when none, skipping the two-byte escapes on the way
// (esc: there was one) (control_amd64.s: AVX2 when useAVX2, else SSE2,
// part of the amd64 baseline); len(s) >= 16.
//
//go:noescape
func stringRun(s []byte) (k int, esc bool)

// useAVX2 has stringRun take 64 bytes a step with AVX2 (tests turn it off
// to check the SSE2 path).
var useAVX2 = cpuAVX2()

// cpuAVX2 reports AVX2 usable (the CPU has it, the OS saves its state).
//
//go:noescape
func cpuAVX2() bool
