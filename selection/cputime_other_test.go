//go:build !unix

package selection

func processCPU() int64 { return 0 }
