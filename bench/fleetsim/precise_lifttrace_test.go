package fleetsim

import (
	"bufio"
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// The decision log's lift flags (liftLMGF) mirror kvindex's lift clauses
// at their defaults: under the default stack, a candidate whose own-block
// exact overlap lies past the estimate's credit is read exactly (P1)
// exactly where all four pass, and left to the estimate (P0) where one
// fails; under @capl=0 it is never read exactly.
func TestRamjetPreciseLiftTrace(t *testing.T) {
	rows, err := workload.GenerateMooncake("tool-agent", workload.MooncakeGenOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var tr bytes.Buffer
	if err := workload.WriteMooncake(&tr, rows); err != nil {
		t.Fatal(err)
	}
	trace, err := workload.ReadMooncake(&tr, workload.MooncakeOptions{Rows: 500})
	if err != nil {
		t.Fatal(err)
	}
	w := &workload.Workload{Name: "trace:tool1", Trace: trace}
	ecfg, err := engine.PresetConfig("h200")
	if err != nil {
		t.Fatal(err)
	}
	ecfg.CapacityTokens, ecfg.MaxModelLen = 65536, 0
	field := regexp.MustCompile(`/est(\d+)/x(-?\d+)/P(\d)/own(\d)/.*/lift([-LMGF]{4})`)
	for _, name := range []string{"ramjet-precise", "ramjet-precise@capl=0"} {
		q, err := NewPolicy(name, 1, selection.Config{})
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		q.(*RamjetPrecise).SetTrace(&buf)
		if _, err := Run(Config{Workload: w, Replicas: 8, Policy: q, Salt: 1, Engine: ecfg}); err != nil {
			t.Fatal(err)
		}
		lifted, capped := 0, 0
		sc := bufio.NewScanner(&buf)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "id=") {
				continue
			}
			_, cands, _ := strings.Cut(line, "|")
			for _, c := range strings.Fields(cands) {
				m := field.FindStringSubmatch(c)
				if m == nil {
					continue
				}
				est, _ := strconv.Atoi(m[1])
				x, _ := strconv.Atoi(m[2])
				if m[4] != "1" || x <= est+64 {
					continue
				}
				read, all := m[3] == "1", m[5] == "LMGF"
				if want := all && name == "ramjet-precise"; read != want {
					t.Fatalf("%s: %q read exactly %v, lift flags %s", name, c, read, m[5])
				}
				if all {
					lifted++
				} else {
					capped++
				}
			}
		}
		t.Logf("%s: %d candidates past the estimate with every clause passing, %d with one failing", name, lifted, capped)
		if lifted == 0 || capped == 0 {
			t.Fatalf("%s: %d lifted, %d capped candidates: the test needs both", name, lifted, capped)
		}
	}
}
