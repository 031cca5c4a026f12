package selection

// controlBlocks reports whether s[:len(s)&^63] holds a byte below 0x20
// (control_amd64.s, SSE2, part of the amd64 baseline).
//
//go:noescape
func controlBlocks(s []byte) bool
