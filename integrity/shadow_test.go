package integrity

import "testing"

func TestSessionShadow(t *testing.T) {
	s := NewSessionShadow(2)
	up := map[int]bool{0: true, 1: true, 2: true}
	usable := func(i int) bool { return up[i] }
	steps := []struct {
		session    uint64
		chosen     int
		down       int // slot taken down before the step, -1 none
		want       ShadowOutcome
		wantSticky int
	}{
		{1, 0, -1, ShadowNew, 0},
		{1, 0, -1, ShadowAgree, 0},
		{1, 2, -1, ShadowDisagree, 0}, // the sticky policy stays on 0
		{1, 2, 0, ShadowStickyOut, 2}, // 0 is down: re-placed on 2
		{1, 2, -1, ShadowAgree, 2},    // and sticks there
		{2, 1, -1, ShadowNew, 1},
		{3, 1, -1, ShadowNew, 1}, // evicts session 1 (least recent)
		{1, 0, -1, ShadowNew, 0}, // forgotten: new again
	}
	for i, st := range steps {
		if st.down >= 0 {
			up[st.down] = false
		}
		got, sticky := s.Record(st.session, st.chosen, usable)
		if got != st.want || sticky != st.wantSticky {
			t.Fatalf("step %d: %s sticky %d, want %s %d", i, got, sticky, st.want, st.wantSticky)
		}
	}
	if s.Len() != 2 {
		t.Fatalf("holds %d sessions, bound 2", s.Len())
	}
	if c := s.Counts(); c != [4]uint64{4, 2, 1, 1} {
		t.Fatalf("counts %v", c)
	}
}
