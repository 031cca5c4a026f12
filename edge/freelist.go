package edge

import "sync"

// FreeList keeps objects for reuse: at most Max (the rest are left to the
// collector), last in first out, counted under its lock. The module pools
// its request states in one. The zero value keeps none.
type FreeList[T any] struct {
	Max int

	mu    sync.Mutex
	free  []*T
	stats FreeListStats
}

// FreeListStats counts a FreeList's traffic.
type FreeListStats struct {
	Made    uint64 // objects allocated by Get
	Reused  uint64 // objects Get took from the list
	Put     uint64 // objects handed back
	Dropped uint64 // handed back past Max
	Kept    uint64 // objects their owner did not hand back (Keep)
}

// Get returns an object from the list, or a new zero one.
func (l *FreeList[T]) Get() *T {
	l.mu.Lock()
	if n := len(l.free); n > 0 {
		x := l.free[n-1]
		l.free = l.free[:n-1]
		l.stats.Reused++
		l.mu.Unlock()
		return x
	}
	l.stats.Made++
	l.mu.Unlock()
	return new(T)
}

// Put hands x back; the caller must have zeroed it and hold no reference.
func (l *FreeList[T]) Put(x *T) {
	l.mu.Lock()
	if l.stats.Put++; len(l.free) < l.Max {
		l.free = append(l.free, x)
	} else {
		l.stats.Dropped++
	}
	l.mu.Unlock()
}

// Keep counts an object its owner could not hand back.
func (l *FreeList[T]) Keep() {
	l.mu.Lock()
	l.stats.Kept++
	l.mu.Unlock()
}

// NewFreeList returns a list keeping at most max objects, reported by
// name in FreeLists (the ramjet_free_list_* metrics).
func NewFreeList[T any](name string, max int) *FreeList[T] {
	l := &FreeList[T]{Max: max}
	freeLists.Lock()
	freeLists.l = append(freeLists.l, namedFreeList{name, l.Stats, max})
	freeLists.Unlock()
	return l
}

// namedFreeList is a list NewFreeList made, for FreeLists.
type namedFreeList struct {
	name  string
	stats func() (FreeListStats, int)
	max   int
}

// freeLists are the lists NewFreeList made.
var freeLists struct {
	sync.Mutex
	l []namedFreeList
}

// FreeLists calls f with each list NewFreeList made: its name, counts, the
// objects it holds and its bound.
func FreeLists(f func(name string, s FreeListStats, held, max int)) {
	freeLists.Lock()
	l := freeLists.l
	freeLists.Unlock()
	for _, n := range l {
		s, held := n.stats()
		f(n.name, s, held, n.max)
	}
}

// Stats returns the counts so far and how many objects the list holds.
func (l *FreeList[T]) Stats() (FreeListStats, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats, len(l.free)
}
