package usage

import (
	"testing"
)

// checkShapeRead holds matchShapes to usageSet.IntsObject over p: where a
// layout reads p, IntsObject decides p alike (same end, same counts). It
// reports whether a layout read p.
func checkShapeRead(t *testing.T, p []byte) bool {
	t.Helper()
	got := [6]int64{absent, absent, absent, absent, absent, absent}
	end, ok := matchShapes(p, &got)
	if !ok {
		return false
	}
	want := [6]int64{absent, absent, absent, absent, absent, absent}
	wantEnd, decided := usageSet.IntsObject(p, want[:])
	if !decided || wantEnd != end || got != want {
		t.Fatalf("%q: the layout read %v up to %d; IntsObject %v, %v up to %d", p, got, end, want, decided, wantEnd)
	}
	return true
}

// learn keeps the layout of obj as Scanner.whole does: only of an object
// IntsObject decides.
func learn(obj []byte) {
	out := [6]int64{absent, absent, absent, absent, absent, absent}
	if end, ok := usageSet.IntsObject(obj, out[:]); ok && end <= maxUsageBytes {
		learnShape(obj[:end])
	}
}

func TestShapes(t *testing.T) {
	defer shapes.Store(nil)
	shapes.Store(nil)
	for _, obj := range []string{
		`{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`,
		`{"prompt_tokens":5,"prompt_tokens":-7,"x":[1,2.5,-3,1e2],"prompt_tokens_details":null}`,
		`{"input_tokens":900,"input_tokens_details":{"cached_tokens":512},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":0}}`,
	} {
		learn([]byte(obj))
	}
	if ss := shapes.Load(); ss == nil || len(*ss) != 3 {
		t.Fatalf("want 3 layouts learned, got %v", ss)
	}
	for _, tc := range []struct {
		give string
		read bool // a layout reads it
	}{
		{`{"prompt_tokens":900,"completion_tokens":17,"total_tokens":917,"prompt_tokens_details":{"cached_tokens":0}}, "x"`, true},
		{`{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0,"prompt_tokens_details":{"cached_tokens":999999999999999999}}`, true},
		{`{"prompt_tokens":3,"prompt_tokens":-0,"x":[9,2.5,-8,1e2],"prompt_tokens_details":null}`, true},
		{`{"input_tokens":1,"input_tokens_details":{"cached_tokens":1},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":77}}`, true},
		// Left to IntsObject: not a valid integer there, or laid out otherwise.
		{`{"prompt_tokens":012,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`, false},
		{`{"prompt_tokens":1.5,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`, false},
		{`{"prompt_tokens":1e3,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`, false},
		{`{"prompt_tokens":-12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`, false},
		{`{"prompt_tokens":1234567890123456789,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`, false},
		{`{"prompt_tokens":12, "completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`, false},
		{`{"prompt_tokens":3,"prompt_tokens":-0,"x":[9,2.6,-8,1e2],"prompt_tokens_details":null}`, false},
		{`{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8`, false},
		{`{"prompt_tokens":12,"completion_tokens":"1","total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`, false},
	} {
		if got := checkShapeRead(t, []byte(tc.give)); got != tc.read {
			t.Errorf("%s: read by a layout %v, want %v", tc.give, got, tc.read)
		}
	}
}

func TestShapesBounded(t *testing.T) {
	defer shapes.Store(nil)
	shapes.Store(nil)
	for i := range maxShapes + 3 {
		learn(append(appendInt([]byte(`{"prompt_tokens":1,"k`), int64(i)), `":1}`...))
	}
	if ss := shapes.Load(); ss == nil || len(*ss) != maxShapes {
		t.Fatalf("want %d layouts, got %v", maxShapes, ss)
	}
	var s Scanner
	body := []byte(`{"usage":{"prompt_tokens":1,"kz":1}}`) // no layout fits, none is learned
	if n := testing.AllocsPerRun(100, func() {
		s.Reset()
		s.Write(body)
	}); n != 0 {
		t.Fatalf("Write allocates %v times with the layouts full", n)
	}
}

// FuzzShapes learns the layout of a and reads b with it: where it reads
// b, IntsObject decides b alike.
func FuzzShapes(f *testing.F) {
	for _, s := range [][2]string{
		{`{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`,
			`{"prompt_tokens":900,"completion_tokens":17,"total_tokens":917,"prompt_tokens_details":{"cached_tokens":0}}`},
		{`{"a":[1,-2,{"prompt_tokens":3}],"prompt_tokens":-4,"Prompt_Tokens":5,"input_tokens_details":{"cached_tokens":6}}`,
			`{"a":[7,-8,{"prompt_tokens":9}],"prompt_tokens":-10,"Prompt_Tokens":11,"input_tokens_details":{"cached_tokens":12}}`},
		{`{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":2},"prompt_tokens_details":{"cached_tokens":3}}`,
			`{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":5},"prompt_tokens_details":{"cached_tokens":6}}x`},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		defer shapes.Store(nil)
		shapes.Store(nil)
		learn(a)
		checkShapeRead(t, a)
		checkShapeRead(t, b)
	})
}

// TestShapesConcurrent has scanners on several goroutines learn and read
// layouts at once (the layouts are the process's): every Result is the
// decode of the object the scanner kept. Run with -race.
func TestShapesConcurrent(t *testing.T) {
	defer shapes.Store(nil)
	shapes.Store(nil)
	bodies := [][]byte{
		[]byte(`{"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}}`),
		[]byte(`{"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}`),
		[]byte(`{"usage":{"input_tokens":900,"input_tokens_details":{"cached_tokens":512},"output_tokens":4}}`),
	}
	errs := make(chan string, 4)
	for g := range 4 {
		go func() {
			var s Scanner
			for i := range 200 {
				s.Reset()
				s.Write(bodies[(g+i)%len(bodies)])
				got, ok := s.Result()
				want, wantOK := refLastResult(s.last)
				if got != want || ok != wantOK || !ok {
					errs <- string(s.last)
					return
				}
			}
			errs <- ""
		}()
	}
	for range 4 {
		if e := <-errs; e != "" {
			t.Errorf("%s: Result differs from its decode", e)
		}
	}
}
