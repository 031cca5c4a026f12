package workload

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Request is one row of a trace: one request, numbers only.
//
// Open loop: a request with After < 0 is sent at At seconds after the start
// of the run. Closed loop: a request with After >= 0 is sent Think seconds
// after request After (its ID) has completed, and not before At.
type Request struct {
	// ID is the row's index in its trace (0, 1, 2, ...).
	ID int `json:"id"`
	// At is the earliest send time, in seconds from the start of the run.
	At float64 `json:"at"`
	// After is the ID of the request whose completion this one waits for
	// (closed loop), or -1.
	After int `json:"after"`
	// Think is the delay between the completion of After and the send,
	// in seconds (closed loop only).
	Think float64 `json:"think"`
	// Session identifies a conversation; its turns share history.
	Session int `json:"session"`
	// Turn is the turn index within the session, from 0.
	Turn int `json:"turn"`
	// Group identifies the shared prefix (system prompt and tools); every
	// request of a group begins with the same Prefix tokens.
	Group int `json:"group"`
	// Prefix is the group's shared prefix length, in tokens.
	Prefix int `json:"prefix"`
	// Input is the whole prompt length, in tokens: the prefix, the
	// session's history and the new user turn.
	Input int `json:"input"`
	// Output is the number of tokens generated (and requested as
	// max_tokens).
	Output int `json:"output"`
	// HashIDs, when set, describes the prompt the way Mooncake-style
	// traces do (see ReadMooncake): block k of the prompt is the content
	// of id HashIDs[k], BlockTokens tokens long, so rows with equal ids
	// in their leading positions share that prefix byte for byte; a last
	// partial block is the row's own. Such a row is a session of one turn
	// with no group prefix (Prefix 0).
	HashIDs []int64 `json:"hash_ids,omitempty"`
	// BlockTokens is the size of one HashIDs block in tokens.
	BlockTokens int `json:"block_tokens,omitempty"`
}

// fullBlocks is how many of r's HashIDs blocks are whole within its
// prompt; the remaining prompt tokens (its tail) are the row's own.
func (r Request) fullBlocks() int {
	if len(r.HashIDs) == 0 || r.BlockTokens <= 0 {
		return 0
	}
	return min(len(r.HashIDs), r.Input/r.BlockTokens)
}

// ownTokens is the length of the prompt part drawn from the row's session
// stream: everything after the group prefix, or after the whole HashIDs
// blocks.
func (r Request) ownTokens() int {
	if len(r.HashIDs) > 0 {
		return r.Input - r.fullBlocks()*r.BlockTokens
	}
	return r.Input - r.Prefix
}

// Trace is a workload's requests, ordered by ID.
type Trace []Request

// Validate checks the structural rules every consumer relies on: IDs in
// order, dependencies pointing backwards, prefix within the input, the same
// group and prefix across a session, and a turn's prompt beginning with
// the previous turn's prompt and output.
func (t Trace) Validate() error {
	type last struct {
		turn, group, prefix, input, output int
	}
	sessions := make(map[int]last)
	for i, r := range t {
		switch {
		case r.ID != i:
			return fmt.Errorf("row %d: id %d, want %d", i, r.ID, i)
		case r.After >= i || r.After < -1:
			return fmt.Errorf("row %d: after %d must be -1 or an earlier id", i, r.After)
		case !(r.At >= 0) || math.IsInf(r.At, 0):
			return fmt.Errorf("row %d: at %v must be a finite number >= 0", i, r.At)
		case !(r.Think >= 0) || math.IsInf(r.Think, 0):
			return fmt.Errorf("row %d: think %v must be a finite number >= 0", i, r.Think)
		case r.Session < 0 || r.Turn < 0 || r.Group < 0:
			return fmt.Errorf("row %d: session, turn and group must be >= 0", i)
		case r.Prefix < 0 || r.Prefix > r.Input:
			return fmt.Errorf("row %d: prefix %d must be within input %d", i, r.Prefix, r.Input)
		case r.Input <= 0 || r.Output <= 0:
			return fmt.Errorf("row %d: input and output must be positive", i)
		case len(r.HashIDs) > 0 && (r.BlockTokens <= 0 || r.Prefix != 0 || r.Turn != 0):
			return fmt.Errorf("row %d: a hash_ids row needs block_tokens > 0, prefix 0 and turn 0", i)
		case len(r.HashIDs) > 0 && len(r.HashIDs) > (r.Input+r.BlockTokens-1)/r.BlockTokens:
			return fmt.Errorf("row %d: %d hash_ids blocks of %d tokens exceed input %d", i, len(r.HashIDs), r.BlockTokens, r.Input)
		}
		p, seen := sessions[r.Session]
		switch {
		case !seen && r.Turn != 0:
			return fmt.Errorf("row %d: session %d starts at turn %d, want 0", i, r.Session, r.Turn)
		case seen && r.Turn != p.turn+1:
			return fmt.Errorf("row %d: session %d turn %d follows turn %d", i, r.Session, r.Turn, p.turn)
		case seen && (r.Group != p.group || r.Prefix != p.prefix):
			return fmt.Errorf("row %d: session %d changes its group or prefix", i, r.Session)
		case seen && r.Input < p.input+p.output:
			return fmt.Errorf("row %d: input %d shorter than the previous turn's prompt and output (%d)", i, r.Input, p.input+p.output)
		}
		sessions[r.Session] = last{r.Turn, r.Group, r.Prefix, r.Input, r.Output}
	}
	return nil
}

// Stats summarises a trace.
type Stats struct {
	Requests     int
	Sessions     int
	Groups       int
	ClosedLoop   int
	InputTokens  int64
	OutputTokens int64
	MaxInput     int
	// Span is the latest At (open-loop arrivals).
	Span float64
}

// Stats computes the trace's summary.
func (t Trace) Stats() Stats {
	var s Stats
	sessions := make(map[int]bool)
	groups := make(map[int]bool)
	for _, r := range t {
		s.Requests++
		sessions[r.Session] = true
		groups[r.Group] = true
		if r.After >= 0 {
			s.ClosedLoop++
		}
		s.InputTokens += int64(r.Input)
		s.OutputTokens += int64(r.Output)
		s.MaxInput = max(s.MaxInput, r.Input)
		s.Span = max(s.Span, r.At)
	}
	s.Sessions, s.Groups = len(sessions), len(groups)
	return s
}

// WriteJSONL writes t as one JSON object per line.
func (t Trace) WriteJSONL(w io.Writer) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range t {
		if err := enc.Encode(&t[i]); err != nil {
			return fmt.Errorf("write trace row %d: %w", i, err)
		}
	}
	return bw.Flush()
}

// csvHeader names the CSV columns, in order.
var csvHeader = []string{"id", "at", "after", "think", "session", "turn", "group", "prefix", "input", "output"}

// WriteCSV writes t as CSV with a header row. Rows with HashIDs cannot be
// written as CSV (use WriteJSONL).
func (t Trace) WriteCSV(w io.Writer) error {
	for _, r := range t {
		if len(r.HashIDs) > 0 {
			return fmt.Errorf("write trace row %d: hash_ids rows need JSONL", r.ID)
		}
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return fmt.Errorf("write trace header: %w", err)
	}
	rec := make([]string, len(csvHeader))
	for _, r := range t {
		rec[0] = strconv.Itoa(r.ID)
		rec[1] = strconv.FormatFloat(r.At, 'g', -1, 64)
		rec[2] = strconv.Itoa(r.After)
		rec[3] = strconv.FormatFloat(r.Think, 'g', -1, 64)
		rec[4] = strconv.Itoa(r.Session)
		rec[5] = strconv.Itoa(r.Turn)
		rec[6] = strconv.Itoa(r.Group)
		rec[7] = strconv.Itoa(r.Prefix)
		rec[8] = strconv.Itoa(r.Input)
		rec[9] = strconv.Itoa(r.Output)
		if err := cw.Write(rec); err != nil {
			return fmt.Errorf("write trace row %d: %w", r.ID, err)
		}
	}
	cw.Flush()
	return cw.Error()
}

// maxTraceRows bounds what Read accepts.
const maxTraceRows = 1 << 22

// ReadJSONL reads a trace written by WriteJSONL (unknown fields are
// rejected) and validates it.
func ReadJSONL(r io.Reader) (Trace, error) {
	var t Trace
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(t) >= maxTraceRows {
			return nil, fmt.Errorf("trace longer than %d rows", maxTraceRows)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		req := Request{After: -1}
		if err := dec.Decode(&req); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		t = append(t, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	return t, t.Validate()
}

// ReadCSV reads a trace written by WriteCSV (columns by header name, in any
// order) and validates it.
func ReadCSV(r io.Reader) (Trace, error) {
	cr := csv.NewReader(r)
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("read trace header: %w", err)
	}
	col := make(map[string]int, len(head))
	for i, h := range head {
		col[strings.TrimSpace(h)] = i
	}
	for _, h := range csvHeader {
		if _, ok := col[h]; !ok {
			return nil, fmt.Errorf("trace header lacks column %q", h)
		}
	}
	var t Trace
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read trace: %w", err)
		}
		if len(t) >= maxTraceRows {
			return nil, fmt.Errorf("trace longer than %d rows", maxTraceRows)
		}
		var req Request
		var perr error
		num := func(name string) int {
			v, err := strconv.Atoi(strings.TrimSpace(rec[col[name]]))
			if err != nil && perr == nil {
				perr = fmt.Errorf("column %s: %w", name, err)
			}
			return v
		}
		flt := func(name string) float64 {
			v, err := strconv.ParseFloat(strings.TrimSpace(rec[col[name]]), 64)
			if err != nil && perr == nil {
				perr = fmt.Errorf("column %s: %w", name, err)
			}
			return v
		}
		req.ID, req.At, req.After, req.Think = num("id"), flt("at"), num("after"), flt("think")
		req.Session, req.Turn, req.Group = num("session"), num("turn"), num("group")
		req.Prefix, req.Input, req.Output = num("prefix"), num("input"), num("output")
		if perr != nil {
			return nil, fmt.Errorf("trace row %d: %w", len(t), perr)
		}
		t = append(t, req)
	}
	return t, t.Validate()
}

// Read reads a trace in any format with ReadWith's defaults.
func Read(r io.Reader) (Trace, error) { return ReadWith(r, MooncakeOptions{}) }

// ReadWith reads a trace in any format: a Mooncake-style JSONL trace (its
// first line has "input_length" or "timestamp") with o, this package's
// JSONL when the first non-blank byte is '{', CSV otherwise.
func ReadWith(r io.Reader, o MooncakeOptions) (Trace, error) {
	br := bufio.NewReader(r)
	for {
		b, err := br.Peek(1)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, fmt.Errorf("read trace: %w", err)
		}
		switch b[0] {
		case ' ', '\t', '\r', '\n':
			br.ReadByte()
			continue
		case '{':
			line, _ := br.Peek(4096) // at most the buffer; less at EOF
			if i := bytes.IndexByte(line, '\n'); i >= 0 {
				line = line[:i]
			}
			if bytes.Contains(line, []byte(`"input_length"`)) || bytes.Contains(line, []byte(`"timestamp"`)) {
				return ReadMooncake(br, o)
			}
			return ReadJSONL(br)
		}
		return ReadCSV(br)
	}
}
