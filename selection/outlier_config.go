package selection

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
)

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
	if clientGone {
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
