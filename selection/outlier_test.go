package selection

import (
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newFakeClock() *fakeClock               { return &fakeClock{t: time.Unix(1_000_000, 0)} }
func fail(o *Outlier, s Slot, n, fleet int) bool {
	ej := false
	for range n {
		ej = o.Failure(s, FailStatus, fleet) || ej
	}
	return ej
}

func TestOutlierSteps(t *testing.T) {
	type step struct {
		op     string // fail, ok, pick, wait
		slot   Slot
		n      int
		d      time.Duration
		usable map[Slot]bool // checked after the step
	}
	cfg := OutlierConfig{ConsecutiveFailures: 3, BaseEjection: 10 * time.Second, MaxEjection: 25 * time.Second, MaxEjectedPercent: 50}
	tests := []struct {
		name  string
		fleet int
		steps []step
	}{
		{"below threshold stays in", 4, []step{
			{op: "fail", slot: 0, n: 2, usable: map[Slot]bool{0: true}},
			{op: "ok", slot: 0},
			{op: "fail", slot: 0, n: 2, usable: map[Slot]bool{0: true}},
		}},
		{"consecutive failures eject", 4, []step{
			{op: "fail", slot: 0, n: 3, usable: map[Slot]bool{0: false, 1: true}},
			{op: "wait", d: 9 * time.Second, usable: map[Slot]bool{0: false}},
		}},
		{"half-open probe success re-admits", 4, []step{
			{op: "fail", slot: 0, n: 3},
			{op: "wait", d: 10 * time.Second, usable: map[Slot]bool{0: true}},
			{op: "pick", slot: 0, usable: map[Slot]bool{0: false}}, // one probe only
			{op: "ok", slot: 0, usable: map[Slot]bool{0: true}},
			{op: "fail", slot: 0, n: 2, usable: map[Slot]bool{0: true}},
		}},
		{"half-open probe failure re-ejects longer, capped", 4, []step{
			{op: "fail", slot: 0, n: 3},
			{op: "wait", d: 10 * time.Second},
			{op: "pick", slot: 0},
			{op: "fail", slot: 0, n: 1, usable: map[Slot]bool{0: false}},
			{op: "wait", d: 19 * time.Second, usable: map[Slot]bool{0: false}}, // 2 x base
			{op: "wait", d: time.Second, usable: map[Slot]bool{0: true}},
			{op: "pick", slot: 0},
			{op: "fail", slot: 0, n: 1},
			{op: "wait", d: 24 * time.Second, usable: map[Slot]bool{0: false}}, // 3 x base capped at 25s
			{op: "wait", d: time.Second, usable: map[Slot]bool{0: true}},
		}},
		{"stale probe frees the door", 4, []step{
			{op: "fail", slot: 0, n: 3},
			{op: "wait", d: 10 * time.Second},
			{op: "pick", slot: 0, usable: map[Slot]bool{0: false}},
			{op: "wait", d: 11 * time.Second, usable: map[Slot]bool{0: true}},
		}},
		{"late answers while ejected change nothing", 4, []step{
			{op: "fail", slot: 0, n: 3},
			{op: "ok", slot: 0, usable: map[Slot]bool{0: false}},
			{op: "fail", slot: 0, n: 5, usable: map[Slot]bool{0: false}},
			{op: "wait", d: 10 * time.Second, usable: map[Slot]bool{0: true}},
		}},
		{"cut streams eject after ConsecutiveCuts", 4, []step{
			{op: "cut", slot: 0, n: 1, usable: map[Slot]bool{0: true}},
			{op: "cut", slot: 0, n: 1, usable: map[Slot]bool{0: false, 1: true}},
		}},
		{"a cut weighs ConsecutiveFailures/ConsecutiveCuts failures", 4, []step{
			{op: "cut", slot: 0, n: 1},
			{op: "fail", slot: 0, n: 1, usable: map[Slot]bool{0: true}}, // 1.5 + 1 of 3
			{op: "fail", slot: 0, n: 1, usable: map[Slot]bool{0: false}},
		}},
		{"success resets a run of cuts", 4, []step{
			{op: "cut", slot: 0, n: 1},
			{op: "ok", slot: 0},
			{op: "cut", slot: 0, n: 1, usable: map[Slot]bool{0: true}},
		}},
		{"cap on ejected share", 4, []step{
			{op: "fail", slot: 0, n: 3},
			{op: "fail", slot: 1, n: 3},
			{op: "fail", slot: 2, n: 10, usable: map[Slot]bool{0: false, 1: false, 2: true, 3: true}},
		}},
		{"one replica may always be ejected", 1, []step{
			{op: "fail", slot: 0, n: 3, usable: map[Slot]bool{0: false}},
		}},
		{"a re-admitted slot frees cap room", 2, []step{
			{op: "fail", slot: 0, n: 3},
			{op: "fail", slot: 1, n: 3, usable: map[Slot]bool{0: false, 1: true}},
			{op: "wait", d: 10 * time.Second},
			{op: "pick", slot: 0},
			{op: "ok", slot: 0},
			{op: "fail", slot: 1, n: 3, usable: map[Slot]bool{0: true, 1: false}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			o := NewOutlier(cfg, c.now)
			for i, st := range tc.steps {
				switch st.op {
				case "fail":
					fail(o, st.slot, st.n, tc.fleet)
				case "cut":
					for range st.n {
						o.Failure(st.slot, FailCut, tc.fleet)
					}
				case "ok":
					o.Success(st.slot)
				case "pick":
					o.Picked(st.slot)
				case "wait":
					c.advance(st.d)
				}
				for s, want := range st.usable {
					if got := o.Usable(s); got != want {
						t.Fatalf("step %d (%s): Usable(%d) = %v, want %v", i, st.op, s, got, want)
					}
				}
			}
		})
	}
}

func TestOutlierMultiplierResetsAfterGoodBehaviour(t *testing.T) {
	c := newFakeClock()
	o := NewOutlier(OutlierConfig{ConsecutiveFailures: 1, BaseEjection: 10 * time.Second, MaxEjection: time.Minute}, c.now)
	o.Failure(0, FailCut, 4)
	c.advance(10 * time.Second)
	o.Picked(0)
	o.Success(0)
	// Ejected again soon: twice the base.
	o.Failure(0, FailCut, 4)
	c.advance(19 * time.Second)
	if o.Usable(0) {
		t.Fatal("second ejection shorter than 2 x base")
	}
	c.advance(time.Second)
	o.Picked(0)
	o.Success(0)
	// Good for longer than MaxEjection: back to the base.
	c.advance(2 * time.Minute)
	o.Failure(0, FailCut, 4)
	c.advance(10 * time.Second)
	if !o.Usable(0) {
		t.Fatal("multiplier did not reset after good behaviour")
	}
	if got := o.Ejections(0, FailCut); got != 3 {
		t.Fatalf("Ejections(cut) = %d, want 3", got)
	}
}

func TestOutlierOff(t *testing.T) {
	o := NewOutlier(OutlierConfig{ConsecutiveFailures: -1}, nil)
	if fail(o, 0, 100, 4) || !o.Usable(0) {
		t.Fatal("ejected with detection off")
	}
}

func TestOutlierValidate(t *testing.T) {
	for _, c := range []OutlierConfig{
		{BaseEjection: -1},
		{BaseEjection: time.Minute, MaxEjection: time.Second},
		{MaxEjectedPercent: 101},
	} {
		if c.Validate() == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	var c OutlierConfig
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestOutlierUsableAllocs(t *testing.T) {
	o := NewOutlier(OutlierConfig{}, nil)
	if n := testing.AllocsPerRun(100, func() {
		o.Usable(3)
		o.Success(3)
	}); n != 0 {
		t.Fatalf("Usable+Success allocate %v", n)
	}
}
