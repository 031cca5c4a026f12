package catalog

import (
	"sync"
	"sync/atomic"
)

// Other is the name given to every model past a full Names.
const Other = "other"

// Names is a bounded set of model names. A name joins with Add (an engine
// listed it, or answered a request for it) while fewer than the bound are
// held; Label maps every other name to Other, so that a client's made-up
// names never become anything unbounded (a metric series, a map entry).
// Safe for concurrent use: readers (every request asks) take no lock; a
// name joining copies the map.
type Names struct {
	max   int
	mu    sync.Mutex // serializes Add's copies
	known atomic.Pointer[map[string]string]
	// one is the held name when the set holds exactly one (a one-model
	// fleet), which the readers compare with instead of a map lookup; nil
	// otherwise. Stored before known (store).
	one atomic.Pointer[string]
}

// store makes m the set (m is never changed after).
func (n *Names) store(m map[string]string) {
	var one *string
	for _, v := range m {
		if len(m) == 1 {
			one = &v
		}
	}
	n.one.Store(one)
	n.known.Store(&m)
}

// NewNames returns a set holding at most max names, with the first of
// names (as many Adds would, without a copy each).
func NewNames(max int, names ...string) *Names {
	m := make(map[string]string, min(len(names), max))
	for _, s := range names {
		if s != "" && len(m) < max {
			m[s] = s
		}
	}
	n := &Names{max: max}
	n.store(m)
	return n
}

// Has reports whether name is in the set.
func (n *Names) Has(name string) bool {
	if one := n.one.Load(); one != nil {
		return *one == name
	}
	_, ok := (*n.known.Load())[name]
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
	if one := n.one.Load(); one != nil {
		if *one == string(b) {
			return *one
		}
		return string(b)
	}
	if s, ok := (*n.known.Load())[string(b)]; ok {
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
	old := *n.known.Load()
	if _, ok := old[name]; ok {
		return name
	}
	if len(old) >= n.max {
		return Other
	}
	m := make(map[string]string, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[name] = name
	n.store(m)
	return name
}

// Len is how many names are held.
func (n *Names) Len() int { return len(*n.known.Load()) }
