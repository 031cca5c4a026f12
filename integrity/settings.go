package integrity

import (
	"errors"
	"fmt"
	"time"
)

// Settings is the integrity configuration of one fleet as the Caddy
// module's integrity block gives it (typed: durations, resolved secrets).
// Defaults fills the zero fields; Validate names the bad setting.
type Settings struct {
	Pins         Pins
	IdentityPath string
	Interval     time.Duration
	Timeout      time.Duration
	// Scheme is how the engines are reached: "http" or "https".
	Scheme string
	// Token is the upstream token sent with every check ("" none).
	Token string
	// Spec turns on the acceptance-collapse quarantine; nil: off.
	Spec *SpecSettings
}

// SpecSettings configures the acceptance-collapse quarantine.
type SpecSettings struct {
	// Mode is "observe" or "enforce".
	Mode    string
	Window  time.Duration
	Windows int
	// Position is the watched draft position; nil: overall.
	Position    *int
	MetricsPath string
	// StateFile and Key (the resolved commitment key) are required for
	// enforce.
	StateFile string
	Key       []byte
}

// Defaults fills the zero fields with the defaults.
func (s *Settings) Defaults() {
	if s.IdentityPath == "" {
		s.IdentityPath = DefaultIdentityPath
	}
	if s.Interval == 0 {
		s.Interval = 10 * time.Second
	}
	if s.Timeout == 0 {
		s.Timeout = 2 * time.Second
	}
	if s.Scheme == "" {
		s.Scheme = "http"
	}
	if sd := s.Spec; sd != nil {
		if sd.Mode == "" {
			sd.Mode = "observe"
		}
		if sd.Window == 0 {
			sd.Window = 10 * time.Second
		}
		if sd.Windows == 0 {
			sd.Windows = 3
		}
		if sd.MetricsPath == "" {
			sd.MetricsPath = "/metrics"
		}
	}
}

// Validate names the bad setting (the module's option names). It expects
// Defaults to have run.
func (s *Settings) Validate() error {
	if err := s.Pins.Validate(); err != nil {
		return fmt.Errorf("integrity: %w", err)
	}
	switch {
	case s.Interval < 0:
		return errors.New("integrity interval must be positive")
	case s.Timeout < 0:
		return errors.New("integrity timeout must be positive")
	case s.Scheme != "http" && s.Scheme != "https":
		return fmt.Errorf("integrity scheme must be http or https, got %q", s.Scheme)
	case s.IdentityPath[0] != '/':
		return fmt.Errorf("integrity identity_path must start with '/', got %q", s.IdentityPath)
	}
	sd := s.Spec
	if sd == nil {
		if !s.Pins.Any() {
			return errors.New("integrity: set at least one pin or spec_decode")
		}
		return nil
	}
	switch {
	case sd.Mode != "observe" && sd.Mode != "enforce":
		return fmt.Errorf("integrity spec_decode mode must be observe or enforce, got %q", sd.Mode)
	case sd.Window < 0:
		return errors.New("integrity spec_decode window must be positive")
	case sd.Windows < 0:
		return errors.New("integrity spec_decode windows must be positive")
	case sd.Position != nil && (*sd.Position < 0 || *sd.Position >= MaxPositions):
		return fmt.Errorf("integrity spec_decode position must be in [0,%d), got %d", MaxPositions, *sd.Position)
	case sd.MetricsPath[0] != '/':
		return fmt.Errorf("integrity spec_decode metrics_path must start with '/', got %q", sd.MetricsPath)
	}
	if sd.Mode == "enforce" {
		if sd.StateFile == "" {
			return errors.New("integrity spec_decode enforce needs state_file")
		}
		if len(sd.Key) < MinKeyBytes {
			return fmt.Errorf("integrity spec_decode enforce needs a commitment_key of at least %d bytes", MinKeyBytes)
		}
	}
	return nil
}

// Enforce reports whether the settings commit collapses to a state file.
func (s *Settings) Enforce() bool { return s.Spec != nil && s.Spec.Mode == "enforce" }
