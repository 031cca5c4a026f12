package fleetsim

import (
	"container/heap"
	"time"
)

// stepQueue orders the busy engines by the end of their step in flight,
// lowest replica first on ties, so that the event loop finds the next step
// end in O(log n) instead of asking every engine per event. An engine's
// entry changes only when the loop touches it (advances it or submits to
// it); the loop marks those dirty and refreshes them before the next pick.
type stepQueue struct {
	at    []time.Duration // by replica: end of its step in flight
	pos   []int           // by replica: index in order, -1 when idle
	order []int           // heap of busy replicas
	dirty []int
}

func newStepQueue(n int) *stepQueue {
	q := &stepQueue{at: make([]time.Duration, n), pos: make([]int, n), order: make([]int, 0, n), dirty: make([]int, 0, n)}
	for i := range q.pos {
		q.pos[i] = -1
		q.dirty = append(q.dirty, i) // every engine is asked once at the start, in replica order
	}
	return q
}

func (q *stepQueue) Len() int { return len(q.order) }
func (q *stepQueue) Less(i, j int) bool {
	a, b := q.order[i], q.order[j]
	if q.at[a] != q.at[b] {
		return q.at[a] < q.at[b]
	}
	return a < b
}
func (q *stepQueue) Swap(i, j int) {
	q.order[i], q.order[j] = q.order[j], q.order[i]
	q.pos[q.order[i]], q.pos[q.order[j]] = i, j
}
func (q *stepQueue) Push(x any) {
	r := x.(int)
	q.pos[r] = len(q.order)
	q.order = append(q.order, r)
}
func (q *stepQueue) Pop() any {
	r := q.order[len(q.order)-1]
	q.order = q.order[:len(q.order)-1]
	q.pos[r] = -1
	return r
}

// touch marks replica r's next step time as stale.
func (q *stepQueue) touch(r int) {
	for _, d := range q.dirty {
		if d == r {
			return
		}
	}
	q.dirty = append(q.dirty, r)
}

// refresh asks every touched engine for its next step end (which plans a
// step on an engine that has work and none in flight), in the order they
// were touched, and returns the earliest step end overall and its replica
// (-1 when every engine is idle).
func (q *stepQueue) refresh(next func(r int) (time.Duration, bool)) (time.Duration, int) {
	for _, r := range q.dirty {
		t, ok := next(r)
		switch p := q.pos[r]; {
		case !ok && p >= 0:
			heap.Remove(q, p)
		case ok && p >= 0:
			q.at[r] = t
			heap.Fix(q, p)
		case ok:
			q.at[r] = t
			heap.Push(q, r)
		}
	}
	q.dirty = q.dirty[:0]
	if len(q.order) == 0 {
		return 0, -1
	}
	r := q.order[0]
	return q.at[r], r
}
