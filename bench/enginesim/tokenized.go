package enginesim

import (
	"fmt"
	"hash/fnv"
	"net/http"
	"sync"
	"time"
)

// TokenizedHeader carries, on a chat response, when a /tokenize call for
// the same messages was served by any engine sharing the run's
// TokenizeLog: "<start>,<end>" in Unix nanoseconds (absent if none was).
// With ReceivedHeader the load generator tells a request that waited for
// its router's preflight (loadgen.Result.TokenizeStart, TokenizeEnd).
const TokenizedHeader = "X-Sim-Tokenized"

// TokenizeLog records the first /tokenize call per message list, shared by
// the engines of one run (Options.Tokenized).
type TokenizeLog struct {
	mu sync.Mutex
	m  map[uint64][2]int64
}

// note records a call for key served from start to end, unless one was.
func (l *TokenizeLog) note(key uint64, start, end time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[uint64][2]int64{}
	}
	if _, ok := l.m[key]; !ok {
		l.m[key] = [2]int64{start.UnixNano(), end.UnixNano()}
	}
}

// header sets TokenizedHeader on w for key, if a call was recorded.
func (l *TokenizeLog) header(w http.ResponseWriter, key uint64) {
	l.mu.Lock()
	t, ok := l.m[key]
	l.mu.Unlock()
	if ok {
		w.Header().Set(TokenizedHeader, fmt.Sprintf("%d,%d", t[0], t[1]))
	}
}

// messagesKey hashes a chat's roles and contents (0 without messages).
func messagesKey(ms []chatMessage) uint64 {
	if len(ms) == 0 {
		return 0
	}
	h := fnv.New64a()
	for _, m := range ms {
		c, _ := contentText(m.Content)
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00", m.Role, len(c), c)
	}
	return h.Sum64()
}
