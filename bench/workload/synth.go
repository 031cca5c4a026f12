package workload

import (
	"fmt"
	"slices"
)

// Vocab is the size of the synthetic vocabulary: every synthesized token id
// is in [0, Vocab).
const Vocab = 32000

// Synth turns trace rows into token id sequences, deterministically:
//
//   - a request of group g begins with the group's Prefix tokens, the same
//     for every request of g;
//   - the rest of its prompt, and its output, are consecutive slices of its
//     session's token stream: a turn's prompt continues where the previous
//     turn's output ended, so that turn N+1 begins with exactly turn N's
//     prompt followed by turn N's output.
//
// The Salt separates runs: two traces synthesized with different salts share
// no tokens, so that a live engine's cache does not carry hits from one
// workload into the next. A Synth is a value; it is safe for concurrent use.
type Synth struct {
	Salt uint64
}

func mix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

const (
	streamGroup   = 0x67726f7570 // "group"
	streamSession = 0x73657373   // "sess"
	streamBlock   = 0x626c6f636b // "block"
)

// stream appends tokens [off, off+n) of the stream of (kind, id): token i
// is mix64(key ^ i) mod Vocab, key a hash of salt, kind and id.
func (s Synth) stream(dst []uint32, kind uint64, id, off, n int) []uint32 {
	return s.stream64(dst, kind, uint64(id), off, n)
}

func (s Synth) stream64(dst []uint32, kind, id uint64, off, n int) []uint32 {
	key := mix64(mix64(s.Salt^kind) ^ id)
	dst = slices.Grow(dst, n)
	for i := off; i < off+n; i++ {
		dst = append(dst, uint32(mix64(key^uint64(i))%Vocab))
	}
	return dst
}

// GroupTokens appends n tokens of group g's shared prefix, from offset off.
func (s Synth) GroupTokens(dst []uint32, g, off, n int) []uint32 {
	return s.stream(dst, streamGroup, g, off, n)
}

// SessionTokens appends n tokens of session's stream, from offset off.
func (s Synth) SessionTokens(dst []uint32, session, off, n int) []uint32 {
	return s.stream(dst, streamSession, session, off, n)
}

// BlockTokens appends the n tokens of HashIDs block id: the same for every
// row and position that names id.
func (s Synth) BlockTokens(dst []uint32, id int64, n int) []uint32 {
	return s.stream64(dst, streamBlock, uint64(id), 0, n)
}

// Prompt appends r's prompt: r.Prefix group tokens (or, for a HashIDs row,
// the tokens of each whole block), then the rest from its session's
// stream.
func (s Synth) Prompt(dst []uint32, r Request) []uint32 { return prompt(s, dst, r) }

// Completion appends r's output: the r.Output session tokens that follow
// its prompt.
func (s Synth) Completion(dst []uint32, r Request) []uint32 { return completion(s, dst, r) }

// streamer appends tokens [off, off+n) of the stream of (kind, id): a
// Synth computes them, a SynthCache copies what it computed before.
type streamer interface {
	stream64(dst []uint32, kind, id uint64, off, n int) []uint32
}

func prompt(s streamer, dst []uint32, r Request) []uint32 {
	if len(r.HashIDs) > 0 {
		for _, id := range r.HashIDs[:r.fullBlocks()] {
			dst = s.stream64(dst, streamBlock, uint64(id), 0, r.BlockTokens)
		}
	} else {
		dst = s.stream64(dst, streamGroup, uint64(r.Group), 0, r.Prefix)
	}
	return s.stream64(dst, streamSession, uint64(r.Session), 0, r.ownTokens())
}

func completion(s streamer, dst []uint32, r Request) []uint32 {
	return s.stream64(dst, streamSession, uint64(r.Session), r.ownTokens(), r.Output)
}

// Role is who speaks a Segment.
type Role uint8

const (
	// RoleSystem is the group's shared prefix (system prompt and tools).
	RoleSystem Role = iota
	// RoleUser is a new user (or tool result) turn.
	RoleUser
	// RoleAssistant is an earlier turn's output, replayed as history.
	RoleAssistant
)

func (r Role) String() string {
	switch r {
	case RoleSystem:
		return "system"
	case RoleUser:
		return "user"
	}
	return "assistant"
}

// Segment is one message of a request's prompt: Len tokens from offset Off
// of the group's prefix (RoleSystem) or of the session's stream.
type Segment struct {
	Role Role
	Off  int
	Len  int
}

// Tokens appends the segment's tokens for request r.
func (s Synth) Tokens(dst []uint32, r Request, g Segment) []uint32 {
	if len(r.HashIDs) > 0 {
		p := s.Prompt(nil, r)
		return append(dst, p[g.Off:g.Off+g.Len]...)
	}
	if g.Role == RoleSystem {
		return s.GroupTokens(dst, r.Group, g.Off, g.Len)
	}
	return s.SessionTokens(dst, r.Session, g.Off, g.Len)
}

// Segments splits r's prompt into messages, given the session's earlier
// turns in order (history[k] is turn k): the shared prefix, then for every
// earlier turn its new user part and its output, then r's new user part.
// The concatenation of the segments' tokens is exactly Prompt(r). A load
// generator renders each segment as one chat message.
func Segments(history []Request, r Request) ([]Segment, error) {
	if len(history) != r.Turn {
		return nil, fmt.Errorf("segments: %d earlier turns given for turn %d", len(history), r.Turn)
	}
	if len(r.HashIDs) > 0 {
		// One user message: the blocks, then the row's own tail.
		return []Segment{{Role: RoleUser, Len: r.Input}}, nil
	}
	segs := make([]Segment, 0, 2*len(history)+2)
	if r.Prefix > 0 {
		segs = append(segs, Segment{Role: RoleSystem, Len: r.Prefix})
	}
	off := 0 // offset in the session stream
	for k, h := range history {
		if h.Session != r.Session || h.Turn != k {
			return nil, fmt.Errorf("segments: history[%d] is session %d turn %d", k, h.Session, h.Turn)
		}
		end := h.Input - h.Prefix
		if end < off {
			return nil, fmt.Errorf("segments: turn %d is shorter than its history", k)
		}
		if end > off {
			segs = append(segs, Segment{Role: RoleUser, Off: off, Len: end - off})
		}
		segs = append(segs, Segment{Role: RoleAssistant, Off: end, Len: h.Output})
		off = end + h.Output
	}
	end := r.Input - r.Prefix
	if end < off {
		return nil, fmt.Errorf("segments: turn %d is shorter than its history", r.Turn)
	}
	if end > off {
		segs = append(segs, Segment{Role: RoleUser, Off: off, Len: end - off})
	}
	return segs, nil
}
