package fleetstate

import (
	"sort"
	"sync"
	"sync/atomic"
)

// Latest maps a state_key to the value provisioned last under it: an
// immutable map replaced on every change (rare), so that lookups on the
// request path take no lock. The zero value is empty and ready.
type Latest[T comparable] struct {
	mu sync.Mutex // serialises writers
	m  atomic.Pointer[map[string]T]
	// one is the map's entry when it holds exactly one (one state_key, the
	// common configuration), which Get compares the key with instead of a
	// map lookup; nil otherwise. Stored before m.
	one atomic.Pointer[latestEntry[T]]
}

type latestEntry[T any] struct {
	key string
	v   T
}

// update replaces the map with a copy changed by fn.
func (l *Latest[T]) update(fn func(map[string]T)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := make(map[string]T)
	if m := l.m.Load(); m != nil {
		for k, v := range *m {
			next[k] = v
		}
	}
	fn(next)
	var one *latestEntry[T]
	for k, v := range next {
		if len(next) == 1 {
			one = &latestEntry[T]{k, v}
		}
	}
	l.one.Store(one)
	l.m.Store(&next)
}

// Set points key at v.
func (l *Latest[T]) Set(key string, v T) {
	l.update(func(m map[string]T) { m[key] = v })
}

// Drop removes key when it still points at old.
func (l *Latest[T]) Drop(key string, old T) {
	l.update(func(m map[string]T) {
		if v, ok := m[key]; ok && v == old {
			delete(m, key)
		}
	})
}

// Get returns the value of key.
func (l *Latest[T]) Get(key string) (T, bool) {
	if e := l.one.Load(); e != nil && e.key == key {
		return e.v, true
	}
	var zero T
	m := l.m.Load()
	if m == nil {
		return zero, false
	}
	v, ok := (*m)[key]
	return v, ok
}

// Empty reports whether no key is set: one atomic load and no lookup,
// for a request path that has nothing to do while nothing is.
func (l *Latest[T]) Empty() bool {
	m := l.m.Load()
	return m == nil || len(*m) == 0
}

// Keys lists the keys, sorted.
func (l *Latest[T]) Keys() []string {
	keys, _ := l.sorted()
	return keys
}

// Values lists the values, by key.
func (l *Latest[T]) Values() []T {
	_, vals := l.sorted()
	return vals
}

// sorted lists the keys, sorted, and their values, from one map.
func (l *Latest[T]) sorted() ([]string, []T) {
	m := l.m.Load()
	if m == nil {
		return nil, nil
	}
	keys := make([]string, 0, len(*m))
	for k := range *m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	vals := make([]T, len(keys))
	for i, k := range keys {
		vals[i] = (*m)[k]
	}
	return keys, vals
}
