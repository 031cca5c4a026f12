package metrics

import (
	"maps"
	"sync"
	"sync/atomic"
)

// labelValues are the label values of one child of a metric vector, in the
// vector's label order; values past the vector's label count are "".
type labelValues struct{ a, b, c string }

// children caches the children of one metric vector by their label values,
// so that the request path finds a child with one map lookup and no lock
// (the vector's WithLabelValues validates the values as UTF-8, hashes them
// byte by byte and takes the vector's lock on every call). A child is
// created by the vector's WithLabelValues on its first use, when the
// uncached code created it too: the exposition is the same. The map is
// copied on each new child (the label sets are bounded: upstreams, models,
// outcomes, reasons), read without a lock.
//
// A vector with a cache must be reset through Set.Reset, which drops the
// cache with the vector's children.
type children[T any] struct {
	with func(...string) T // the vector's WithLabelValues
	n    int               // the vector's label count
	mu   sync.Mutex
	m    atomic.Pointer[map[labelValues]T]
}

func newChildren[T any](n int, with func(...string) T) *children[T] {
	return &children[T]{with: with, n: n}
}

// get returns the child for the label values k.
func (c *children[T]) get(k labelValues) T {
	if m := c.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	return c.add(k)
}

// add creates the child for k and caches it.
func (c *children[T]) add(k labelValues) T {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
	}
	vals := [3]string{k.a, k.b, k.c}
	v := c.with(vals[:c.n]...)
	c.m.Store(copyWith(old, k, v))
	return v
}

// reset forgets every cached child (the vector was reset).
func (c *children[T]) reset() {
	c.mu.Lock()
	c.m.Store(nil)
	c.mu.Unlock()
}

// copyWith returns a copy of *old (nil: none) with k set to v, for a map
// read without a lock and replaced under one.
func copyWith[K comparable, V any](old *map[K]V, k K, v V) *map[K]V {
	var m map[K]V
	if old != nil {
		m = make(map[K]V, len(*old)+1)
		maps.Copy(m, *old)
	} else {
		m = make(map[K]V, 1)
	}
	m[k] = v
	return &m
}
