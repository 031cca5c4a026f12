//go:build !unix

package enginesim

// holdPort does nothing where the port cannot be held without listening:
// the closed listener's port is then free for another process to take.
func holdPort(string) (func() error, error) { return func() error { return nil }, nil }
