// Command fleetsim runs the fleet simulation: every routing policy on every
// workload, over simulated engines, and prints one table per workload.
//
//	go run ./bench/cmd/fleetsim -workload all -replicas 8
//	go run ./bench/cmd/fleetsim -trace conversation.jsonl -replicas 16
//	go run ./bench/cmd/fleetsim -workload agent-fleet -routers 1,2,4 -front rr
package main
