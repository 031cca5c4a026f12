package module

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/envcheck"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/snapshot"
)

const snapTestKeyEnv = "RAMJET_TEST_SNAPSHOT_KEY"

// startSnapCaddy starts a Caddy over dials with the ramjet policy snapshot
// option snap (plus extra policy settings), its snapshot log lines (info
// and up) going to the file logs.
func startSnapCaddy(t *testing.T, dials []string, snap map[string]any, extra map[string]any, logs string) *testCaddy {
	t.Helper()
	c := &testCaddy{t: t, client: listenLocal(t), admin: listenLocal(t), ups: dials}
	c.load(c.snapConfig(snap, extra, logs))
	return c
}

// snapConfig is startSnapCaddy's config.
func (c *testCaddy) snapConfig(snap map[string]any, extra map[string]any, logs string) []byte {
	c.t.Helper()
	pol := map[string]any{"route_id_secret": "snapshot-test-route-ids", "snapshot": snap}
	for k, v := range extra {
		pol[k] = v
	}
	var cfg map[string]any
	if err := json.Unmarshal(c.config(proxyOpts{Policy: pol}), &cfg); err != nil {
		c.t.Fatal(err)
	}
	cfg["logging"] = map[string]any{"logs": map[string]any{
		"default": map[string]any{"level": "ERROR", "exclude": []string{"http.reverse_proxy.selection_policies.ramjet.snapshot"}},
		"snapshot": map[string]any{"level": "INFO", "include": []string{"http.reverse_proxy.selection_policies.ramjet.snapshot"},
			"writer": map[string]any{"output": "file", "filename": logs, "roll": false}, "encoder": map[string]any{"format": "json"}},
	}}
	b, err := json.Marshal(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

// snapConv is conversation i's first turn: a long system prompt of its
// own.
func snapConv(i int) string {
	return chatBody("qwen3-8b", false, [2]string{"system", longText(fmt.Sprintf("conversation %d", i), 6000)},
		[2]string{"user", "What does it say?"})
}

// explainOf asks the admin API where body would go and with what overlap.
func (c *testCaddy) explainOf(body string) (upstream string, bestOverlap int) {
	c.t.Helper()
	resp, b := c.do(http.MethodPost, "http://"+c.admin+"/ramjet/explain", body)
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("explain: %s: %s", resp.Status, b)
	}
	var ex struct {
		Decision struct {
			Upstream    string `json:"upstream"`
			BestOverlap int    `json:"best_overlap_tokens"`
		} `json:"decision"`
	}
	if err := json.Unmarshal(b, &ex); err != nil {
		c.t.Fatalf("decoding explain %s: %v", b, err)
	}
	return ex.Decision.Upstream, ex.Decision.BestOverlap
}

// cachedTokens reads usage.prompt_tokens_details.cached_tokens.
func cachedTokens(t *testing.T, b []byte) int {
	t.Helper()
	var r struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("decoding response %s: %v", b, err)
	}
	return r.Usage.Details.Cached
}

// loadsOf and writesOf read the default fleet's snapshot counters.
func loadsOf(outcome string) float64 {
	return testutil.ToFloat64(metrics.Snapshot().Loads.WithLabelValues(DefaultStateKey, outcome))
}

func writesOf(outcome string) float64 {
	return testutil.ToFloat64(metrics.Snapshot().Writes.WithLabelValues(DefaultStateKey, outcome))
}

const snapConvs = 6

// warmSnapshot runs a ramjet over sims with snapshots to dir, routes
// snapConvs conversations and stops it (a clean shutdown writes the
// snapshot). It returns each conversation's route id.
func warmSnapshot(t *testing.T, ss sims, path string) []string {
	t.Helper()
	writes := writesOf("ok")
	c := startSnapCaddy(t, ss.dials(), map[string]any{"path": path, "interval": "1h", "key": "{env." + snapTestKeyEnv + "}"}, nil,
		filepath.Join(t.TempDir(), "warm.log"))
	ids := make([]string, snapConvs)
	for i := range ids {
		resp, b := c.chat(snapConv(i))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("conversation %d: %s: %s", i, resp.Status, b)
		}
		ids[i] = resp.Header.Get(HeaderUpstream)
	}
	stopCaddy(t)
	if got := writesOf("ok") - writes; got != 1 {
		t.Fatalf("%v snapshots written at shutdown, want 1", got)
	}
	for _, p := range []string{path, snapshot.CompanionPath(path)} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("after shutdown: %v", err)
		}
	}
	return ids
}

// TestSnapshotRestartKeepsOverlap: a restarted ramjet loads the snapshot
// its clean shutdown wrote and routes every conversation to the replica
// that holds it, which serves it from its prefix cache.
func TestSnapshotRestartKeepsOverlap(t *testing.T) {
	t.Setenv(snapTestKeyEnv, "snapshot-test-key-0123456789")
	ss := startSims(t, 3, enginesim.Options{})
	path := filepath.Join(t.TempDir(), "index.snap")
	ids := warmSnapshot(t, ss, path)

	loaded := loadsOf("loaded")
	logs := filepath.Join(t.TempDir(), "restart.log")
	c := startSnapCaddy(t, ss.dials(), map[string]any{"path": path, "interval": "1h", "key": "{env." + snapTestKeyEnv + "}"}, nil, logs)
	// The first request shows the policy its pool: the snapshot applies.
	if resp, b := c.chat(snapConv(100)); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: %s: %s", resp.Status, b)
	}
	// The import runs beside the requests (snapshot.Writer.Bind).
	eventually(t, "ramjet_snapshot_loads_total{outcome=loaded} rising by 1", func() bool { return loadsOf("loaded")-loaded == 1 })
	eventually(t, "the load's log line", func() bool {
		b, _ := os.ReadFile(logs)
		return bytes.Contains(b, []byte(`"ramjet snapshot loaded"`))
	})
	for i, id := range ids {
		up, overlap := c.explainOf(snapConv(i))
		if up != id || overlap == 0 {
			t.Errorf("conversation %d after restart: explain picks %s with overlap %d, want %s (before the restart) with overlap > 0", i, up, overlap, id)
		}
		resp, b := c.chat(snapConv(i))
		if got := resp.Header.Get(HeaderUpstream); got != id {
			t.Errorf("conversation %d routed to %s after restart, %s before", i, got, id)
		}
		if n := cachedTokens(t, b); n == 0 {
			t.Errorf("conversation %d after restart: no cached prompt tokens", i)
		}
	}
}

// TestSnapshotRefusedStartsCold: a snapshot or companion altered after the
// write, or a snapshot of another index shape, is refused with a warning
// naming the reason and the metric; ramjet starts cold.
func TestSnapshotRefusedStartsCold(t *testing.T) {
	t.Setenv(snapTestKeyEnv, "snapshot-test-key-0123456789")
	ss := startSims(t, 3, enginesim.Options{})
	src := filepath.Join(t.TempDir(), "index.snap")
	warmSnapshot(t, ss, src)
	flip := func(name string) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			p := path
			if name == "companion" {
				p = snapshot.CompanionPath(path)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if name == "companion" {
				i := bytes.Index(b, []byte(`"mac":"`)) + len(`"mac":"`)
				b[i] ^= 1 // a hex digit becomes another
			} else {
				b[len(b)-1] ^= 1 // one block hash of one replica
			}
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name   string
		alter  func(t *testing.T, path string)
		policy map[string]any
		key    string
		want   snapshot.Reason
	}{
		{name: "snapshot altered", alter: flip("snapshot"), want: snapshot.Tampered},
		{name: "companion altered", alter: flip("companion"), want: snapshot.Tampered},
		{name: "another key", key: "another-snapshot-key-0123456789", want: snapshot.Tampered},
		// A crash between the two files of a write: the new snapshot beside
		// the previous write's companion.
		{name: "write interrupted before the companion", alter: func(t *testing.T, path string) {
			c, err := os.ReadFile(snapshot.CompanionPath(path))
			if err != nil {
				t.Fatal(err)
			}
			s, err := snapshot.Read(path, snapshot.ReadOptions{Key: []byte("snapshot-test-key-0123456789"), Shape: snapshot.ShapeOf(selection.Config{})})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := snapshot.Write(path, []byte("snapshot-test-key-0123456789"), s); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(snapshot.CompanionPath(path), c, 0o600); err != nil {
				t.Fatal(err)
			}
		}, want: snapshot.Incomplete},
		{name: "block size changed", policy: map[string]any{"block_tokens": 32}, want: snapshot.ShapeMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "index.snap")
			for _, p := range []string{src, snapshot.CompanionPath(src)} {
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(filepath.Dir(path), filepath.Base(p)), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tt.alter != nil {
				tt.alter(t, path)
			}
			if tt.key != "" {
				t.Setenv(snapTestKeyEnv, tt.key)
			}
			before, loaded := loadsOf(string(tt.want)), loadsOf("loaded")
			logs := filepath.Join(t.TempDir(), "restart.log")
			c := startSnapCaddy(t, ss.dials(), map[string]any{"path": path, "interval": "1h", "key": "{env." + snapTestKeyEnv + "}"}, tt.policy, logs)
			if resp, b := c.chat(snapConv(100)); resp.StatusCode != http.StatusOK {
				t.Fatalf("first request: %s: %s", resp.Status, b)
			}
			if got := loadsOf(string(tt.want)) - before; got != 1 {
				t.Errorf("ramjet_snapshot_loads_total{outcome=%s} rose by %v, want 1", tt.want, got)
			}
			if got := loadsOf("loaded") - loaded; got != 0 {
				t.Errorf("ramjet_snapshot_loads_total{outcome=loaded} rose by %v, want 0", got)
			}
			eventually(t, "the refusal's warning", func() bool {
				b, _ := os.ReadFile(logs)
				return bytes.Contains(b, []byte(`"level":"warn"`)) &&
					bytes.Contains(b, []byte(`"ramjet snapshot refused, starting cold"`)) &&
					bytes.Contains(b, []byte(`"reason":"`+string(tt.want)+`"`))
			})
			for i := range snapConvs {
				if _, overlap := c.explainOf(snapConv(i)); overlap != 0 {
					t.Errorf("conversation %d: overlap %d after a refused snapshot, want 0 (cold)", i, overlap)
				}
			}
			stopCaddy(t)
		})
	}
}

// TestSnapshotReplicaSetChanged: a snapshot none of whose replicas is in
// the pool is a shape mismatch; replicas of the pool that were in it keep
// their beliefs, the others are dropped.
func TestSnapshotReplicaSetChanged(t *testing.T) {
	t.Setenv(snapTestKeyEnv, "snapshot-test-key-0123456789")
	ss := startSims(t, 4, enginesim.Options{})
	path := filepath.Join(t.TempDir(), "index.snap")
	warmSnapshot(t, ss[:2], path)
	before := loadsOf(string(snapshot.ShapeMismatch))
	c := startSnapCaddy(t, ss[2:].dials(), map[string]any{"path": path, "interval": "1h", "key": "{env." + snapTestKeyEnv + "}"}, nil,
		filepath.Join(t.TempDir(), "restart.log"))
	if resp, b := c.chat(snapConv(100)); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: %s: %s", resp.Status, b)
	}
	if got := loadsOf(string(snapshot.ShapeMismatch)) - before; got != 1 {
		t.Errorf("ramjet_snapshot_loads_total{outcome=shape_mismatch} rose by %v, want 1", got)
	}
}

func TestSnapshotCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    snapshot.Settings
		wantErr string
	}{
		{name: "path only", give: `snapshot /var/lib/ramjet/index.snap`, want: snapshot.Settings{Path: "/var/lib/ramjet/index.snap"}},
		{name: "block", give: `snapshot {
			path /s
			interval 30s
			key {env.K}
			max_age 2h
			max_bytes 1MiB
		}`, want: snapshot.Settings{Path: "/s", Interval: 30e9, Key: "{env.K}", MaxAge: 7200e9, MaxBytes: 1 << 20}},
		{name: "unknown", give: "snapshot /s {\n bogus 1\n}", wantErr: "unrecognized option 'bogus'"},
		{name: "twice", give: "snapshot /s {\n interval 1s\n interval 2s\n}", wantErr: "interval specified more than once"},
		{name: "bad duration", give: "snapshot /s {\n interval soon\n}", wantErr: `snapshot interval: "soon" is not a positive duration`},
		{name: "two paths", give: "snapshot /a /b", wantErr: "snapshot: too many values"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s RamjetSelection
			err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser("ramjet {\n" + tt.give + "\n}"))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Snapshot == nil || *s.Snapshot != tt.want {
				t.Fatalf("snapshot = %+v, want %+v", s.Snapshot, tt.want)
			}
		})
	}
}

// TestSnapshotWithoutKeyServes: a missing key turns snapshots off (the
// metric says so) and ramjet serves; nothing is read or written.
func TestSnapshotWithoutKeyServes(t *testing.T) {
	t.Setenv(snapTestKeyEnv, "short")
	ss := startSims(t, 2, enginesim.Options{})
	path := filepath.Join(t.TempDir(), "index.snap")
	before := loadsOf(string(snapshot.NoKey))
	c := startSnapCaddy(t, ss.dials(), map[string]any{"path": path, "key": "{env." + snapTestKeyEnv + "}"}, nil,
		filepath.Join(t.TempDir(), "run.log"))
	if got := loadsOf(string(snapshot.NoKey)) - before; got != 1 {
		t.Errorf("ramjet_snapshot_loads_total{outcome=no_key} rose by %v, want 1", got)
	}
	if resp, b := c.chat(snapConv(0)); resp.StatusCode != http.StatusOK {
		t.Fatalf("request without a snapshot key: %s: %s", resp.Status, b)
	}
	stopCaddy(t)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a snapshot was written without a key: %v", err)
	}
}

// TestDeployCaddyfileSnapshot: the production Caddyfile turns snapshots on
// from RJ_SNAPSHOT_PATH and leaves them off without it.
func TestDeployCaddyfileSnapshot(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, envcheck.EnvPrefix) {
			t.Setenv(name, "")
		}
	}
	src := []byte(deployCaddyfile(t))
	adapt := func() *snapshot.Settings {
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "deploy/Caddyfile"})
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(out, []byte(`"snapshot":`))
		if i < 0 {
			return nil
		}
		var c snapshot.Settings
		if err := json.NewDecoder(bytes.NewReader(out[i+len(`"snapshot":`):])).Decode(&c); err != nil {
			t.Fatal(err)
		}
		return &c
	}
	t.Setenv("RJ_UPSTREAM", "127.0.0.1:8100,127.0.0.1:8200")
	if c := adapt(); c != nil {
		t.Fatalf("snapshot on without RJ_SNAPSHOT_PATH: %+v", c)
	}
	t.Setenv("RJ_SNAPSHOT_PATH", "/var/lib/ramjet/index.snap")
	t.Setenv("RJ_SNAPSHOT_INTERVAL", "30s")
	t.Setenv("RJ_SNAPSHOT_MAX_AGE", "2h")
	want := &snapshot.Settings{Path: "/var/lib/ramjet/index.snap", Interval: duration.Duration(30 * time.Second),
		MaxAge: duration.Duration(2 * time.Hour), Key: "{env.RJ_SNAPSHOT_KEY}"}
	if diff := cmp.Diff(want, adapt()); diff != "" {
		t.Errorf("snapshot (-want +got):\n%s", diff)
	}
}

// TestSnapshotReloadKeepsIndex: a config reload keeps the fleet's index in
// memory: the snapshot is neither read again nor written.
func TestSnapshotReloadKeepsIndex(t *testing.T) {
	t.Setenv(snapTestKeyEnv, "snapshot-test-key-0123456789")
	ss := startSims(t, 2, enginesim.Options{})
	snap := map[string]any{"path": filepath.Join(t.TempDir(), "index.snap"), "interval": "1h", "key": "{env." + snapTestKeyEnv + "}"}
	logs := filepath.Join(t.TempDir(), "run.log")
	c := startSnapCaddy(t, ss.dials(), snap, nil, logs)
	resp, _ := c.chat(snapConv(0))
	id := resp.Header.Get(HeaderUpstream)
	sum := func() (n float64) {
		for _, o := range snapshot.Outcomes() {
			n += loadsOf(o)
		}
		return n
	}
	loads, writes := sum(), writesOf("ok")
	postLoad(t, c.admin, c.snapConfig(snap, map[string]any{"alpha": 2}, logs)) // a knob retuned in place
	if !poll(30*time.Second, func() bool { return shutdownStacks() == "" }) {
		t.Fatalf("the old config's servers still shutting down:\n%s", shutdownStacks())
	}
	http.DefaultClient.CloseIdleConnections()
	// The new config's policy sees its pool.
	if resp, b := c.chat(snapConv(1)); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the reload: %s: %s", resp.Status, b)
	}
	if got := sum() - loads; got != 0 {
		t.Errorf("a reload read the snapshot (%v loads)", got)
	}
	if got := writesOf("ok") - writes; got != 0 {
		t.Errorf("a reload wrote %v snapshots", got)
	}
	if up, overlap := c.explainOf(snapConv(0)); up != id || overlap == 0 {
		t.Errorf("after the reload: explain picks %s with overlap %d, want %s with overlap > 0", up, overlap, id)
	}
}
