package kvindex

import "time"

// The counters and gauges below are read at scrape time by the module's
// Prometheus collector; kvindex itself knows nothing of Prometheus.

// Entries is the number of (replica, block) entries held.
func (x *Index) Entries() int64 { return x.entries.Load() }

// Bytes is the accounted memory of the entries held (Entries × EntryBytes).
func (x *Index) Bytes() int64 { return x.entries.Load() * EntryBytes }

// MaxEntries is the entry budget.
func (x *Index) MaxEntries() int { return x.cfg.MaxEntries }

// EventsApplied counts events applied (BlockStored, BlockRemoved and
// AllBlocksCleared of the GPU tier).
func (x *Index) EventsApplied() uint64 { return x.eventsApplied.Load() }

// DecodeErrors counts messages dropped because they could not be decoded.
func (x *Index) DecodeErrors() uint64 { return x.decodeErrors.Load() }

// Gaps counts sequence gaps seen (replayed or not).
func (x *Index) Gaps() uint64 { return x.gaps.Load() }

// Replayed counts messages recovered through the replay socket.
func (x *Index) Replayed() uint64 { return x.replayed.Load() }

// Fences counts fences of every replica for one reason.
func (x *Index) Fences(why FenceReason) uint64 { return x.fences[why].Load() }

// Evictions counts entries evicted to stay within MaxEntries.
func (x *Index) Evictions() uint64 { return x.evictions.Load() }

// Orphans counts BlockStored events dropped because their parent block was
// unknown (so their keys could not be chained).
func (x *Index) Orphans() uint64 { return x.orphans.Load() }

// Removed counts blocks removed by BlockRemoved events.
func (x *Index) Removed() uint64 { return x.removed.Load() }

// UnknownRemovals counts BlockRemoved hashes the index did not hold.
func (x *Index) UnknownRemovals() uint64 { return x.unknownRemovals.Load() }

// Skipped counts events ignored: unknown kinds, other storage tiers, other
// KV-cache groups, invalid block sizes.
func (x *Index) Skipped() uint64 { return x.skipped.Load() }

// BlockSizeMismatches counts BlockStored events whose block size differs
// from Config.BlockSize (their blocks can never match a request).
func (x *Index) BlockSizeMismatches() uint64 { return x.sizeMismatch.Load() }

// NonChain counts blocks of BlockStored events that were skipped because
// the event was provably not one contiguous chain under its parent (a block
// of known identity whose chained key disagreed), and the block's own
// identity was unknown. They are counted in Skipped too.
func (x *Index) NonChain() uint64 { return x.nonChain.Load() }

// ReplayFailures counts replay requests that did not recover every missed
// message (unreachable socket, unexpected framing, buffer too short).
func (x *Index) ReplayFailures() uint64 { return x.replayFailures.Load() }

func (x *Index) noteReplayFailure(r Replica) {
	x.replayFailures.Add(1)
	x.mu.Lock()
	x.reps[r].replayFailures++
	x.mu.Unlock()
}

// noteDecodeError counts one undecodable message of r.
func (x *Index) noteDecodeError(r Replica) {
	x.decodeErrors.Add(1)
	x.mu.Lock()
	x.reps[r].decodeErrors++
	x.mu.Unlock()
}

func (x *Index) noteGap(r Replica) {
	x.gaps.Add(1)
	x.mu.Lock()
	x.reps[r].gaps++
	x.mu.Unlock()
}

// beginJoin marks r's feed as rebuilding its entries from the engine's
// replay buffer (a non-strict replay): not fresh until endReplay, so that
// precise decisions do not read a partly rebuilt index as the engine's
// cache.
func (x *Index) beginJoin(r Replica) {
	x.mu.Lock()
	x.reps[r].joining = true
	x.fresh.del(r)
	x.mu.Unlock()
}

// endReplay counts a replay's n messages and ends a join: r is fresh again
// once it applied any (and is healthy); otherwise its next stored or
// removed block makes it so, as before the join.
func (x *Index) endReplay(r Replica, n int) {
	x.replayed.Add(uint64(n))
	x.mu.Lock()
	rep := x.reps[r]
	rep.replayed += uint64(n)
	if rep.joining {
		rep.joining = false
		if n > 0 && rep.unhealthy == "" {
			x.fresh.add(r)
		}
	}
	x.mu.Unlock()
}

func (x *Index) noteMessage(r Replica, seq uint64) {
	x.mu.Lock()
	rep := x.reps[r]
	rep.messages++
	rep.lastSeq = seq
	x.mu.Unlock()
}

// noteStart records that r's next message is the engine's first
// (sequence 0) and the index holds nothing of r: from there on the index is
// complete.
func (x *Index) noteStart(r Replica) {
	x.mu.Lock()
	if rep := x.reps[r]; len(rep.byEngine) == 0 {
		rep.complete = true
	}
	x.mu.Unlock()
}

func (x *Index) noteConnected(r Replica, up bool) {
	x.mu.Lock()
	x.reps[r].connected = up
	x.mu.Unlock()
}

// Stats returns the stats of replica r.
func (x *Index) Stats(r Replica) ReplicaStats {
	var buf [1]ReplicaStats
	x.mu.RLock()
	n := len(x.reps)
	x.mu.RUnlock()
	if int(r) >= n || r < 0 {
		return buf[0]
	}
	return x.AppendReplicaStats(make([]ReplicaStats, 0, n))[r]
}

// ReplicaStats is one replica's state, for metrics and the admin API.
type ReplicaStats struct {
	ID    string
	Fresh bool
	// Connected reports a live event connection (Subscriber only).
	Connected bool
	// Complete reports that the entries mirror the engine's whole cache:
	// the index followed it from its first message or from an empty cache.
	// A replica joined late (its replay buffer no longer reaching sequence
	// 0) is fresh but partial: cached blocks hit since without being stored
	// again are missing, so its precise overlap may be an underestimate.
	Complete bool
	// Messages counts messages received; LastSeq is the last one's number.
	Messages     uint64
	LastSeq      uint64
	Entries      int
	Applied      uint64
	Fences       uint64
	DecodeErrors uint64
	Gaps         uint64
	Replayed     uint64
	// Healthy reports that the feed's stores land in the index;
	// Unhealthy is the reason when not (see Config.MaxOrphanRun).
	Healthy   bool
	Unhealthy string
	// Orphans counts this replica's stores dropped for an unknown parent;
	// ReplayFailures its incomplete replays.
	Orphans        uint64
	ReplayFailures uint64
	// LastEvent is when the replica's last event was applied (zero if never).
	LastEvent time.Time
}

// AppendReplicaStats appends every replica's stats to dst, in handle order.
func (x *Index) AppendReplicaStats(dst []ReplicaStats) []ReplicaStats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for i, rep := range x.reps {
		dst = append(dst, ReplicaStats{
			ID: rep.id, Fresh: x.fresh.has(Replica(i)), Entries: len(rep.byEngine),
			Applied: rep.applied, Fences: rep.fences, DecodeErrors: rep.decodeErrors,
			Gaps: rep.gaps, Replayed: rep.replayed, LastEvent: rep.lastEvent,
			Connected: rep.connected, Messages: rep.messages, LastSeq: rep.lastSeq,
			Complete: rep.complete && !rep.joining, Healthy: rep.unhealthy == "", Unhealthy: rep.unhealthy,
			Orphans: rep.orphans, ReplayFailures: rep.replayFailures,
		})
	}
	return dst
}
