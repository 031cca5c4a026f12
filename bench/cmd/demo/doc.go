// Command demo runs ramjet in front of an embedded simulated fleet of four
// engines and drives a gentle multi-session agent workload through it,
// printing where to look and a live summary. Ctrl-C stops everything.
//
//	go run ./bench/cmd/demo
package main
