package catalog

import "sync"

// Other is the name given to every model past a full Names.
const Other = "other"

// Names is a bounded set of model names. A name joins with Add (an engine
// listed it, or answered a request for it) while fewer than the bound are
// held; Label maps every other name to Other, so that a client's made-up
// names never become anything unbounded (a metric series, a map entry).
// Safe for concurrent use.
type Names struct {
	max   int
	mu    sync.RWMutex
	known map[string]string
}

// NewNames returns an empty set holding at most max names.
func NewNames(max int) *Names { return &Names{max: max, known: map[string]string{}} }

// Has reports whether name is in the set.
func (n *Names) Has(name string) bool {
	n.mu.RLock()
	_, ok := n.known[name]
	n.mu.RUnlock()
	return ok
}

// Label returns name when it is in the set, else Other ("" stays "").
func (n *Names) Label(name string) string {
	if name == "" || n.Has(name) {
		return name
	}
	return Other
}

// Intern returns b as a string: the held one when b is in the set (no
// allocation on the request path for the models in use), else a copy.
func (n *Names) Intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	n.mu.RLock()
	s, ok := n.known[string(b)]
	n.mu.RUnlock()
	if ok {
		return s
	}
	return string(b)
}

// Add puts name in the set unless it is full, and returns its label.
func (n *Names) Add(name string) string {
	if name == "" {
		return ""
	}
	if n.Has(name) {
		return name
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.known[name]; ok {
		return name
	}
	if len(n.known) >= n.max {
		return Other
	}
	n.known[name] = name
	return name
}

// Len is how many names are held.
func (n *Names) Len() int {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return len(n.known)
}
