package selection

// specialIndex returns the index of the first byte of s that is '"',
// '\\' or a control character, len(s) when none (control_amd64.s, SSE2,
// part of the amd64 baseline); len(s) >= 16.
//
//go:noescape
func specialIndex(s []byte) int
