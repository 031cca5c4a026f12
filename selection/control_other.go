//go:build !amd64

package selection

// stringRun returns the index of the first byte of s that is '"', a
// control character, or a backslash that does not start a two-byte
// escape, len(s) when none, skipping the two-byte escapes on the way
// (esc: there was one); len(s) >= 16.
func stringRun(s []byte) (k int, esc bool) { return stringRunSWAR(s) }

// useAVX2 is the amd64 scan's switch; off here.
var useAVX2 = false
