//go:build !amd64

package selection

// specialIndex returns the index of the first byte of s that is '"',
// '\\' or a control character, len(s) when none; len(s) >= 16.
func specialIndex(s []byte) int { return specialIndexSWAR(s) }
