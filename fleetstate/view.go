package fleetstate

import (
	"strconv"

	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/upstream"
)

// View is one upstream list as a policy routes it: for each entry, in the
// list's order, the replica key, slot, rank, route id and engine profile,
// and the header values the policy sets, built once per list so that the
// request path does no string work.
type View struct {
	Keys     []string
	Slots    []selection.Slot // -1 when the Router is full
	Ranks    []int            // -1 when the dial appears once
	RankHdr  [][]string       // X-data-parallel-rank header value, nil when none
	IDs      []string
	IDHdr    [][]string // X-Ramjet-Upstream header value (len = cap = 1)
	Profiles []selection.Profile
	// Untracked: some entry has no slot (past selection.MaxReplicas).
	Untracked bool
}

// NewView registers the replicas of the upstream list dials in f (a dial
// listed k times is k data-parallel ranks of one engine, each its own
// replica) and returns their view. profiles gives an engine profile by
// replica key ("address#rank") or by dial. Each replica that cannot be
// registered (the Router is full) is reported to failed and has slot -1.
func (f *Fleet) NewView(dials []string, profiles map[string]selection.Profile, failed func(error)) View {
	n := len(dials)
	v := View{
		Keys:     make([]string, n),
		Slots:    make([]selection.Slot, n),
		Ranks:    upstream.Ranks(dials),
		RankHdr:  make([][]string, n),
		IDs:      make([]string, n),
		IDHdr:    make([][]string, n),
		Profiles: make([]selection.Profile, n),
	}
	for i, rank := range v.Ranks {
		key := selection.ReplicaKey(dials[i], rank)
		if rank >= 0 {
			v.RankHdr[i] = []string{strconv.Itoa(rank)}
		}
		v.Keys[i] = key
		slot, id, err := f.Register(key)
		if err != nil {
			failed(err)
		}
		v.Slots[i], v.IDs[i] = slot, id
		if slot < 0 {
			v.Untracked = true
		}
		v.IDHdr[i] = []string{id}
		if p, ok := profiles[key]; ok {
			v.Profiles[i] = p
		} else if p, ok := profiles[dials[i]]; ok {
			v.Profiles[i] = p
		}
	}
	return v
}

// Tracked returns the replica keys of the entries that have a slot, in
// order.
func (v *View) Tracked() []string {
	keys := make([]string, 0, len(v.Keys))
	for i, k := range v.Keys {
		if v.Slots[i] >= 0 {
			keys = append(keys, k)
		}
	}
	return keys
}
