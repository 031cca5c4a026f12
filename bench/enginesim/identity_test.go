package enginesim

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/integrity"
)

// TestIdentityContract: the simulator's identity answers the contract
// (read by integrity's own client), changes at run time through
// PUT /sim/identity, keeps its instance id across Restart, and serves the
// partial, malformed, unavailable and missing answers on request.
func TestIdentityContract(t *testing.T) {
	s := startSim(t, Options{Instant: true})
	ctx := context.Background()
	fetch := func() (integrity.Identity, error) {
		return integrity.FetchIdentity(ctx, http.DefaultClient, s.URL(), integrity.DefaultIdentityPath, nil, 5*time.Second)
	}
	id, err := fetch()
	if err != nil {
		t.Fatal(err)
	}
	def := DefaultIdentity(s.opts.Model)
	if id.ModelSHA256 != def.ModelSHA256 || id.TemplateSHA256 != def.TemplateSHA256 || id.TokenizerSHA256 != def.TokenizerSHA256 || id.InstanceID == "" {
		t.Fatalf("identity %+v, want the defaults %+v", id, def)
	}
	pins := integrity.Pins{ModelSHA256: def.ModelSHA256, TemplateSHA256: def.TemplateSHA256, TokenizerSHA256: def.TokenizerSHA256}
	if r := pins.Check(id); r != integrity.ReasonNone {
		t.Fatalf("default identity fails its own pins: %s", r)
	}
	s.Restart()
	if again, _ := fetch(); again.InstanceID != id.InstanceID {
		t.Fatal("restart changed the instance id")
	}
	if st, b := putJSON(t, s.URL()+"/sim/identity", `{"model_sha256":"`+Digest("other")+`","instance_id":"i2"}`); st != 200 {
		t.Fatalf("PUT /sim/identity: %d %s", st, b)
	}
	id2, err := fetch()
	if err != nil || id2.ModelSHA256 != Digest("other") || id2.InstanceID != "i2" || id2.TemplateSHA256 != def.TemplateSHA256 {
		t.Fatalf("after PUT: %+v %v", id2, err)
	}
	if r := pins.Check(id2); r != integrity.ReasonModelMismatch {
		t.Fatalf("changed weights: %s", r)
	}
	for serve, want := range map[string]integrity.Reason{"partial": integrity.ReasonPartial, "malformed": integrity.ReasonMalformed,
		"unavailable": integrity.ReasonBadStatus, "off": integrity.ReasonBadStatus} {
		if err := s.SetIdentity(Identity{Serve: serve}); err != nil {
			t.Fatal(err)
		}
		if _, err := fetch(); integrity.ReasonOf(err) != want {
			t.Errorf("serve %s: %v, want %s", serve, err, want)
		}
	}
	if err := s.SetIdentity(Identity{Serve: "bogus"}); err == nil {
		t.Error("unknown serve mode accepted")
	}
}

// TestSpecPerPositionMetrics: the per-position acceptance counters follow
// the engine, and the acceptance-collapse fault zeroes every position.
func TestSpecPerPositionMetrics(t *testing.T) {
	s := startSim(t, Options{Instant: true, Engine: engine.Config{SpecTokens: 3}})
	c := client(s)
	ctx := testCtx(t)
	src := &integrity.MetricsSource{}
	tgt := integrity.Target{BaseURL: s.URL(), Rank: -1}
	if _, err := c.Chat.Completions.New(ctx, chatParams(s, "a", 100)); err != nil {
		t.Fatal(err)
	}
	before, err := src.Spec(ctx, tgt)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for p := range before.Positions {
		sum += before.AcceptedPerPos[p]
	}
	if before.Positions != 3 || before.DraftTokens == 0 || sum != before.AcceptedTokens || before.AcceptedPerPos[0] < before.AcceptedPerPos[2] {
		t.Fatalf("per-position counters %+v", before)
	}
	setFaultsHTTP(t, s.URL(), `{"spec_acceptance":0}`)
	if _, err := c.Chat.Completions.New(ctx, chatParams(s, "b", 100)); err != nil {
		t.Fatal(err)
	}
	after, err := src.Spec(ctx, tgt)
	if err != nil {
		t.Fatal(err)
	}
	if after.DraftTokens <= before.DraftTokens || after.AcceptedTokens != before.AcceptedTokens || after.AcceptedPerPos != before.AcceptedPerPos {
		t.Fatalf("collapsed: before %+v after %+v", before, after)
	}
}

func putJSON(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}
