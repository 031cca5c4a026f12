package module

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// TestSoakMixedFaults: 16 streaming clients without retries through
// deploy/Caddyfile (RJ_ENGINE_TIMEOUT=hungEngineTimeout) to 4 engines, one answering 500
// to everything and one accepting and never answering, while the admin
// API reloads the config; every stream must end with [DONE] (no lost,
// hung (60s client timeout) or truncated request). The short version runs
// in CI; RAMJET_SOAK=<reloads> runs a long one (e.g. RAMJET_SOAK=100).
// Issue 15, the reliability suite.
func TestSoakMixedFaults(t *testing.T) {
	reloads, perPhase := 3, int64(3)
	if v := os.Getenv("RAMJET_SOAK"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("RAMJET_SOAK=%q: want a number of reloads", v)
		}
		reloads, perPhase = n, 20
	}
	ss := startSims(t, 4, enginesim.Options{})
	if err := ss[0].SetFaults(enginesim.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	if err := ss[1].SetFaults(enginesim.Faults{HangBeforeFirstToken: true}); err != nil {
		t.Fatal(err)
	}
	d := loadDeployAdmin(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":       strings.Join(ss.dials(), ","),
		"RJ_ENGINE_TIMEOUT": hungEngineTimeout.String(),
	})
	var st trafficStats
	counts, stop := runStreamers(t, 16, d.base, ss[0].Model(), &st)
	defer stop()
	everyClientAdvanced(t, counts, make([]int64, 16), perPhase)
	for range reloads {
		before := counts()
		d.forceReload(t)
		everyClientAdvanced(t, counts, before, perPhase)
	}
	stop()
	t.Logf("%d reloads, engines 500/hung/ok/ok: %d streams ok, %d failed; generation requests per engine (the injected 500s are not counted) %v",
		reloads, st.ok.Load(), st.failed.Load(), ss.requests())
	if n := st.failed.Load(); n != 0 {
		t.Errorf("%d of %d streams failed; first: %s", n, n+st.ok.Load(), strings.Join(st.errs, "; "))
	}
}
