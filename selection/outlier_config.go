package selection

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/ramjet-llm/ramjet/duration"
)

// OutlierSettings tune outlier detection: the outcome of every attempt
// (a 5xx answer, a connection failure, a stream cut before its end, a
// first-token timeout count against the replica; any other answer for it)
// feeds a per-replica detector shared by the fleet (Outlier). An
// ejected replica is not offered to selection, so that a replica whose
// answers fail never wins on load.
type OutlierSettings struct {
	// ConsecutiveFailures ejects a replica after this many failed attempts
	// in a row. Default 5; -1 turns outlier detection off.
	ConsecutiveFailures int `json:"consecutive_failures,omitempty"`
	// ConsecutiveCuts ejects a replica after this many streams in a row
	// that it cut after they started (the client sees those: they cannot
	// be retried). Default 2 (at most consecutive_failures).
	ConsecutiveCuts int `json:"consecutive_cuts,omitempty"`
	// BaseEjection is how long the first ejection lasts; the n-th
	// ejection in a row lasts n times as long. After it, one request
	// probes the replica: success re-admits it, failure ejects it again.
	// Default 10s.
	BaseEjection duration.Duration `json:"base_ejection,omitempty"`
	// MaxEjection caps an ejection. Default 5m.
	MaxEjection duration.Duration `json:"max_ejection,omitempty"`
	// MaxEjectedPercent caps the share of the replicas ejected at once, in
	// percent; one replica may always be ejected. Default 50.
	MaxEjectedPercent int `json:"max_ejected_percent,omitempty"`
}

// Config returns the detector settings (zero values: the defaults).
func (o OutlierSettings) Config() OutlierConfig {
	c := OutlierConfig{
		ConsecutiveFailures: o.ConsecutiveFailures,
		ConsecutiveCuts:     o.ConsecutiveCuts,
		BaseEjection:        time.Duration(o.BaseEjection),
		MaxEjection:         time.Duration(o.MaxEjection),
		MaxEjectedPercent:   o.MaxEjectedPercent,
	}
	return c
}

// Validate names the bad setting (OutlierConfig.CheckSettings).
func (o OutlierSettings) Validate() error { return o.Config().CheckSettings() }

// CheckSettings validates outlier settings as an operator gives them: zero
// fields take the defaults, ConsecutiveFailures -1 turns detection off and
// anything below it is refused, naming the field.
func (c OutlierConfig) CheckSettings() error {
	if c.ConsecutiveFailures < -1 {
		return fmt.Errorf("outlier consecutive_failures must be positive or -1 (off), got %d", c.ConsecutiveFailures)
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return fmt.Errorf("outlier: %w", err)
	}
	return nil
}

// ClassifyOutcome says whether an attempt's outcome counts against the
// replica, and how. status is the status sent to the client (0: none),
// err the handler chain's error (http.ErrAbortHandler: the stream was
// cut), clientGone that the client's context ended: a request its client
// abandoned says nothing about the replica.
func ClassifyOutcome(status int, err error, clientGone bool) (FailureKind, bool) {
	if clientGone || err == nil && status < 500 { // the second: a success, clientGone or not (callers may skip finding it)
		return 0, false
	}
	switch {
	case errors.Is(err, http.ErrAbortHandler):
		return FailCut, true
	case status >= 500:
		return FailStatus, true
	case status == 0 && err != nil:
		if isTimeout(err) {
			return FailTimeout, true
		}
		return FailConnect, true
	}
	return 0, false
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
