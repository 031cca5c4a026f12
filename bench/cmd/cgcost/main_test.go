package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cgFile is a callgrind out file in the shape --dump-instr=yes writes:
// two positions, compressed names, a call whose inclusive cost must not
// count as the caller's self cost, and a trailing event left out (0).
func cgFile(pick, parse, call int) string {
	return strings.NewReplacer("PICK", itoa(pick), "PARSE", itoa(parse), "CALL", itoa(call)).Replace(`# callgrind format
version: 1
positions: instr line
events: Ir I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim
summary: 1

ob=(1) /bin/x
fl=(1) router.go
fn=(1) github.com/ramjet-llm/ramjet/selection.(*Router).Pick
0x10 5 PICK 2 1 0 0 0 0 3 1
cfn=(2) runtime.memmove
calls=4 0x40 9
0x14 6 CALL 9 9 9 9 9 9 9 9 9 9
fn=(2)
0x40 9 PARSE 1 0 0 1 0 0 0 0 0 1
fn=(3) runtime.findRunnable
0x80 1 7
fl=(2) chain_test.go
fn=(4) github.com/ramjet-llm/ramjet/module.(*chainRequest).start
0xc0 3 PICK
+0x40 4 PICK
`)
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(b[i:])
		}
	}
}

func TestSlopePerRequest(t *testing.T) {
	dir := t.TempDir()
	short, long := filepath.Join(dir, "a.out"), filepath.Join(dir, "b.out")
	// 10 requests: Pick 100, memmove 40; 30 requests: Pick 300, memmove 120.
	if err := os.WriteFile(short, []byte(cgFile(100, 40, 100000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(long, []byte(cgFile(300, 120, 900000)), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := loadRun(short + ":10")
	if err != nil {
		t.Fatal(err)
	}
	b, err := loadRun(long + ":30")
	if err != nil {
		t.Fatal(err)
	}
	s, err := slope(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if !s.simulated {
		t.Fatal("cache and branch events not seen")
	}
	pick := s.fns["github.com/ramjet-llm/ramjet/selection.(*Router).Pick"]
	if pick["Ir"] != 10 || pick["I1mr"] != 0 || pick["Bcm"] != 0 {
		t.Errorf("Pick per request %v, want Ir 10 and no I1 or mispredict slope (the call's inclusive cost is not Pick's)", pick)
	}
	mm := s.fns["runtime.memmove"]
	if mm["Ir"] != 4 || mm["Bim"] != 0 {
		t.Errorf("memmove per request %v, want Ir 4", mm)
	}
	if got := s.fns["runtime.findRunnable"]["Ir"]; got != 0 {
		t.Errorf("findRunnable per request %v, want 0 (the same in both runs)", got)
	}
	// Lines: Pick's cost line (0x10; the call's 0x14 is the callee's
	// cost) and memmove's each one 64-byte line; the test file's function
	// two (0xc0, 0x100 relative to it), in the harness.
	if s.lines["github.com/ramjet-llm/ramjet/selection.(*Router).Pick"] != 1 || s.lines["runtime.memmove"] != 1 ||
		s.lines["runtime.findRunnable"] != 0 {
		t.Errorf("lines %v, want Pick 1, memmove 1, findRunnable 0", s.lines)
	}
	if got := s.part("github.com/ramjet-llm/ramjet/module.(*chainRequest).start"); got != "harness" || s.partLines["harness"] != 2 || s.partLines["ramjet"] != 1 {
		t.Errorf("the _test.go function's part %q, lines by part %v; want harness with 2 lines, ramjet 1", got, s.partLines)
	}
	var out bytes.Buffer
	s.write(&out, 2)
	for _, want := range []string{"ramjet", "runtime", "scheduler", "steady", "estA", "lines"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCosts(t *testing.T) {
	c := costs{"Ir": 1000, "I1mr": 10, "D1mr": 4, "D1mw": 1, "ILmr": 2, "DLmr": 1, "DLmw": 0, "Bcm": 3, "Bim": 1}
	if got, want := c.estA(), 1000.0+10*15+15*4; got != want {
		t.Errorf("estA %v, want %v", got, want)
	}
	if got, want := c.estB(), 1000.0+14*15+50*3+15*4; got != want {
		t.Errorf("estB %v, want %v", got, want)
	}
}

func TestPartOf(t *testing.T) {
	tests := []struct{ give, want string }{
		{"github.com/ramjet-llm/ramjet/selection.(*Router).Pick", "ramjet"},
		{"github.com/ramjet-llm/ramjet/bench/cmd/overhead.client", "harness"},
		{"github.com/caddyserver/caddy/v2/modules/caddyhttp.(*Server).ServeHTTP", "caddy"},
		{"net/http.(*conn).serve", "net"},
		{"internal/poll.(*FD).Read", "net"},
		{"runtime.findRunnable", "scheduler"},
		{"runtime.scanObjectsSmall", "collector"},
		{"runtime.mallocgcSmallScanNoHeader", "runtime"},
		{"internal/runtime/maps.(*Iter).Next", "runtime"},
		{"encoding/json.checkValid", "std"},
	}
	for _, tt := range tests {
		if got := partOf(tt.give); got != tt.want {
			t.Errorf("partOf(%q) = %q, want %q", tt.give, got, tt.want)
		}
	}
}

func TestParseCount(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ov.json")
	js := `[{"scenario":"small","targets":{"ramjet":{"requests":231}}},{"scenario":"small","targets":{"ramjet":{"requests":4}}}]`
	if err := os.WriteFile(p, []byte(js), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		give string
		want float64
	}{{"6000", 6000}, {p, 235}} {
		got, err := parseCount(tt.give)
		if err != nil || got != tt.want {
			t.Errorf("parseCount(%q) = %v, %v; want %v", tt.give, got, err, tt.want)
		}
	}
	if _, err := parseCount(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("a missing file parsed")
	}
}

func TestSlopeRejects(t *testing.T) {
	a := &profile{events: []string{"Ir"}, self: map[string][]int64{}, count: 10}
	if _, err := slope(a, &profile{events: []string{"Ir"}, self: map[string][]int64{}, count: 10}); err == nil {
		t.Error("equal counts accepted")
	}
	if _, err := slope(a, &profile{events: []string{"Ir", "I1mr"}, self: map[string][]int64{}, count: 20}); err == nil {
		t.Error("different events accepted")
	}
}
