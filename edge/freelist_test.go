package edge

import (
	"sync"
	"testing"
)

// TestFreeListBounded: the list keeps at most Max objects and counts what
// it made, reused, took back, dropped and what was kept; concurrent users
// never get one object twice (run with -race).
func TestFreeListBounded(t *testing.T) {
	const max = 64
	l := FreeList[[96]byte]{Max: max}
	xs := make([]*[96]byte, max+10)
	for i := range xs {
		xs[i] = l.Get()
	}
	for _, x := range xs {
		l.Put(x)
	}
	l.Keep()
	st, n := l.Stats()
	if want := (FreeListStats{Made: max + 10, Put: max + 10, Dropped: 10, Kept: 1}); st != want || n != max {
		t.Fatalf("stats %+v holding %d, want %+v holding %d", st, n, want, max)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[*[96]byte]bool{}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				x := l.Get()
				mu.Lock()
				dup := seen[x]
				seen[x] = true
				mu.Unlock()
				if dup {
					t.Error("one object handed out twice")
				}
				x[0]++ // written by its one owner only
			}
		}()
	}
	wg.Wait()
	if st, n := l.Stats(); st.Reused != max || st.Made != max+10+400-max || n != 0 {
		t.Errorf("after 400 gets: %+v holding %d, want %d reused, %d made", st, n, max, 400+10)
	}
}
