// Package demo runs ramjet in front of a simulated fleet with a gentle
// multi-session agent workload: the README's first quick-start command
// (go run ./bench/cmd/demo). No GPU and no engine to install: the engines
// are bench/enginesim simulators on 127.0.0.1, and ramjet is an in-process
// Caddy running the production configuration (deploy/Caddyfile).
package demo
