package selection

// stringRun returns the index of the first byte of s that is '"', a
// control character, or a backslash that does not start a two-byte
// escape, len(s) when none, skipping the two-byte escapes on the way
// (esc: there was one) (control_amd64.s, SSE2, part of the amd64
// baseline); len(s) >= 16.
//
//go:noescape
func stringRun(s []byte) (k int, esc bool)
