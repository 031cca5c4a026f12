package integrity

import (
	"container/list"
	"errors"
	"sync"
)

// ShadowOutcome is how a session-sticky policy's choice compares with the
// router's for one request.
type ShadowOutcome int

// Outcomes.
const (
	// ShadowNew: the session's first request; a sticky policy places it
	// where the router did.
	ShadowNew ShadowOutcome = iota
	// ShadowAgree: the sticky replica is the router's choice.
	ShadowAgree
	// ShadowDisagree: the sticky replica is usable and another was chosen.
	ShadowDisagree
	// ShadowStickyOut: the sticky replica is not usable now; a sticky
	// policy re-places the session where the router did.
	ShadowStickyOut
	numShadowOutcomes
)

// ShadowOutcomes lists the outcomes in order.
var ShadowOutcomes = []ShadowOutcome{ShadowNew, ShadowAgree, ShadowDisagree, ShadowStickyOut}

func (o ShadowOutcome) String() string {
	switch o {
	case ShadowNew:
		return "new"
	case ShadowAgree:
		return "agree"
	case ShadowDisagree:
		return "disagree"
	case ShadowStickyOut:
		return "sticky_unavailable"
	}
	return "unknown"
}

// DefaultMaxSessions bounds a SessionShadow's table.
const DefaultMaxSessions = 65536

// SessionShadow is the shadow of a session-sticky policy: for each session
// (by a hash of its key; the key itself is never kept) the replica that
// policy would route to. It only records; it never chooses. Memory is
// bounded by max sessions (least recently seen evicted).
type SessionShadow struct {
	mu     sync.Mutex
	max    int
	m      map[uint64]*list.Element
	lru    list.List // of *shadowEntry, most recent first
	counts [numShadowOutcomes]uint64
}

type shadowEntry struct {
	session uint64
	slot    int
}

// NewSessionShadow returns a shadow of at most max sessions
// (DefaultMaxSessions when max <= 0).
func NewSessionShadow(max int) *SessionShadow {
	if max <= 0 {
		max = DefaultMaxSessions
	}
	return &SessionShadow{max: max, m: make(map[uint64]*list.Element)}
}

// Sticky returns the replica slot the sticky policy holds for session.
func (s *SessionShadow) Sticky(session uint64) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[session]; ok {
		return e.Value.(*shadowEntry).slot, true
	}
	return 0, false
}

// Record accounts one routed request of session: chosen is the router's
// slot, usable tells whether a slot can take the request now. It returns
// the outcome and the sticky policy's slot for this request.
func (s *SessionShadow) Record(session uint64, chosen int, usable func(int) bool) (ShadowOutcome, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[session]
	var out ShadowOutcome
	sticky := chosen
	switch {
	case !ok:
		out = ShadowNew
		if s.lru.Len() >= s.max {
			old := s.lru.Back()
			s.lru.Remove(old)
			delete(s.m, old.Value.(*shadowEntry).session)
		}
		s.m[session] = s.lru.PushFront(&shadowEntry{session: session, slot: chosen})
	default:
		ent := e.Value.(*shadowEntry)
		s.lru.MoveToFront(e)
		switch {
		case ent.slot == chosen:
			out = ShadowAgree
		case !usable(ent.slot):
			out = ShadowStickyOut
			ent.slot = chosen
		default:
			out, sticky = ShadowDisagree, ent.slot
		}
	}
	s.counts[out]++
	return out, sticky
}

// Counts returns the outcomes so far, by ShadowOutcome.
func (s *SessionShadow) Counts() [4]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// Len is the number of sessions held.
func (s *SessionShadow) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lru.Len()
}

// ShadowSettings is the JSON configuration of the session shadow (the
// ramjet policy's "session_shadow"), session-affinity shadow telemetry: for
// requests carrying a session key in Header, ramjet records what a
// session-sticky policy (each session stays on the replica it was first
// placed on while that replica is usable) would have chosen next to its
// own choice: the agreement rate, and for disagreements the overlap and
// load of both choices. It never changes a decision. The session key is
// hashed and never kept; the table is bounded.
type ShadowSettings struct {
	// Header carries the session key. Default "X-Session-ID".
	// In the Caddyfile: session_shadow [<header>] { max_sessions <n> }.
	Header string `json:"header,omitempty" caddyfile:"arg"`
	// MaxSessions bounds the sessions remembered (least recently seen
	// evicted). Default 65536.
	MaxSessions int `json:"max_sessions,omitempty"`
}

// SetDefaults fills the default header.
func (c *ShadowSettings) SetDefaults() {
	if c.Header == "" {
		c.Header = "X-Session-ID"
	}
}

// Validate names the bad setting.
func (c *ShadowSettings) Validate() error {
	if c.MaxSessions < 0 {
		return errors.New("session_shadow max_sessions must be positive")
	}
	return nil
}
