package integrity

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Resolved is s with its secrets resolved by resolve (the upstream token
// into Token, spec_decode's commitment key into Key; the module resolves
// Caddy placeholders) and the defaults filled. s's own spec_decode is
// left as it was.
func (s Settings) Resolved(resolve func(string) string) Settings {
	s.Token = resolve(s.UpstreamToken)
	if s.Spec != nil {
		sd := *s.Spec
		sd.Key = []byte(resolve(sd.CommitmentKey))
		s.Spec = &sd
	}
	s.Defaults()
	return s
}

// Fingerprint is a hash of s and its resolved secrets: a service is
// shared (a config reload keeps it) while the fingerprint stays the same.
func (s Settings) Fingerprint() uint64 {
	var key []byte
	if s.Spec != nil {
		key = s.Spec.Key
	}
	b, _ := json.Marshal(struct {
		S     Settings
		Token string
		Key   []byte
	}{s, s.Token, key})
	return xxhash.Sum64(b)
}

// stores shares one Store per state file among the services using it: a
// reload starts the new config's service before the old one stops, and two
// writers of one file would drop each other's commitments.
var stores = struct {
	mu sync.Mutex
	m  map[string]*sharedStore // by absolute path
}{m: map[string]*sharedStore{}}

type sharedStore struct {
	s    *Store
	key  string
	refs int
}

// AcquireStore opens the store of the state file path under key, or
// shares the one already open for that file; release drops the reference
// (the last one forgets the store). A file already open under another key
// is refused.
func AcquireStore(path string, key []byte) (s *Store, release func(), err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, nil, fmt.Errorf("state_file: %w", err)
	}
	stores.mu.Lock()
	defer stores.mu.Unlock()
	sh := stores.m[abs]
	if sh == nil {
		st, err := OpenStore(abs, key)
		if err != nil {
			return nil, nil, err
		}
		sh = &sharedStore{s: st, key: string(key)}
		stores.m[abs] = sh
	}
	if sh.key != string(key) {
		return nil, nil, fmt.Errorf("state_file %s is in use under another commitment_key", abs)
	}
	sh.refs++
	var once sync.Once
	return sh.s, func() {
		once.Do(func() {
			stores.mu.Lock()
			defer stores.mu.Unlock()
			if sh.refs--; sh.refs == 0 && stores.m[abs] == sh {
				delete(stores.m, abs)
			}
		})
	}, nil
}
