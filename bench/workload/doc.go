// Package workload defines ramjet's benchmark workloads: the numeric trace
// format shared by the fleet simulation (bench/fleetsim) and the load
// generator, seeded generators for every named workload, and a
// deterministic synthesis of token ids from a trace row.
//
// A trace holds numbers only: arrival time, session, turn, shared-prefix
// group, token counts and the closed-loop dependency of each request. No
// prompt content is ever stored; Synth turns a row into token ids with
// exactly the structure the numbers describe: requests of one group begin
// with the same prefix tokens, and a session's turn N+1 begins with turn N's
// prompt followed by turn N's output.
//
// It also reads Mooncake-style JSONL traces (ReadMooncake: timestamp,
// input_length, output_length, hash_ids per row), the format the published
// router benchmark traces use, and writes traces of that format
// (GenerateMooncake) for tests.
package workload
