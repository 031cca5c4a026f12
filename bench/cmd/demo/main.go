package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ramjet-llm/ramjet/bench/demo"

	// The standard Caddy modules and ramjet's.
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/ramjet-llm/ramjet/directive"
	_ "github.com/ramjet-llm/ramjet/module"
)

func main() {
	var o demo.Options
	flag.IntVar(&o.Engines, "engines", 4, "simulated engines")
	flag.IntVar(&o.Agents, "agents", 8, "concurrent agent sessions")
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:8000", "ramjet's client port (OpenAI API, /health)")
	flag.StringVar(&o.OpsListen, "ops", "127.0.0.1:9090", "ops port (metrics, dashboard)")
	flag.StringVar(&o.AdminListen, "admin", "127.0.0.1:2019", "Caddy admin API")
	flag.Float64Var(&o.TimeScale, "time-scale", 4, "how much faster than real time the engines run")
	flag.DurationVar(&o.Duration, "duration", 0, "stop after this long (0: until Ctrl-C)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := demo.Run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
