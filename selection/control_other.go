//go:build !amd64

package selection

// controlBlocks reports whether s[:len(s)&^63] holds a byte below 0x20.
func controlBlocks(s []byte) bool { return hasControlSWAR(s[:len(s)&^63]) }
