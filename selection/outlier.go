package selection

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// FailureKind says how an attempt on a replica failed.
type FailureKind uint8

const (
	// FailStatus: the replica answered 5xx.
	FailStatus FailureKind = iota
	// FailConnect: the round trip failed before a response (dial error,
	// reset, refused).
	FailConnect
	// FailCut: the response stream ended before its end.
	FailCut
	// FailTimeout: no response (first byte) within the deadline.
	FailTimeout
	numFailureKinds
)

// String is the metrics label of the kind.
func (k FailureKind) String() string {
	switch k {
	case FailStatus:
		return "status"
	case FailConnect:
		return "connect"
	case FailCut:
		return "cut"
	case FailTimeout:
		return "timeout"
	}
	return "unknown"
}

// FailureKinds lists every kind, for metrics.
var FailureKinds = [...]FailureKind{FailStatus, FailConnect, FailCut, FailTimeout}

// OutlierConfig tunes outlier detection (as Envoy's): a replica whose
// ConsecutiveFailures last answers all failed is ejected for
// BaseEjection x (number of times it was ejected without MaxEjection of
// good behaviour in between), at most MaxEjection; at
// most MaxEjectedPercent of the fleet (and always at least one replica) is
// ejected at once. After its ejection time a replica is half-open: one
// request goes through (the probe); success re-admits it, failure ejects it
// again for longer.
type OutlierConfig struct {
	// ConsecutiveFailures ejects a replica after this many failed
	// attempts in a row. Default 5; negative turns ejection off.
	ConsecutiveFailures int
	// ConsecutiveCuts ejects a replica after this many streams in a row
	// that it cut after their first bytes reached the client. Such a
	// failure cannot be retried (the client sees it), so it weighs more:
	// in a mixed run of failures each cut counts as
	// ConsecutiveFailures/ConsecutiveCuts failures. Default 2; at most
	// ConsecutiveFailures.
	ConsecutiveCuts int
	// BaseEjection is the first ejection time; the n-th ejection in a row
	// lasts n times as long. Default 10s.
	BaseEjection time.Duration
	// MaxEjection caps the ejection time. Default 5m.
	MaxEjection time.Duration
	// MaxEjectedPercent caps the share of the fleet ejected at once, in
	// percent (1-100); one replica may always be ejected. Default 50.
	MaxEjectedPercent int
}

// Outlier defaults.
const (
	DefaultConsecutiveFailures = 5
	DefaultConsecutiveCuts     = 2
	DefaultBaseEjection        = 10 * time.Second
	DefaultMaxEjection         = 5 * time.Minute
	DefaultMaxEjectedPercent   = 50
)

// SetDefaults fills zero values.
func (c *OutlierConfig) SetDefaults() {
	if c.ConsecutiveFailures == 0 {
		c.ConsecutiveFailures = DefaultConsecutiveFailures
	}
	if c.ConsecutiveCuts == 0 {
		c.ConsecutiveCuts = min(DefaultConsecutiveCuts, max(1, c.ConsecutiveFailures))
	}
	if c.BaseEjection == 0 {
		c.BaseEjection = DefaultBaseEjection
	}
	if c.MaxEjection == 0 {
		c.MaxEjection = DefaultMaxEjection
	}
	if c.MaxEjectedPercent == 0 {
		c.MaxEjectedPercent = DefaultMaxEjectedPercent
	}
}

// Validate rejects values that cannot work, naming the setting.
func (c OutlierConfig) Validate() error {
	if c.ConsecutiveCuts < 0 || (c.ConsecutiveFailures > 0 && c.ConsecutiveCuts > c.ConsecutiveFailures) {
		return fmt.Errorf("outlier_consecutive_cuts must be 1 to consecutive_failures (%d), got %d", c.ConsecutiveFailures, c.ConsecutiveCuts)
	}
	if c.BaseEjection < 0 {
		return fmt.Errorf("outlier_base_ejection must be positive, got %v", c.BaseEjection)
	}
	if c.MaxEjection < 0 || (c.MaxEjection > 0 && c.MaxEjection < c.BaseEjection) {
		return fmt.Errorf("outlier_max_ejection must be at least outlier_base_ejection, got %v", c.MaxEjection)
	}
	if c.MaxEjectedPercent < 0 || c.MaxEjectedPercent > 100 {
		return fmt.Errorf("outlier_max_ejected_percent must be 1-100, got %d", c.MaxEjectedPercent)
	}
	return nil
}

// Outlier tracks the recent outcomes of every replica of a fleet and
// ejects the failing ones. Usable is lock-free (two atomic loads); Report
// takes a mutex. Safe for concurrent use.
type Outlier struct {
	cfg OutlierConfig
	now func() time.Time

	// until[s] is the end of slot s's ejection in Unix nanoseconds, 0
	// while it is admitted. probing[s] is set while its half-open probe
	// started (Unix nanoseconds, 0: none); a probe with no outcome after
	// BaseEjection (its client went away) no longer holds the door.
	until   [MaxReplicas]atomic.Int64
	probing [MaxReplicas]atomic.Int64

	mu sync.Mutex
	// consec[s] is s's run of failures, in units: a failure adds
	// ConsecutiveCuts, a cut ConsecutiveFailures; ejection at their
	// product (so ConsecutiveFailures failures, or ConsecutiveCuts cuts).
	consec  [MaxReplicas]int32
	times   [MaxReplicas]int32 // ejections in a row (the multiplier)
	back    [MaxReplicas]int64 // when s was last re-admitted (Unix ns)
	ejected atomic.Int32       // slots with until != 0 (written under mu; read lock-free by None)
	total   [MaxReplicas][numFailureKinds]atomic.Uint64
}

// NewOutlier returns a detector with cfg (defaults filled) on clock now
// (nil: time.Now).
func NewOutlier(cfg OutlierConfig, now func() time.Time) *Outlier {
	cfg.SetDefaults()
	if now == nil {
		now = time.Now
	}
	return &Outlier{cfg: cfg, now: now}
}

// Config returns the detector's settings.
func (o *Outlier) Config() OutlierConfig { return o.cfg }

// Usable reports whether s may be offered to selection: admitted, or
// half-open with no probe in flight.
func (o *Outlier) Usable(s Slot) bool {
	if s < 0 || s >= MaxReplicas {
		return true
	}
	u := o.until[s].Load()
	if u == 0 {
		return true
	}
	now := o.now().UnixNano()
	if now < u {
		return false
	}
	p := o.probing[s].Load()
	return p == 0 || now-p > int64(o.cfg.BaseEjection)
}

// Ejected reports whether s is out (ejected or half-open).
func (o *Outlier) Ejected(s Slot) bool {
	return s >= 0 && s < MaxReplicas && o.until[s].Load() != 0
}

// Picked tells the detector that s was chosen for an attempt: when s is
// half-open the attempt is its probe, and no other request is let through
// until the probe's outcome is reported.
func (o *Outlier) Picked(s Slot) {
	if s < 0 || s >= MaxReplicas || o.until[s].Load() == 0 {
		return
	}
	o.probing[s].Store(o.now().UnixNano())
}

// Success reports a good answer from s: it resets the failure count and
// re-admits s when it was half-open.
func (o *Outlier) Success(s Slot) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	if o.until[s].Load() == 0 && atomic.LoadInt32(&o.consec[s]) == 0 {
		return // the common case, lock-free
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	atomic.StoreInt32(&o.consec[s], 0)
	if u := o.until[s].Load(); u != 0 {
		if o.now().UnixNano() < u && o.probing[s].Load() == 0 {
			// An answer of a request sent before the ejection: the
			// ejection stands.
			return
		}
		o.until[s].Store(0)
		o.probing[s].Store(0)
		o.back[s] = o.now().UnixNano()
		o.ejected.Add(-1) // after until's clear: None is never early
	}
}

// Failure reports a failed attempt on s, in a fleet of fleet replicas. It
// returns true when s was ejected by this failure.
func (o *Outlier) Failure(s Slot, kind FailureKind, fleet int) bool {
	if s < 0 || s >= MaxReplicas || o.cfg.ConsecutiveFailures < 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	step := o.cfg.ConsecutiveCuts
	if kind == FailCut {
		step = o.cfg.ConsecutiveFailures
	}
	n := atomic.AddInt32(&o.consec[s], int32(step))
	now := o.now().UnixNano()
	if u := o.until[s].Load(); u != 0 {
		if now < u && o.probing[s].Load() == 0 {
			return false // ejected already; a late answer
		}
		// The half-open probe failed: out again, for longer.
		o.probing[s].Store(0)
		o.eject(s, now)
		o.total[s][kind].Add(1)
		return true
	}
	thr := o.cfg.ConsecutiveFailures * o.cfg.ConsecutiveCuts
	if int(n) < thr {
		return false
	}
	atomic.StoreInt32(&o.consec[s], int32(thr)) // a run held back by the cap stays bounded
	limit := fleet * o.cfg.MaxEjectedPercent / 100
	if limit < 1 {
		limit = 1
	}
	if int(o.ejected.Load()) >= limit {
		return false
	}
	o.ejected.Add(1) // before until is set: None is never late
	o.eject(s, now)
	o.total[s][kind].Add(1)
	return true
}

// eject sets s's ejection end from its multiplier. o.mu is held.
func (o *Outlier) eject(s Slot, now int64) {
	if o.back[s] != 0 && now-o.back[s] > int64(o.cfg.MaxEjection) {
		o.times[s] = 0 // well behaved since: start over
	}
	o.times[s]++
	d := time.Duration(o.times[s]) * o.cfg.BaseEjection
	if d > o.cfg.MaxEjection || d <= 0 {
		d = o.cfg.MaxEjection
	}
	o.until[s].Store(now + int64(d))
	atomic.StoreInt32(&o.consec[s], 0)
}

// Ejections returns how many ejections of s failures of kind caused.
func (o *Outlier) Ejections(s Slot, kind FailureKind) uint64 {
	if s < 0 || s >= MaxReplicas || kind >= numFailureKinds {
		return 0
	}
	return o.total[s][kind].Load()
}

// EjectedCount returns how many replicas are out now.
func (o *Outlier) EjectedCount() int { return int(o.ejected.Load()) }

// None reports that no replica is out now: Ejected is false for every
// slot (AppendCandidates then skips it).
func (o *Outlier) None() bool { return o.ejected.Load() == 0 }
