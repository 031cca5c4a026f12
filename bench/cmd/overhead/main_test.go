package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"
)

// TestOverheadSmoke runs the benchmark briefly and checks every cell
// measured requests without errors and the ratios are computed.
func TestOverheadSmoke(t *testing.T) {
	for _, eng := range []string{"sim", "echo"} {
		t.Run(eng, func(t *testing.T) { overheadSmoke(t, eng) })
	}
}

func overheadSmoke(t *testing.T, eng string) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-engine", eng, "-engines", "2", "-concurrency", "2", "-rounds", "1", "-round", "150ms", "-bodies", "4", "-json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rows []row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3", len(rows))
	}
	for _, r := range rows {
		for _, name := range []string{"direct", "round_robin", "ramjet"} {
			m := r.Targets[name]
			if m.Requests == 0 || m.Errors != 0 || m.P50 <= 0 || m.P99 < m.P50 || m.CPUPerReq <= 0 {
				t.Errorf("%s via %s: %+v", r.Scenario, name, m)
			}
		}
		if r.RPSCB <= 0 || r.P50CA <= 0 || r.CPUCB <= 0 {
			t.Errorf("%s: ratios not computed: %+v", r.Scenario, r)
		}
	}
	if got := markdown(rows, [3]string{"direct", "round_robin", "ramjet"}); !bytes.Contains([]byte(got), []byte("| long-256KiB |")) {
		t.Errorf("markdown:\n%s", got)
	}
}

func TestOverheadBodies(t *testing.T) {
	b := &bench{bodies: 3, model: "sim"}
	sc := scenario{name: "long", promptBytes: 256 << 10, maxTokens: 1}
	one, two := b.bodiesFor(sc), b.bodiesFor(sc)
	for i := range one {
		if !bytes.Equal(one[i], two[i]) {
			t.Fatalf("body %d differs between two builds", i)
		}
		if n := len(one[i]); n < 256<<10 || n > 257<<10 {
			t.Fatalf("body %d is %d bytes, want about 256 KiB", i, n)
		}
	}
	if bytes.Equal(one[0], one[1]) {
		t.Fatal("bodies 0 and 1 are equal")
	}
}

// TestOverheadParts runs -parts and -spin briefly: the guard, observer and
// spin sites in front of round_robin are measured without errors, and each
// target's ratio to round_robin and extra CPU are reported, in JSON and
// Markdown.
func TestOverheadParts(t *testing.T) {
	args := []string{"-engine", "echo", "-engines", "2", "-concurrency", "2", "-rounds", "1", "-round", "150ms", "-bodies", "4", "-scenarios", "small", "-parts", "-spin", "20us"}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), append(args, "-json"), &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rows []row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rows))
	}
	r := rows[0]
	for _, name := range []string{nameRRGuard, nameRRGuardObserve, nameRRSpin, nameRamjet} {
		m := r.Targets[name]
		if m.Requests == 0 || m.Errors != 0 || m.CPUPerReq <= 0 {
			t.Errorf("%s: %+v", name, m)
		}
		if r.PartsRPSOverB[name] <= 0 {
			t.Errorf("%s: no ratio to round_robin: %+v", name, r.PartsRPSOverB)
		}
		if _, ok := r.PartsCPUExtraUS[name]; !ok {
			t.Errorf("%s: no extra CPU: %+v", name, r.PartsCPUExtraUS)
		}
	}
	if _, ok := r.PartsRPSOverB[nameDirect]; ok {
		t.Errorf("direct among the parts: %+v", r.PartsRPSOverB)
	}
	got := partsMarkdown(rows)
	if !bytes.Contains([]byte(got), []byte("| small |")) || !bytes.Contains([]byte(got), []byte(nameRRGuardObserve)) ||
		!bytes.Contains([]byte(got), []byte(nameRRSpin)) {
		t.Errorf("parts markdown:\n%s", got)
	}
}

// TestSpinFor: the spin handler's wait lasts at least its duration.
func TestSpinFor(t *testing.T) {
	start := time.Now()
	spinFor(2 * time.Millisecond)
	if el := time.Since(start); el < 2*time.Millisecond {
		t.Fatalf("spun %v, want at least 2ms", el)
	}
}
