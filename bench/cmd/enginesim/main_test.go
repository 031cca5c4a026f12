package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		give    []string
		wantErr string
		check   func(t *testing.T, c config)
	}{
		{name: "defaults", check: func(t *testing.T, c config) {
			if c.opts.Model != "qwen3-32b" || c.opts.Engine.CapacityTokens != 259136 || c.opts.Engine.MaxRunningSeqs != 1024 ||
				c.opts.Faults.SpecAcceptance != nil || c.opts.KVEvents.Encoding != "array" {
				t.Errorf("defaults %+v", c.opts)
			}
		}},
		{name: "all groups", give: []string{"-dp", "4", "-time-scale", "20", "-spec-tokens", "3", "-kv-events-endpoint", "tcp://127.0.0.1:5557",
			"-kv-encoding", "map", "-fault-latency", "250ms", "-fault-spec-acceptance", "0.05", "-max-num-seqs", "8"},
			check: func(t *testing.T, c config) {
				o := c.opts
				if o.DP != 4 || o.TimeScale != 20 || o.Engine.SpecTokens != 3 || o.KVEvents.Encoding != "map" ||
					o.Faults.Latency != 250*time.Millisecond || *o.Faults.SpecAcceptance != 0.05 || o.Engine.MaxRunningSeqs != 8 {
					t.Errorf("parsed %+v", o)
				}
			}},
		{name: "unknown flag", give: []string{"-nope"}, wantErr: "not defined"},
		{name: "stray arg", give: []string{"extra"}, wantErr: "unexpected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(tt.give, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-instant", "-kv-events-endpoint", "tcp://127.0.0.1:0"}, w, io.Discard)
		w.Close()
	}()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, r)
	url := line[strings.LastIndex(line, " ")+1 : len(line)-1]
	res, err := http.Get(url + "/health")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("health: %v %v", err, res)
	}
	res.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop")
	}
}

func TestWriteFixturesFlag(t *testing.T) {
	dir := t.TempDir()
	if err := run(context.Background(), []string{"-write-kv-fixtures", dir}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "map-uint", "manifest.json")); err != nil {
		t.Fatal(err)
	}
}
