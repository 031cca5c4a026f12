package selection

import "testing"

// TestHold: a reservation set after the end is released at once; End
// releases the current one, once.
func TestHold(t *testing.T) {
	var c Config
	c.SetDefaults()
	r, cands := newTestRouter(t, c, 2)
	s0, s1 := cands[0].Slot, cands[1].Slot
	var h Hold
	h.Set(r.Reserve(s0, 100))
	h.Set(r.Reserve(s1, 100)) // a retry: the first is released
	if in, _ := r.Load(s0); in != 0 {
		t.Fatalf("replaced reservation still held: %d", in)
	}
	if !h.End() || h.End() || !h.Ended() {
		t.Fatal("End must report the first end only")
	}
	if in, _ := r.Load(s1); in != 0 {
		t.Fatalf("ended request still reserved: %d", in)
	}
	h.Set(r.Reserve(s0, 100)) // after the end
	if in, _ := r.Load(s0); in != 0 {
		t.Fatalf("reservation set after the end kept: %d", in)
	}
}
