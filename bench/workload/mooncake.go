package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// MooncakeRow is one line of a Mooncake-style trace (the format of the
// kvcache-ai/Mooncake published traces: conversation, tool-agent,
// synthetic): an arrival time in milliseconds, the prompt and output
// lengths in tokens, and one hash id per block of the prompt. Identical
// ids at the same position mean the same block content (the ids chain:
// equal ids imply an equal prefix up to them).
type MooncakeRow struct {
	Timestamp    float64 `json:"timestamp"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// DefaultMooncakeBlockTokens is the block size of the published traces.
const DefaultMooncakeBlockTokens = 512

// MooncakeOptions say how a Mooncake-style trace is read.
type MooncakeOptions struct {
	// BlockTokens is the size of one hash id's block in tokens; 0 means
	// DefaultMooncakeBlockTokens.
	BlockTokens int
	// TimeScale compresses time: arrivals are divided by it (2 replays the
	// trace twice as fast); 0 means 1.
	TimeScale float64
	// Start skips the rows that arrive earlier than Start milliseconds
	// after the trace's first row.
	Start float64
	// Duration, when positive, keeps only the rows that arrive within
	// Duration milliseconds after Start.
	Duration float64
	// Rows, when positive, keeps at most this many rows (after Start).
	Rows int
}

func (o *MooncakeOptions) setDefaults() {
	if o.BlockTokens <= 0 {
		o.BlockTokens = DefaultMooncakeBlockTokens
	}
	if o.TimeScale <= 0 {
		o.TimeScale = 1
	}
}

// ReadMooncake reads a Mooncake-style JSONL trace and turns the window o
// selects into a Trace: rows in arrival order, each an open-loop session
// of one turn whose prompt is its HashIDs blocks (content synthesised per
// id, see Synth.Prompt) followed by its own partial last block. At is
// (timestamp - first timestamp - Start) / 1000 / TimeScale seconds. An
// output_length of 0 is sent as 1 (an engine generates at least one
// token). A malformed line is an error naming the line.
func ReadMooncake(r io.Reader, o MooncakeOptions) (Trace, error) {
	o.setDefaults()
	type row struct {
		MooncakeRow
		line int
	}
	var rows []row
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(rows) >= maxTraceRows {
			return nil, fmt.Errorf("mooncake trace longer than %d rows", maxTraceRows)
		}
		var raw struct {
			Timestamp    *float64 `json:"timestamp"`
			InputLength  *int     `json:"input_length"`
			OutputLength *int     `json:"output_length"`
			HashIDs      []int64  `json:"hash_ids"`
		}
		if err := json.Unmarshal(b, &raw); err != nil {
			return nil, fmt.Errorf("mooncake trace line %d: %w", line, err)
		}
		switch {
		case raw.Timestamp == nil || raw.InputLength == nil || raw.OutputLength == nil:
			return nil, fmt.Errorf("mooncake trace line %d: timestamp, input_length and output_length are required", line)
		case !(*raw.Timestamp >= 0) || math.IsInf(*raw.Timestamp, 0):
			return nil, fmt.Errorf("mooncake trace line %d: timestamp %v must be a finite number >= 0", line, *raw.Timestamp)
		case *raw.InputLength <= 0 || *raw.OutputLength < 0:
			return nil, fmt.Errorf("mooncake trace line %d: input_length must be positive and output_length not negative", line)
		case len(raw.HashIDs) > (*raw.InputLength+o.BlockTokens-1)/o.BlockTokens:
			return nil, fmt.Errorf("mooncake trace line %d: %d hash_ids blocks of %d tokens exceed input_length %d",
				line, len(raw.HashIDs), o.BlockTokens, *raw.InputLength)
		}
		rows = append(rows, row{MooncakeRow{*raw.Timestamp, *raw.InputLength, *raw.OutputLength, raw.HashIDs}, line})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mooncake trace (line %d): %w", line+1, err)
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Timestamp < rows[j].Timestamp })
	if len(rows) == 0 {
		return nil, nil
	}
	t0 := rows[0].Timestamp + o.Start
	var t Trace
	for _, r := range rows {
		rel := r.Timestamp - t0
		if rel < 0 {
			continue
		}
		if (o.Duration > 0 && rel > o.Duration) || (o.Rows > 0 && len(t) >= o.Rows) {
			break
		}
		id := len(t)
		t = append(t, Request{
			ID: id, At: rel / 1000 / o.TimeScale, After: -1, Session: id, Group: id,
			Input: r.InputLength, Output: max(1, r.OutputLength),
			HashIDs: r.HashIDs, BlockTokens: o.BlockTokens,
		})
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("mooncake trace: %w", err)
	}
	return t, nil
}

// WriteMooncake writes rows as a Mooncake-style JSONL trace.
func WriteMooncake(w io.Writer, rows []MooncakeRow) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range rows {
		if rows[i].HashIDs == nil {
			rows[i].HashIDs = []int64{}
		}
		if err := enc.Encode(&rows[i]); err != nil {
			return fmt.Errorf("write mooncake row %d: %w", i, err)
		}
	}
	return bw.Flush()
}

// MooncakeKinds are the shapes GenerateMooncake writes.
var MooncakeKinds = []string{"conversation", "tool-agent"}

// MooncakeGenOptions parameterise GenerateMooncake.
type MooncakeGenOptions struct {
	// Seed makes the trace reproducible.
	Seed uint64
	// Sessions is the number of conversations (or agents); 0 means 400
	// for conversation, 64 for tool-agent.
	Sessions int
	// Rate is new sessions per second; 0 means 2 for conversation, 0.5
	// for tool-agent.
	Rate float64
	// BlockTokens is the hash id block size; 0 means 512.
	BlockTokens int
}

// GenerateMooncake writes a trace in the Mooncake format with the shape of
// the published ones, for tests and for replay at any size:
//
//   - conversation: sessions of 1 to 8 turns on one of 8 system prompts
//     (1 to 4 blocks); each turn's prompt is the system prompt, the
//     conversation so far and a new 100 to 1,000-token message; 50 to
//     600 output tokens; 5 to 60 s between turns.
//   - tool-agent: agents on one of 2 tool prefixes (16 blocks, 8k
//     tokens) taking 8 to 32 steps; each step appends a 200 to 3,000-token
//     tool result to the context; 20 to 400 output tokens; 1 to 6 s
//     between steps.
//
// A block position that was whole in a session's previous turn keeps its
// id; new whole blocks get new ids (the id space is shared, so equal ids
// mean equal content everywhere). Rows are in timestamp order.
func GenerateMooncake(kind string, o MooncakeGenOptions) ([]MooncakeRow, error) {
	gen, err := generateMooncake(kind, o)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(gen, func(i, j int) bool { return gen[i].Timestamp < gen[j].Timestamp })
	rows := make([]MooncakeRow, len(gen))
	for i := range gen {
		rows[i] = gen[i].MooncakeRow
	}
	return rows, nil
}

// GenerateMooncakeClosed generates the same sessions as GenerateMooncake
// (the same draws for the same options) as a closed-loop trace of this
// package: a session's first turn is sent at its start, and each later
// turn its gap after the previous turn completes (GenerateMooncake's
// rows send it its gap after the previous turn was sent, whether or not
// that turn was answered: an agent's next step can then arrive before
// the answer it is meant to contain). Each row keeps its hash ids and is
// its own one-turn session, chained to the previous turn by After and
// Think, and not sent before its session's start (At, seconds after the
// first session's).
func GenerateMooncakeClosed(kind string, o MooncakeGenOptions) (Trace, error) {
	gen, err := generateMooncake(kind, o)
	if err != nil {
		return nil, err
	}
	bt := o.blockTokens()
	// Rows in GenerateMooncake's order (by arrival in the open form), so
	// row i is the same prompt in both traces; a turn's previous turn
	// arrived earlier there, so After points backwards.
	order, id := stableOrder(len(gen), func(i, j int) bool { return gen[i].Timestamp < gen[j].Timestamp })
	t0 := gen[order[0]].Timestamp
	t := make(Trace, len(gen))
	for n, g := range order {
		r := gen[g]
		after, think := -1, 0.0
		if r.turn > 0 { // gen[g-1] is the session's previous turn
			after, think = id[g-1], (r.Timestamp-gen[g-1].Timestamp)/1000
		}
		t[n] = Request{
			ID: n, At: (r.start - t0) / 1000, After: after, Think: think, Session: n, Group: n,
			Input: r.InputLength, Output: max(1, r.OutputLength),
			HashIDs: r.HashIDs, BlockTokens: bt,
		}
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("closed mooncake trace: %w", err)
	}
	return t, nil
}

// genRow is a generated row, its turn within its session and the
// session's first timestamp; rows come session after session, turn after
// turn.
type genRow struct {
	MooncakeRow
	turn  int
	start float64
}

// blockTokens is BlockTokens with its default applied.
func (o MooncakeGenOptions) blockTokens() int {
	if o.BlockTokens <= 0 {
		return DefaultMooncakeBlockTokens
	}
	return o.BlockTokens
}

func generateMooncake(kind string, o MooncakeGenOptions) ([]genRow, error) {
	bt := o.blockTokens()
	rng := rand.New(rand.NewPCG(o.Seed, 0x6d6f6f6e63616b65))
	var (
		prefixes                     [][]int64
		sessions                     int
		rate                         float64
		turnsLo, turnsHi             int
		userLo, userHi, outLo, outHi int
		gapLo, gapHi                 float64
	)
	next := int64(0)
	newIDs := func(n int) []int64 {
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = next
			next++
		}
		return ids
	}
	switch kind {
	case "conversation":
		for range 8 {
			prefixes = append(prefixes, newIDs(1+rng.IntN(4)))
		}
		sessions, rate = 400, 2.0
		turnsLo, turnsHi, userLo, userHi, outLo, outHi, gapLo, gapHi = 1, 8, 100, 1000, 50, 600, 5, 60
	case "tool-agent":
		for range 2 {
			prefixes = append(prefixes, newIDs(16))
		}
		sessions, rate = 64, 0.5
		turnsLo, turnsHi, userLo, userHi, outLo, outHi, gapLo, gapHi = 8, 32, 200, 3000, 20, 400, 1, 6
	default:
		return nil, fmt.Errorf("unknown mooncake trace kind %q (want one of %s)", kind, strings.Join(MooncakeKinds, ", "))
	}
	if o.Sessions > 0 {
		sessions = o.Sessions
	}
	if o.Rate > 0 {
		rate = o.Rate
	}
	var rows []genRow
	start := 0.0
	for range sessions {
		start += rng.ExpFloat64() / rate
		at := start
		prefix := prefixes[rng.IntN(len(prefixes))]
		ids := append([]int64(nil), prefix...)
		length := len(prefix) * bt // tokens of the context so far
		turns := turnsLo + rng.IntN(turnsHi-turnsLo+1)
		for turn := range turns {
			input := length + userLo + rng.IntN(userHi-userLo+1)
			whole := len(ids) // blocks whole in the previous prompt keep their ids
			ids = append(ids[:whole:whole], newIDs((input+bt-1)/bt-whole)...)
			out := outLo + rng.IntN(outHi-outLo+1)
			rows = append(rows, genRow{MooncakeRow{
				Timestamp: math.Round(at * 1000), InputLength: input, OutputLength: out,
				HashIDs: append([]int64(nil), ids...),
			}, turn, math.Round(start * 1000)})
			// The next prompt holds this one and its output; only this
			// prompt's whole blocks are shared with it.
			length = input + out
			ids = ids[:input/bt]
			at += gapLo + rng.Float64()*(gapHi-gapLo)
		}
	}
	return rows, nil
}

// LoadFile reads a trace file in any format (ReadWith, o for a
// Mooncake-style one) as a workload named "trace:" and the file's base
// name.
func LoadFile(path string, o MooncakeOptions) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr, err := ReadWith(f, o)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(tr) == 0 {
		return nil, fmt.Errorf("%s: no requests in the trace window", path)
	}
	st := tr.Stats()
	base := filepath.Base(path)
	return &Workload{
		Name: "trace:" + strings.TrimSuffix(base, filepath.Ext(base)),
		Summary: fmt.Sprintf("trace %s: %d requests over %.0f s, mean input %d tokens, mean output %d",
			base, st.Requests, st.Span, st.InputTokens/int64(st.Requests), st.OutputTokens/int64(st.Requests)),
		Trace: tr,
	}, nil
}

// RegisterFlags adds the -trace-* flags that fill o (block size, time
// compression and window) to fs; the load generator, e2ecompare and the
// fleet simulation share them.
func (o *MooncakeOptions) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.BlockTokens, "trace-block-tokens", DefaultMooncakeBlockTokens, "tokens per hash id block of a Mooncake-style trace")
	fs.Float64Var(&o.TimeScale, "trace-time-scale", 1, "compress a Mooncake-style trace's arrivals by this factor")
	fs.Float64Var(&o.Start, "trace-start", 0, "skip a Mooncake-style trace's first this many milliseconds")
	fs.Float64Var(&o.Duration, "trace-duration", 0, "keep this many milliseconds of a Mooncake-style trace after -trace-start (0: all)")
	fs.IntVar(&o.Rows, "trace-rows", 0, "keep at most this many rows of a Mooncake-style trace (0: all)")
}
