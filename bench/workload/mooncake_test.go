package workload

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

const smallMooncake = `{"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]}
{"timestamp": 500, "input_length": 1300, "output_length": 0, "hash_ids": [0, 1, 3]}

{"timestamp": 250, "input_length": 600, "output_length": 7, "hash_ids": [0, 4]}
{"timestamp": 4000, "input_length": 512, "output_length": 5, "hash_ids": [9]}
`

func TestReadMooncake(t *testing.T) {
	tr, err := ReadWith(strings.NewReader(smallMooncake), MooncakeOptions{TimeScale: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr) != 4 {
		t.Fatalf("%d rows, want 4", len(tr))
	}
	// Sorted by timestamp, compressed 2x: 0, 250, 500, 4000 ms -> 0, 0.125, 0.25, 2 s.
	wantAt := []float64{0, 0.125, 0.25, 2}
	wantIn := []int{1100, 600, 1300, 512}
	for i, r := range tr {
		if r.At != wantAt[i] || r.Input != wantIn[i] || r.After != -1 || r.BlockTokens != 512 || r.Turn != 0 {
			t.Errorf("row %d = %+v, want at %v input %d", i, r, wantAt[i], wantIn[i])
		}
	}
	if tr[2].Output != 1 {
		t.Errorf("output_length 0 read as %d, want 1", tr[2].Output)
	}
	s := Synth{Salt: 3}
	a, b, c := s.Prompt(nil, tr[0]), s.Prompt(nil, tr[2]), s.Prompt(nil, tr[1])
	if len(a) != 1100 || len(b) != 1300 || len(c) != 600 {
		t.Fatalf("prompt lengths %d %d %d", len(a), len(b), len(c))
	}
	// Ids 0 and 1 shared: the first 1024 tokens are equal; block 2 (rows
	// 0) and 3 (row 2) differ.
	if !slices.Equal(a[:1024], b[:1024]) {
		t.Fatal("rows sharing hash ids 0, 1 differ in their first two blocks")
	}
	if slices.Equal(a[1024:1100], b[1024:1100]) {
		t.Fatal("different third blocks gave equal tokens")
	}
	// Row 1 shares only id 0 as a whole block (600 tokens: block 4 is
	// partial, so its tokens are the row's own, not id 4's).
	if !slices.Equal(a[:512], c[:512]) || slices.Equal(a[512:600], c[512:600]) {
		t.Fatal("first block should be shared and the partial second block not")
	}
	if !slices.Equal(c[512:], s.SessionTokens(nil, tr[1].Session, 0, 88)) {
		t.Fatal("the partial last block is not the row's own stream")
	}
	// The completion continues the row's own stream.
	if got := s.Completion(nil, tr[1]); !slices.Equal(got, s.SessionTokens(nil, tr[1].Session, 88, tr[1].Output)) {
		t.Fatal("completion does not follow the row's tail")
	}
	// The chat segments cover the prompt exactly.
	segs, err := Segments(nil, tr[0])
	if err != nil || len(segs) != 1 || !slices.Equal(s.Tokens(nil, tr[0], segs[0]), a) {
		t.Fatalf("segments %v, %v: not the prompt", segs, err)
	}
	// Writing and reading this package's JSONL keeps the hash ids.
	var buf bytes.Buffer
	if err := tr.WriteJSONL(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := Read(&buf)
	if err != nil || !slices.EqualFunc(back, tr, func(x, y Request) bool {
		return x.Input == y.Input && slices.Equal(x.HashIDs, y.HashIDs) && x.BlockTokens == y.BlockTokens
	}) {
		t.Fatalf("JSONL round trip: %v", err)
	}
	if err := tr.WriteCSV(&buf); err == nil {
		t.Fatal("CSV accepted hash_ids rows")
	}
}

func TestReadMooncakeWindow(t *testing.T) {
	tests := []struct {
		name string
		give MooncakeOptions
		want []int // input lengths
	}{
		{"all", MooncakeOptions{}, []int{1100, 600, 1300, 512}},
		{"start", MooncakeOptions{Start: 250}, []int{600, 1300, 512}},
		{"start and duration", MooncakeOptions{Start: 250, Duration: 300}, []int{600, 1300}},
		{"rows", MooncakeOptions{Rows: 2}, []int{1100, 600}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := ReadMooncake(strings.NewReader(smallMooncake), tt.give)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, r := range tr {
				got = append(got, r.Input)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("inputs %v, want %v", got, tt.want)
			}
			if tr[0].At != 0 {
				t.Fatalf("window starts at %v, want 0", tr[0].At)
			}
		})
	}
}

func TestReadMooncakeErrors(t *testing.T) {
	tests := []struct {
		name, give, want string
	}{
		{"bad json", "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}\n\n{\"timestamp\": 1, \"input_length\": oops}\n", "line 3"},
		{"missing field", `{"timestamp": 0, "input_length": 10, "hash_ids": [0]}`, "line 1: timestamp, input_length and output_length are required"},
		{"too many ids", "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}\n{\"timestamp\": 1, \"input_length\": 513, \"output_length\": 1, \"hash_ids\": [0, 1, 2]}", "line 2: 3 hash_ids blocks"},
		{"negative", `{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": []}`, "line 1: timestamp"},
		{"zero input", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`, "line 1: input_length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tt.give))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestGenerateMooncake(t *testing.T) {
	for _, kind := range MooncakeKinds {
		t.Run(kind, func(t *testing.T) {
			rows, err := GenerateMooncake(kind, MooncakeGenOptions{Seed: 1, Sessions: 20})
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := WriteMooncake(&buf, rows); err != nil {
				t.Fatal(err)
			}
			again, _ := GenerateMooncake(kind, MooncakeGenOptions{Seed: 1, Sessions: 20})
			var buf2 bytes.Buffer
			_ = WriteMooncake(&buf2, again)
			if !bytes.Equal(buf.Bytes(), buf2.Bytes()) {
				t.Fatal("same seed, different traces")
			}
			tr, err := Read(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			if len(tr) != len(rows) || len(tr) < 20 {
				t.Fatalf("%d rows read of %d written", len(tr), len(rows))
			}
			// Every row shares its first block with some other row (the
			// system or tool prefix), and later turns share more.
			s := Synth{Salt: 1}
			first := map[int64]int{}
			deep := 0
			for i, r := range rows {
				if len(r.HashIDs) != (r.InputLength+511)/512 {
					t.Fatalf("row %d: %d ids for %d tokens", i, len(r.HashIDs), r.InputLength)
				}
				first[r.HashIDs[0]]++
				if i > 0 && len(r.HashIDs) > 4 {
					deep++
				}
			}
			for id, n := range first {
				if n < 2 {
					t.Errorf("prefix block %d used by %d row(s)", id, n)
				}
			}
			if deep == 0 {
				t.Error("no row longer than 4 blocks")
			}
			// Equal leading ids give equal leading tokens.
			a, b := tr[0], tr[1]
			n := 0
			for n < min(len(a.HashIDs), len(b.HashIDs)) && a.HashIDs[n] == b.HashIDs[n] && (n+1)*512 <= min(a.Input, b.Input) {
				n++
			}
			if pa, pb := s.Prompt(nil, a), s.Prompt(nil, b); !slices.Equal(pa[:n*512], pb[:n*512]) {
				t.Fatal("equal ids, different tokens")
			}
		})
	}
	if _, err := GenerateMooncake("nope", MooncakeGenOptions{}); err == nil {
		t.Fatal("unknown kind accepted")
	}
}

// TestGenerateMooncakeClosed checks the closed form: row for row the open
// trace's prompts, each later turn chained to its session's previous turn
// (whose whole blocks its ids extend) by the open form's gap, and the
// trace survives a JSONL round trip.
func TestGenerateMooncakeClosed(t *testing.T) {
	for _, kind := range MooncakeKinds {
		t.Run(kind, func(t *testing.T) {
			o := MooncakeGenOptions{Seed: 3, Sessions: 12, Rate: 2}
			open, err := GenerateMooncake(kind, o)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := GenerateMooncakeClosed(kind, o)
			if err != nil {
				t.Fatal(err)
			}
			if len(tr) != len(open) {
				t.Fatalf("%d closed rows, %d open", len(tr), len(open))
			}
			t0 := open[0].Timestamp
			firsts, chained := 0, 0
			for i, r := range tr {
				o := open[i]
				if r.Input != o.InputLength || r.Output != max(1, o.OutputLength) || !slices.Equal(r.HashIDs, o.HashIDs) || r.BlockTokens != 512 {
					t.Fatalf("row %d: %+v, open %+v", i, r, o)
				}
				if r.After < 0 {
					firsts++
					if r.At != (o.Timestamp-t0)/1000 || r.Think != 0 {
						t.Fatalf("row %d: first turn at %v think %v, open at %v", i, r.At, r.Think, o.Timestamp)
					}
					continue
				}
				chained++
				p, po := tr[r.After], open[r.After]
				whole := po.InputLength / 512
				if r.After >= i || r.At != p.At || !slices.Equal(r.HashIDs[:whole], po.HashIDs[:whole]) ||
					r.Input < p.Input+p.Output || r.Think != (o.Timestamp-po.Timestamp)/1000 || r.Think < 1 {
					t.Fatalf("row %d after %d: %+v, previous %+v", i, r.After, r, p)
				}
			}
			if firsts != 12 || chained == 0 {
				t.Fatalf("%d sessions, %d chained turns", firsts, chained)
			}
			var buf bytes.Buffer
			if err := tr.WriteJSONL(&buf); err != nil {
				t.Fatal(err)
			}
			back, err := Read(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			if len(back) != len(tr) || back[len(tr)-1].After != tr[len(tr)-1].After || !slices.Equal(back[len(tr)-1].HashIDs, tr[len(tr)-1].HashIDs) {
				t.Fatal("JSONL round trip changed the trace")
			}
		})
	}
}
