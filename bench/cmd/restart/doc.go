// Command restart measures what a ramjet restart costs in cached prompt
// tokens through real HTTP, and what the authenticated index snapshot
// (lb_policy ramjet { snapshot ... }) gives back.
//
// For every workload, seed and arm it starts fresh engine simulators and a
// real Caddy (in this process) with lb_policy ramjet in front of them, and
// replays the workload with the load generator through a switch: a
// reverse proxy on a fixed address that forwards every request to the
// running Caddy. At a third of the trace (-at) the arm does one of:
//
//   - none: nothing (the same minute without a restart);
//   - cold: the switch holds new requests, waits for those in flight,
//     stops Caddy cleanly and starts it again, without a snapshot;
//   - snapshot: the same with the snapshot option on, so that the clean
//     stop writes the index and the new Caddy loads it.
//
// The engines keep running, with their prefix caches, through the
// restart. The figure is the share of prompt tokens the engines served
// from their cache over the requests the trace schedules in the minute
// (simulated, -window) after the new Caddy is up, per run and as the
// median over the seeds.
//
//	go run ./bench/cmd/restart -workload shared-prefix,locality -seeds 1,2,3
package main
