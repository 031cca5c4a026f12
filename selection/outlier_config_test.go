package selection

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

func TestClassifyOutcome(t *testing.T) {
	tests := []struct {
		status     int
		err        error
		clientGone bool
		kind       FailureKind
		failed     bool
	}{
		{200, nil, false, 0, false},
		{404, nil, false, 0, false},
		{500, nil, false, FailStatus, true},
		{503, nil, false, FailStatus, true},
		{200, http.ErrAbortHandler, false, FailCut, true},
		{200, http.ErrAbortHandler, true, 0, false}, // the client went away
		{0, errors.New("dial tcp: connection refused"), false, FailConnect, true},
		{0, fmt.Errorf("round trip: %w", context.DeadlineExceeded), false, FailTimeout, true},
	}
	for _, tc := range tests {
		kind, failed := ClassifyOutcome(tc.status, tc.err, tc.clientGone)
		if failed != tc.failed || (failed && kind != tc.kind) {
			t.Errorf("ClassifyOutcome(%d, %v, %v) = %v, %v; want %v, %v", tc.status, tc.err, tc.clientGone, kind, failed, tc.kind, tc.failed)
		}
	}
}

func TestCheckSettings(t *testing.T) {
	for _, tc := range []struct {
		give OutlierConfig
		want string
	}{
		{OutlierConfig{}, ""},
		{OutlierConfig{ConsecutiveFailures: -1}, ""},
		{OutlierConfig{ConsecutiveFailures: -2}, "positive or -1"},
		{OutlierConfig{BaseEjection: 60e9, MaxEjection: 1e9}, "max_ejection"},
		{OutlierConfig{ConsecutiveFailures: 1}, ""}, // cuts default to 1 then
		{OutlierConfig{ConsecutiveCuts: 5}, ""},
		{OutlierConfig{ConsecutiveCuts: 6}, "consecutive_cuts"},
		{OutlierConfig{ConsecutiveCuts: -1}, "consecutive_cuts"},
	} {
		err := tc.give.CheckSettings()
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckSettings(%+v) = %v, want %q", tc.give, err, tc.want)
		}
	}
}
